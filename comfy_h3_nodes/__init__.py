"""comfy-h3's Python package. ComfyUI's entry point is the repository root's ``__init__.py``; this package holds
the parts (README, "Layout"): ``nodes`` and ``host`` (what ComfyUI imports), ``engine`` (knows nothing of ComfyUI),
``cluster`` (Ray nodes), ``tools`` (what people run from a shell) and ``placement`` (which actors run where)."""
