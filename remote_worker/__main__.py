"""``python -m remote_worker setup|preflight|status|stop|install-service`` (machine B)."""

import sys

from remote_worker.cli import main

if __name__ == "__main__":
    sys.exit(main())
