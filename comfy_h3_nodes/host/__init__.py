from .adapter import *  # noqa: F401,F403 - temporary during the move
from .adapter import host, set_host, in_comfyui, register_routes, LocalHost  # noqa: F401
