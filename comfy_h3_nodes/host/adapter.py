"""The one adapter between the pack and its host. Nothing else in the pack imports ComfyUI.

Inside ComfyUI it uses ComfyUI's ProgressBar, interrupt flag, PromptServer events and folder_paths. Outside (the
headless runner, tests) it falls back to a tqdm progress bar, an interrupt flag set by Ctrl-C, an in-memory event
list (with optional listeners) and a local output folder. :func:`host` returns the active implementation.
"""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Any, Callable


class ProgressReporter:
    def update(self, value: int, total: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalProgress(ProgressReporter):
    def __init__(self, total: int, desc: str):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, leave=False, disable=os.environ.get("H3_QUIET") == "1")

    def update(self, value: int, total: int) -> None:
        if self.bar.total != total:
            self.bar.total = total
        self.bar.n = value
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class LocalHost:
    """Host used without ComfyUI."""

    name = "local"

    def __init__(self):
        self.events: list[tuple[str, dict]] = []
        self.listeners: list[Callable[[str, dict], None]] = []
        self.interrupt_flag = threading.Event()
        self.current_prompt: str | None = None
        self._output = pathlib.Path(os.environ.get("H3_OUTPUT_DIR", "output")).resolve()

    def progress(self, node_id: str | None, total: int, desc: str = "H3") -> ProgressReporter:
        return LocalProgress(total, desc)

    def interrupted(self) -> bool:
        return self.interrupt_flag.is_set()

    def prompt_id(self) -> str | None:
        return self.current_prompt

    def send_event(self, event: str, data: dict) -> None:
        self.events.append((event, data))
        for listener in list(self.listeners):
            listener(event, data)

    def progress_text(self, text: str, node_id: str | None) -> None:
        self.send_event("h3.text", {"node": node_id, "text": text})

    def output_dir(self) -> pathlib.Path:
        self._output.mkdir(parents=True, exist_ok=True)
        return self._output

    def set_output_dir(self, path: str | os.PathLike) -> None:
        self._output = pathlib.Path(path).resolve()

    def model_folders(self) -> list[str]:
        """A's model roots without ComfyUI: ``H3_MODEL_DIRS`` (colon-separated), else none."""
        return [d for d in os.environ.get("H3_MODEL_DIRS", "").split(os.pathsep) if d.strip()]


class ComfyProgress(ProgressReporter):
    def __init__(self, total: int, node_id: str | None):
        import comfy.utils

        self.bar = comfy.utils.ProgressBar(total, node_id=node_id)

    def update(self, value: int, total: int) -> None:
        self.bar.update_absolute(value, total)


class ComfyHost:
    """Host used inside ComfyUI (imported only when ComfyUI's modules are present)."""

    name = "comfyui"

    def progress(self, node_id: str | None, total: int, desc: str = "H3") -> ProgressReporter:
        return ComfyProgress(total, node_id)

    def interrupted(self) -> bool:
        import comfy.model_management

        return bool(comfy.model_management.processing_interrupted())

    def prompt_id(self) -> str | None:
        from server import PromptServer

        return getattr(PromptServer.instance, "last_prompt_id", None)

    def send_event(self, event: str, data: dict) -> None:
        from server import PromptServer

        PromptServer.instance.send_sync(event, data, PromptServer.instance.client_id)

    def progress_text(self, text: str, node_id: str | None) -> None:
        from server import PromptServer

        if node_id is not None:
            PromptServer.instance.send_progress_text(text, node_id)

    def output_dir(self) -> pathlib.Path:
        import folder_paths

        return pathlib.Path(folder_paths.get_output_directory())

    def model_folders(self) -> list[str]:
        """ComfyUI's ``diffusers`` model folders: ``models/diffusers`` plus that key in ``extra_model_paths.yaml``."""
        import folder_paths

        try:
            return list(folder_paths.get_folder_paths("diffusers"))
        except KeyError:  # a ComfyUI without that folder kind
            return []


_HOST: Any = None


def in_comfyui() -> bool:
    try:
        import comfy.model_management  # noqa: F401
        import folder_paths  # noqa: F401
        from server import PromptServer

        return PromptServer.instance is not None
    except Exception:  # noqa: BLE001 - any failure means: not inside a running ComfyUI
        return False


def host():
    global _HOST
    if _HOST is None:
        _HOST = ComfyHost() if in_comfyui() else LocalHost()
    return _HOST


def set_host(h) -> None:
    """Install a host (tests and the runner use a fresh LocalHost)."""
    global _HOST
    _HOST = h


def register_routes() -> bool:
    """Add ``GET /h3/status`` and ``GET /h3/timings`` to ComfyUI's server; a no-op outside ComfyUI."""
    if not in_comfyui():
        return False
    from server import PromptServer

    from .routes import status_handler, timings_handler

    routes = PromptServer.instance.routes
    routes.get("/h3/status")(status_handler)
    routes.get("/h3/timings")(timings_handler)
    return True
