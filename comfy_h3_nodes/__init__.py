"""comfy-h3's Python package. ComfyUI's entry point is the repository root's ``__init__.py``; this package holds
the parts (README, "Layout"): ``nodes`` and ``host`` (what ComfyUI imports), ``engine`` (knows nothing of ComfyUI),
``cluster`` (Ray nodes) and ``tools`` (what people run from a shell)."""

import pathlib

#: the repository root (the pack's folder): pyproject.toml, example_workflows/, web/
PACK_ROOT = pathlib.Path(__file__).resolve().parents[1]
