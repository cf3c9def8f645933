"""The host inside ComfyUI: its ProgressBar, interrupt flag, PromptServer events and folder_paths. The only module
of the pack that imports ComfyUI (``comfy``, ``server``, ``folder_paths``); imported only when ComfyUI runs."""

from __future__ import annotations

import pathlib

import comfy.model_management
import comfy.utils
import folder_paths
from server import PromptServer

from .local import ProgressReporter


class ComfyProgress(ProgressReporter):
    def __init__(self, total: int, node_id: str | None):
        self.bar = comfy.utils.ProgressBar(total, node_id=node_id)

    def update(self, value: int, total: int, preview=None) -> None:
        self.bar.update_absolute(value, total, preview)


class ComfyHost:
    """Host used inside ComfyUI."""

    name = "comfyui"

    def progress(self, node_id: str | None, total: int, desc: str = "H3") -> ProgressReporter:
        return ComfyProgress(total, node_id)

    def interrupted(self) -> bool:
        return bool(comfy.model_management.processing_interrupted())

    def interrupt_exception(self) -> BaseException:
        """ComfyUI's own interrupt: the run ends as "interrupted", not as an error."""
        return comfy.model_management.InterruptProcessingException()

    def prompt_id(self) -> str | None:
        return getattr(PromptServer.instance, "last_prompt_id", None)

    def send_event(self, event: str, data: dict) -> None:
        PromptServer.instance.send_sync(event, data, PromptServer.instance.client_id)

    def progress_text(self, text: str, node_id: str | None) -> None:
        if node_id is not None:
            PromptServer.instance.send_progress_text(text, node_id)

    def output_dir(self) -> pathlib.Path:
        return pathlib.Path(folder_paths.get_output_directory())

    def model_folders(self, kind: str = "diffusers") -> list[str]:
        """ComfyUI's model folders of ``kind`` (``diffusers``, ``text_encoders``, ``vae``, ...): ``models/<kind>``
        plus that key in ``extra_model_paths.yaml``."""
        try:
            return list(folder_paths.get_folder_paths(kind))
        except KeyError:  # a ComfyUI without that folder kind
            return []

    def tokenizer_folders(self) -> list[str]:
        """The Qwen2 BPE vocabulary ComfyUI ships for its own Qwen text encoders (its H3 text encoder reads it)."""
        comfy_dir = pathlib.Path(comfy.model_management.__file__).resolve().parent  # comfy/ is a namespace package
        return [str(comfy_dir / "text_encoders" / "qwen25_tokenizer")]

    def add_routes(self, handlers: dict) -> None:
        for path, handler in handlers.items():
            PromptServer.instance.routes.get(path)(handler)
