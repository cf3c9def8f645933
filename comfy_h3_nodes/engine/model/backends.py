"""Attention backend choice, made per side before its model is built.

diffusers' attention dispatch does the work (SDPA by default, flash-attn when present). This module only checks a
choice up front, with the real import error when a backend cannot load, and refuses the ``*_hub`` backends, which
download kernels and cannot work offline. No silent fallback: a backend that was asked for and cannot run is an error.

A GPU backend is checked by running it: a wheel built for sm80/sm90 imports on a Spark's sm_121 and fails at its
first kernel, so :func:`resolve_attention_backend` makes one tiny attention call on the device (before any weights
load) and refuses in one sentence naming the wheel and the GPU. ``flash3`` (FlashAttention 3) is Hopper-only: offered
on capability 9.0 alone.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata

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
#: capability a backend is built for, when only one (FlashAttention 3: Hopper)
ONLY_ON = {"flash3": (9, 0)}


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
        gpu = gpu_label()
        need = ONLY_ON.get(key)
        if need is not None and tuple(torch.cuda.get_device_capability()) != need:
            raise AttentionBackendError(
                f"attention backend {name!r} ({wheel_of(module)}) runs on sm_{need[0]}{need[1]} GPUs only and this is "
                f"{gpu}: choose 'flash' or 'sdpa'.")
        error = probe(backend)
        if error:
            raise AttentionBackendError(
                f"attention backend {name!r} imports ({wheel_of(module)}) but its kernel fails on {gpu}: {error}; "
                f"install a build of it for this GPU, or choose 'sdpa'.")
    return backend


def gpu_label(index: int = 0) -> str:
    import torch  # noqa: PLC0415 - GPU backends only

    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})"


def wheel_of(module: str | None) -> str:
    """The installed distribution that provides ``module``, with its version (the wheel a refusal names)."""
    if module is None:
        return "torch"
    top = module.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"module {module}"


@functools.lru_cache(maxsize=None)
def probe(backend: str, device: str = "cuda") -> str:
    """One tiny attention call through diffusers' dispatch with ``backend`` on ``device``, waited for: an empty
    string when it ran, else its error in one line (cached: once per process and backend)."""
    import torch  # noqa: PLC0415 - GPU backends only
    from diffusers.models.attention_dispatch import dispatch_attention_fn  # noqa: PLC0415

    try:
        q = torch.randn(1, 128, 2, 64, dtype=torch.bfloat16).to(device)  # [batch, seq, heads, head_dim]
        out = dispatch_attention_fn(q, q, q, backend=backend)
        torch.cuda.synchronize()
        if tuple(out.shape) != tuple(q.shape):
            return f"it returned shape {tuple(out.shape)} for {tuple(q.shape)}"
        return ""
    except Exception as exc:  # noqa: BLE001 - the refusal carries the real message
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def apply_attention_backend(model, backend: str) -> None:
    """Set a resolved backend on a diffusers model (a no-op for the default SDPA path)."""
    if backend != "native" and hasattr(model, "set_attention_backend"):
        model.set_attention_backend(backend)
