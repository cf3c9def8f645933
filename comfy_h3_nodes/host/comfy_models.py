"""The pack's A-side models as ComfyUI's model management sees them: loaded models of its own kind.

ComfyUI frees memory only through ``comfy.model_management``: ``unload_all_models()`` (``POST /free`` with
``unload_models``, the *Unload models* and *Free model and node cache* buttons, read by the prompt loop after a
prompt) and ``free_memory(needed, device)`` (run by ``load_models_gpu`` before it loads one of its own models). Both
walk ``current_loaded_models`` and call ``detach()`` on the patcher of each model they unload. So each resident
component of an A side (text encoder, video VAE, audio VAE) gets a :class:`H3PartPatcher` (a ``ModelPatcher`` whose
weights live in the A side) and is registered by ``load_models_gpu`` before each use, as ComfyUI's own nodes load
their models before they run: ComfyUI then counts its bytes, keeps it in its least-recently-used order, and its
``detach`` is where the component is released (:meth:`~..engine.a_side.side.ASide.release`). The next use goes
through ``load_models_gpu`` again, whose ``partially_load`` reloads it (:meth:`~..engine.a_side.side.ASide.ensure`).

Imported only inside ComfyUI (it imports ``comfy``).
"""

from __future__ import annotations

import threading

import comfy.model_management as mm
import comfy.model_patcher
import torch

#: the cause the A side's reload records name
CAUSE = "ComfyUI freed memory"


class H3ResidentModel(torch.nn.Module):
    """What a patcher's ``model`` is for ComfyUI (its log names the class): a token, no weights; the A side holds
    them."""

    def __init__(self, component: str):
        super().__init__()
        self.h3_component = component


class H3TextEncoderModel(H3ResidentModel):
    pass


class H3VideoVAEModel(H3ResidentModel):
    pass


class H3AudioVAEModel(H3ResidentModel):
    pass


TOKENS = {"text_encoder": H3TextEncoderModel, "vae": H3VideoVAEModel, "audio_vae": H3AudioVAEModel}


def comfy_device(device: str) -> torch.device:
    """The torch device of an A side as ComfyUI names its devices (``cuda`` -> ``cuda:<current>``)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


class H3PartPatcher(comfy.model_patcher.ModelPatcher):
    """One component of an A side in ComfyUI's accounting: its size is the side's own count of the component's
    bytes; a full ``detach`` (an unload) releases it in the side, ``partially_load`` (a load) reloads it. It cannot be
    partly offloaded: ComfyUI then unloads it whole."""

    def __init__(self, side, component: str):
        self.side, self.component = side, component
        dev = comfy_device(side.device)
        self._bytes = int(side.resident_bytes().get(component, 0))
        super().__init__(TOKENS[component](component), load_device=dev, offload_device=torch.device("cpu"),
                         size=max(self._bytes, 1))

    # what ComfyUI reads
    def model_size(self):
        return max(self._bytes, 1)

    def loaded_size(self):
        return 0 if self.component in self.side.released else self._bytes

    def current_loaded_device(self):
        return self.load_device

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        if self.component not in self.side.released:
            return 0
        self.side.ensure((self.component,), held_elsewhere=comfy_held_bytes())
        self._bytes = int(self.side.resident_bytes().get(self.component, self._bytes))
        return self._bytes

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        return 0  # all or nothing: ComfyUI's model_unload then detaches it whole

    def detach(self, unpatch_all=True):
        # ComfyUI detaches with unpatch_all=False when it re-registers a model it already tracks (load_models_gpu's
        # clone pass) or drops a patcher: only a real unload (unpatch_all=True) releases the weights
        if unpatch_all:
            self.side.release((self.component,), cause=CAUSE)
        return self.model


_lock = threading.Lock()
_patchers: dict[tuple[int, str], H3PartPatcher] = {}


def patchers(side, components) -> list[H3PartPatcher]:
    """The patchers of ``side``'s ``components`` (made once per side and component, kept alive here: ComfyUI holds
    them only weakly)."""
    with _lock:
        out = []
        for c in components:
            key = (id(side), c)
            p = _patchers.get(key)
            if p is None or p.side is not side:
                p = _patchers[key] = H3PartPatcher(side, c)
            out.append(p)
        return out


def hold(side, components) -> list:
    """Before ``side`` runs: its ``components`` are registered (and, when ComfyUI had unloaded them, reloaded)
    through ``load_models_gpu``, as ComfyUI's own nodes load their models. Returns the reload records."""
    before = len(side.load_records)
    mm.load_models_gpu(patchers(side, components))  # reloads through H3PartPatcher.partially_load, one by one
    return list(side.load_records[before:])


def comfy_held_bytes(device: str | None = None) -> dict:
    """What ComfyUI's own loaded models hold now (every loaded model that is not one of the pack's), on ``device``
    (default: any): the figure A's memory plan counts besides free memory."""
    total = 0
    want = comfy_device(device) if device else None
    for lm in list(mm.current_loaded_models):
        model = lm.model
        if model is None or isinstance(model, H3PartPatcher):
            continue
        if want is not None and lm.device != want:
            continue
        try:
            total += int(lm.model_loaded_memory()) if lm.device.type != "cpu" else int(lm.model_memory())
        except Exception:  # noqa: BLE001 - a model ComfyUI is dropping: not counted
            continue
    return {"ComfyUI's loaded models": total}
