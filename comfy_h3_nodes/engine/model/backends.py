"""Attention backend choice, made per side before its model is built.

diffusers' attention dispatch does the work (SDPA by default, flash-attn when present). This module only checks a
choice up front, with the real import error when a backend cannot load, and refuses the ``*_hub`` backends, which
download kernels and cannot work offline. No silent fallback: a backend that was asked for and cannot run is an error.
"""

from __future__ import annotations

import importlib

#: name shown in the UI -> (diffusers backend name, module it needs or None, needs CUDA)
BACKENDS = {
    "sdpa": ("native", None, False),
    "native": ("native", None, False),
    "flash": ("flash", "flash_attn", True),
    "flash_varlen": ("flash_varlen", "flash_attn", True),
    "flash3": ("_flash_3", "flash_attn_interface", True),
    "sage": ("sage", "sageattention", True),
    "flex": ("flex", None, False),
}
UI_CHOICES = ("sdpa", "flash", "flash_varlen", "flash3", "sage", "flex")


class AttentionBackendError(RuntimeError):
    pass


def resolve_attention_backend(name: str) -> str:
    """The diffusers backend name for ``name``, after proving it can run here; raise with the real cause if not."""
    key = (name or "sdpa").lower()
    if key.endswith("_hub"):
        raise AttentionBackendError(
            f"attention backend {name!r} downloads its kernels from a hub at run time, which this deployment never "
            "does; use 'sdpa' or install flash-attn and choose 'flash'."
        )
    if key not in BACKENDS:
        raise AttentionBackendError(f"attention backend {name!r} is unknown; choose one of {UI_CHOICES}.")
    backend, module, needs_cuda = BACKENDS[key]
    if module is not None:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the real message is the point
            raise AttentionBackendError(
                f"attention backend {name!r} needs the Python package {module!r}, whose import failed: "
                f"{type(exc).__name__}: {exc}. Install it for this torch/CUDA build, or choose 'sdpa'."
            ) from exc
    if needs_cuda:
        import torch  # noqa: PLC0415 - only for a GPU backend; the choices load with ComfyUI's node list

        if not torch.cuda.is_available():
            raise AttentionBackendError(
                f"attention backend {name!r} runs on CUDA GPUs only and torch sees none here; choose 'sdpa'."
            )
    return backend


def apply_attention_backend(model, backend: str) -> None:
    """Set a resolved backend on a diffusers model (a no-op for the default SDPA path)."""
    if backend != "native" and hasattr(model, "set_attention_backend"):
        model.set_attention_backend(backend)
