"""The host inside ComfyUI: its ProgressBar, interrupt flag, PromptServer events and folder_paths. The only module
of the pack that imports ComfyUI (``comfy``, ``server``, ``folder_paths``); imported only when ComfyUI runs."""

from __future__ import annotations

import functools
import io
import pathlib
import threading

import comfy.latent_formats
import comfy.model_management
import comfy.sd
import comfy.utils
import folder_paths
import latent_preview
import numpy as np
import torch
from comfy.cli_args import args
from PIL import Image
from server import PromptServer

from . import comfy_models
from .local import ProgressReporter, builtin_error


#: the pack's node types whose prompts reach B (a prompt holding one waits for B when it runs)
B_NODES = ("H3RemoteDiT", "H3RemoteModel")


class ComfyProgress(ProgressReporter):
    def __init__(self, total: int, node_id: str | None):
        self.bar = comfy.utils.ProgressBar(total, node_id=node_id)

    def update(self, value: int, total: int, preview=None) -> None:
        """``preview``: B's :class:`~..engine.contract.wire.Preview`, shown the way a sampler's preview is."""
        image = None if preview is None else ("JPEG", Image.open(io.BytesIO(preview.jpeg)), args.preview_size)
        self.bar.update_absolute(value, total, image)


@functools.lru_cache(maxsize=2)
def _preview_vae(path: str):
    """ComfyUI's own loader for the tiny preview decoder (``comfy.sd.VAE`` recognises taeh3 by its keys), once."""
    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(path))
    vae.first_stage_model.show_progress_bar = False
    return latent_preview.TAEHVPreviewerImpl(vae)


def _decode_preview(path: str, max_side: int, latent) -> tuple[bytes, int, int]:
    """One latent frame ``[C, h, w]`` through ComfyUI's taeh3 previewer (the one its samplers use), as a JPEG."""
    x0 = torch.from_numpy(np.asarray(latent, dtype=np.float32))[None, :, None]  # [1, C, 1, h, w]
    with _PREVIEW_LOCK:  # one decode at a time: requests in flight share the resident decoder
        image = _preview_vae(path).decode_latent_to_preview(x0)
    image.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=85)
    return buf.getvalue(), image.width, image.height


_PREVIEW_LOCK = threading.Lock()


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

    def user_error(self, exc: BaseException) -> BaseException:
        """The pack's errors as a built-in type (``ValueError`` for a bad value, ``TimeoutError``, else
        ``RuntimeError``) with the same sentence: ComfyUI prefixes a message with the exception's module path
        unless it is a built-in. ComfyUI's own exceptions (its interrupt) pass unchanged."""
        return builtin_error(exc)

    def prompt_id(self) -> str | None:
        return getattr(PromptServer.instance, "last_prompt_id", None)

    def queued_for_b(self) -> list[dict]:
        """ComfyUI's queue (running first, then pending in the order it runs them), the prompts that reach B: a
        node of theirs is one of ``B_NODES``. Each: number, prompt id, client id, running or pending, its B nodes."""
        running, pending = PromptServer.instance.prompt_queue.get_current_queue_volatile()
        out = []
        for state, items in (("running", running), ("pending", sorted(pending, key=lambda i: i[0]))):
            for item in items:
                nodes = [nid for nid, n in (item[2] or {}).items() if n.get("class_type") in B_NODES]
                if nodes:
                    out.append({"number": item[0], "prompt_id": item[1], "state": state, "b_nodes": nodes,
                                "client_id": (item[3] or {}).get("client_id")})
        return out

    def executing_node(self) -> str | None:
        """The node ComfyUI executes now (a core sampler driving the pack's remote MODEL)."""
        node = getattr(PromptServer.instance, "last_node_id", None)
        return None if node is None else str(node)

    def running_prompt(self) -> dict | None:
        """The API prompt ComfyUI executes now (its queue's running item of the current prompt id), or None."""
        server = PromptServer.instance
        pid = getattr(server, "last_prompt_id", None)
        try:
            for item in list(server.prompt_queue.currently_running.values()):
                if item[1] == pid:
                    return item[2]
        except Exception:  # noqa: BLE001 - a queue of another shape: the readout goes without it
            return None
        return None

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

    def preview_method(self) -> str:
        """ComfyUI's preview method for this prompt (``--preview-method``, or the frontend's setting, which ComfyUI
        applies per prompt): ``none``, ``auto``, ``latent2rgb`` or ``taesd``."""
        method = args.preview_method
        return getattr(method, "value", str(method))

    def preview_size(self) -> int:
        return int(args.preview_size)

    def preview_factors(self) -> tuple[list, list, str] | None:
        """ComfyUI's latent-to-RGB factors for H3's video latents: ``(factors [24 x 3], bias [3], source)``, or None
        when this ComfyUI has no H3 latent format."""
        fmt = getattr(comfy.latent_formats, "MiniMaxH3Video", None)
        if fmt is None or getattr(fmt, "latent_rgb_factors", None) is None:
            return None
        return fmt.latent_rgb_factors, fmt.latent_rgb_factors_bias or [0.0, 0.0, 0.0], \
            "ComfyUI latent_formats.MiniMaxH3Video"

    def preview_decoder(self):
        """ComfyUI's tiny preview decoder for H3 latents (``taeh3*`` in its ``vae_approx`` folder, the file ComfyUI's
        own ``taesd`` previews load) as ``(decode, source)``, ``decode(latent [C, h, w]) -> (jpeg, width, height)``;
        None when this ComfyUI has no such file."""
        name = getattr(getattr(comfy.latent_formats, "MiniMaxH3Video", None), "taesd_decoder_name", None)
        if not name:
            return None
        try:
            found = sorted(f for f in folder_paths.get_filename_list("vae_approx") if f.startswith(name))
        except KeyError:  # a ComfyUI without that folder kind
            return None
        if not found:
            return None
        path = folder_paths.get_full_path("vae_approx", found[0])
        return functools.partial(_decode_preview, path, self.preview_size()), f"ComfyUI's {found[0]} (vae_approx)"

    def tokenizer_folders(self) -> list[str]:
        """The Qwen2 BPE vocabulary ComfyUI ships for its own Qwen text encoders (its H3 text encoder reads it)."""
        comfy_dir = pathlib.Path(comfy.model_management.__file__).resolve().parent  # comfy/ is a namespace package
        return [str(comfy_dir / "text_encoders" / "qwen25_tokenizer")]

    def hold_a_side(self, side, components) -> list:
        """Before the A side runs: ``components`` registered with ComfyUI's model management as loaded models (and
        reloaded when ComfyUI had unloaded them), so ``/free``, its buttons and its own eviction release them
        (:mod:`.comfy_models`). Returns the reload records."""
        return comfy_models.hold(side, components)

    def hold_a_rank(self, rank, held_bytes: int, device: str) -> None:
        """A's DiT rank (parallel denoise) among ComfyUI's loaded models: ``/free`` and ComfyUI's eviction release its
        weights (the rank reloads them when the next group forms)."""
        comfy_models.hold_rank(rank, held_bytes, device)

    def held_elsewhere(self, device: str | None = None) -> dict:
        """What ComfyUI's own loaded models hold (A's memory plan counts it besides free memory)."""
        return comfy_models.comfy_held_bytes(device)

    def add_routes(self, handlers: dict, method: str = "get") -> None:
        for path, handler in handlers.items():
            getattr(PromptServer.instance.routes, method)(path)(handler)
