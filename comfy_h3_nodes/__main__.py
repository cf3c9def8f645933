"""``python -m comfy_h3_nodes VERB``: see :mod:`comfy_h3_nodes.tools.cli`."""

import sys

from comfy_h3_nodes.tools.cli import main

sys.exit(main())
