from .all import *  # noqa: F401,F403 - temporary during the move
from .all import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: F401
