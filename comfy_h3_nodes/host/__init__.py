"""The one adapter between the pack and its host: nothing else in the pack imports ComfyUI.

:func:`host` returns the active implementation: :class:`~.comfy.ComfyHost` inside a running ComfyUI (its progress
bar, interrupt flag, PromptServer events and routes, model and output folders), else :class:`~.local.LocalHost`
(tqdm, a Ctrl-C flag, an in-memory event list, ``output/``). Both offer the same methods.
"""

from __future__ import annotations

from typing import Any

from .local import LocalHost, LocalProgress, ProgressReporter

_HOST: Any = None


def in_comfyui() -> bool:
    try:
        from server import PromptServer  # noqa: PLC0415 - only inside a running ComfyUI

        return PromptServer.instance is not None
    except Exception:  # noqa: BLE001 - any failure means: not inside a running ComfyUI
        return False


def host():
    global _HOST
    if _HOST is None:
        if in_comfyui():
            from .comfy import ComfyHost  # noqa: PLC0415 - imports ComfyUI, which only exists inside it

            _HOST = ComfyHost()
        else:
            _HOST = LocalHost()
    return _HOST


def set_host(h) -> None:
    """Install a host (tests and the runner use a fresh LocalHost)."""
    global _HOST
    _HOST = h


def register_routes() -> bool:
    """Add ``GET /h3/status``, ``GET /h3/timings`` and ``POST /h3/release_b`` to ComfyUI's server; a no-op outside
    ComfyUI."""
    if not in_comfyui():
        return False
    from .routes import POST_ROUTES, ROUTES  # noqa: PLC0415 - aiohttp handlers, needed only inside ComfyUI

    host().add_routes(ROUTES)
    host().add_routes(POST_ROUTES, method="post")
    return True


__all__ = ["LocalHost", "LocalProgress", "ProgressReporter", "host", "in_comfyui", "register_routes", "set_host"]
