"""comfy-h3 as a ComfyUI custom node pack: this folder, cloned into ComfyUI/custom_nodes/, is the pack.

Importing it is cheap and never needs Ray, diffusers or a GPU: those load when a node first runs.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # makes `comfy_h3_nodes` and `remote_worker` importable as top-level packages
    sys.path.insert(0, _HERE)

from comfy_h3_nodes.cluster.ray_cluster import install_exit_hooks  # noqa: E402
from comfy_h3_nodes.host import register_routes  # noqa: E402
from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, plain_errors  # noqa: E402
from comfy_h3_nodes.nodes.core_model import H3RemoteModel  # noqa: E402

# ComfyUI's own samplers drive this one: it exists only inside ComfyUI, not in the headless runner's node set
NODE_CLASS_MAPPINGS = {**NODE_CLASS_MAPPINGS, "H3RemoteModel": plain_errors(H3RemoteModel)}
NODE_DISPLAY_NAME_MAPPINGS = {**NODE_DISPLAY_NAME_MAPPINGS, "H3RemoteModel": "H3 Remote Model (DiT on B)"}

register_routes()
# ComfyUI imports packs on its main thread, the only one that may set a signal handler; the embedded Ray cluster
# starts later on its worker thread. SIGTERM then stops that cluster before doing what it did before.
install_exit_hooks()

WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
