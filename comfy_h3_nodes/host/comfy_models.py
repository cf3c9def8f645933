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

import logging
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
        if unpatch_all:  # no garbage collection here: ComfyUI runs one after its unload (see ASide.release)
            self.side.release((self.component,), cause=CAUSE, collect=False)
        return self.model


class H3DiTRankModel(H3ResidentModel):
    pass


class H3RankPatcher(comfy.model_patcher.ModelPatcher):
    """A's DiT rank (parallel denoise: its own process on A's machine, the same memory on a Spark) in ComfyUI's
    accounting: an unload asks the rank to release its weights (bounded; the actor stays), and the rank reloads them
    itself when the next DiT group forms."""

    def __init__(self, rank, held_bytes: int, device: str, timeout_s: float):
        self.rank, self.timeout_s, self._bytes, self.released = rank, timeout_s, int(held_bytes), False
        super().__init__(H3DiTRankModel("dit_rank_a"), load_device=comfy_device(device),
                         offload_device=torch.device("cpu"), size=max(self._bytes, 1))

    def model_size(self):
        return max(self._bytes, 1)

    def loaded_size(self):
        return 0 if self.released else self._bytes

    def current_loaded_device(self):
        return self.load_device

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        was, self.released = self.released, False  # the rank reloads at its next join (reload_if_released)
        return self._bytes if was else 0

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        return 0

    def detach(self, unpatch_all=True):
        if unpatch_all and not self.released:
            import ray  # noqa: PLC0415 - a rank exists only once the pack joined Ray

            try:
                ray.get(self.rank.handle.release.remote(CAUSE), timeout=self.timeout_s)
                self.released = True
            except Exception as exc:  # noqa: BLE001 - ComfyUI's unload goes on; said in its log
                logging.warning("comfy-h3: A's DiT rank %s did not release its model within %.0f s: %s",
                                self.rank.name, self.timeout_s, exc)
        return self.model


_rank_patchers: dict[int, H3RankPatcher] = {}


def hold_rank(rank, held_bytes: int, device: str, timeout_s: float = 60.0) -> None:
    """A's DiT rank registered with ComfyUI's model management (after a parallel denoise), as the A side's models."""
    with _lock:
        p = _rank_patchers.get(id(rank.handle))
        if p is None:
            p = _rank_patchers[id(rank.handle)] = H3RankPatcher(rank, held_bytes, device, timeout_s)
        # never replace a patcher ComfyUI may still list (it holds them weakly: a dropped one leaves a dead entry
        # its unload loop trips over); the same handle's patcher follows the rank object instead
        p.rank = rank
        p._bytes = int(held_bytes) or p._bytes
    mm.load_models_gpu([p])


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
            if p is None:  # the patcher holds its side, so an id is never reused for another side while it lives
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
        if model is None or isinstance(model, (H3PartPatcher, H3RankPatcher)):
            continue
        if want is not None and lm.device != want:
            continue
        try:
            total += int(lm.model_loaded_memory()) if lm.device.type != "cpu" else int(lm.model_memory())
        except Exception:  # noqa: BLE001 - a model ComfyUI is dropping: not counted
            continue
    return {"ComfyUI's loaded models": total}
