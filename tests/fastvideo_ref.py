"""FastVideo's own VSA-H3 code (PyPI ``fastvideo`` 0.2.1), for cross-checks of the pack's VSA (test-only).

FastVideo's tiling, pooling, mask and metadata functions are plain PyTorch, but ``import fastvideo`` runs the package's
``__init__``, which pulls torchvision, diffusers' LoRA loaders and FastVideo's distributed setup; the PyPI torchvision
for torch 2.13 is a CUDA build that fails to import on a CPU-only torch, and the wheel pins torch 2.12. So the wheel is
installed without its dependencies into a folder of its own, off ``sys.path`` (``make test`` does it::

    pip install --no-deps --target .venv/fastvideo-ref fastvideo==0.2.1

), and its two VSA modules are loaded from there under bare package modules that skip the ``__init__`` files, with a
one-attribute stand-in for ``fastvideo.distributed`` (they ask it for the sequence-parallel world size only). Nothing
else of FastVideo runs. The kernels they would call (``fastvideo_kernel``) are absent, so their symbols are ``None``.

Where the wheel is: ``$H3_FASTVIDEO_DIR``, else ``<sys.prefix>/fastvideo-ref``, else an installed ``fastvideo``. Tests
skip, saying so, only when none has it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import sys
import types

VERSION = "0.2.1"
INSTALL = f"pip install --no-deps --target {sys.prefix}/fastvideo-ref fastvideo=={VERSION}"
_PACKAGES = ("fastvideo", "fastvideo.attention", "fastvideo.attention.backends")
_LOADED: dict = {}


def root() -> pathlib.Path | None:
    """The folder holding FastVideo's ``fastvideo/`` sources, or None."""
    for candidate in (os.environ.get("H3_FASTVIDEO_DIR"), pathlib.Path(sys.prefix) / "fastvideo-ref"):
        if candidate and (pathlib.Path(candidate) / "fastvideo" / "attention" / "backends").is_dir():
            return pathlib.Path(candidate)
    try:
        spec = importlib.util.find_spec("fastvideo")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return pathlib.Path(list(spec.submodule_search_locations)[0]).parent
    return None


def load():
    """``(video_sparse_attn, video_sparse_attn_h3)``, FastVideo's modules, loaded once per process; None if absent.
    ``sys.modules`` is left as it was (the modules keep their own references)."""
    if "modules" in _LOADED:
        return _LOADED["modules"]
    base = root()
    if base is None:
        return None
    saved = {k: v for k, v in sys.modules.items() if k == "fastvideo" or k.startswith("fastvideo.")}
    try:
        for name in _PACKAGES:
            mod = types.ModuleType(name)
            mod.__path__ = [str(base.joinpath(*name.split(".")))]
            sys.modules[name] = mod
        dist = types.ModuleType("fastvideo.distributed")
        dist.get_sp_group = lambda: types.SimpleNamespace(world_size=1)
        sys.modules["fastvideo.distributed"] = dist
        vsa = importlib.import_module("fastvideo.attention.backends.video_sparse_attn")
        h3 = importlib.import_module("fastvideo.attention.backends.video_sparse_attn_h3")
    finally:
        for k in [k for k in sys.modules if k == "fastvideo" or k.startswith("fastvideo.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    version = next(base.glob("fastvideo-*.dist-info"), None)
    _LOADED["modules"] = (vsa, h3)
    _LOADED["version"] = version.name.split("-")[1].removesuffix(".dist") if version else "?"
    return _LOADED["modules"]


def version() -> str:
    return _LOADED.get("version", "?")
