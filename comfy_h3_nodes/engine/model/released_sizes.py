"""The released model's tensors without its files: sources for the memory plan's arithmetic at real size.

What ``bench memory``, the plan's tests and README's figures use to state the plan at the released size: the
published single-file layout in its mixed precision, a GGUF of it, and Comfy-Org's pruned fp8_scaled file, all built
from the shipped config on the meta device (names, shapes, dtypes and byte counts only).
"""
from __future__ import annotations

import json
import pathlib
import re

from ..contract.configs import PARTITIONS
from . import formats
from .memory_plan import skeleton


#: the grid of the real pruned files' ``adaln_t_table`` is read from each file; the arithmetic assumes 1024 rows
#: (32 bytes each: it does not matter)
REAL_PRUNED_GRID = 1024


def real_pruned_fp8(tensors: dict[str, formats.TensorInfo], grid: int = REAL_PRUNED_GRID, k: int = 8) -> dict:
    """The published layout's tensors as Comfy-Org's pruned fp8_scaled file holds them (arithmetic only): no
    ``time_embedder``, fp32 ``adaln_t_table`` [grid, k] and k-wide fp32 AdaLN projections, fp8 attention/MLP/text
    projections with a per-tensor scale and their comfy_quant JSON."""
    out = {}
    for name, t in tensors.items():
        if name.startswith("time_embedder."):
            continue
        if "adaln_proj.linear." in name:
            shape = (t.shape[0], k) if name.endswith(".weight") else t.shape
            out[name] = formats.TensorInfo(name, shape, "F32", 4 * formats._numel(shape))
            continue
        layer = name[: -len(".weight")]
        if name.endswith(".weight") and re.match(r"^(token_refiner\.)?blocks\.\d+\.(attn\.(qkv_proj|out_proj)|mlp\.fc[12])$"
                                                 r"|^condition_proj$", layer):
            out[name] = formats.TensorInfo(name, t.shape, "F8_E4M3", formats._numel(t.shape))
            out[f"{layer}.weight_scale"] = formats.TensorInfo(f"{layer}.weight_scale", (), "F32", 4)
            out[f"{layer}.comfy_quant"] = formats.TensorInfo(f"{layer}.comfy_quant", (27,), "U8", 27)
            continue
        out[name] = t
    out[formats.PRUNED_MARKER] = formats.TensorInfo(formats.PRUNED_MARKER, (grid, k), "F32", 4 * grid * k)
    return out


def real_sources(kind: str = "single_file", qtype: str = "Q8_0") -> dict[str, formats.TransformerSource]:
    """Sources with the released model's tensors (from the shipped config; no file): the published single-file
    layout in its mixed precision, a GGUF of it under :func:`formats.gguf_type_for`, or (``pruned-fp8``) Comfy-Org's
    pruned fp8_scaled file. For arithmetic only."""
    out = {}
    for part in PARTITIONS:
        cfg = json.loads((formats.SHIPPED_CONFIG_ROOT / part / "config.json").read_text())
        model = skeleton(cfg)
        tensors = {}
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith(".attn.to_q.weight"):
                pub = formats.diffusers_to_published_name(name[: -len(".attn.to_q.weight")]) + formats.QKV
                shape = (3 * shape[0], *shape[1:])
            elif name.endswith((".attn.to_k.weight", ".attn.to_v.weight")):
                continue
            else:
                pub = formats.diffusers_to_published_name(name)
            numel = 1
            for s in shape:
                numel *= s
            if kind == "gguf":
                t = formats.gguf_type_for(pub, shape, qtype)
                tensors[pub] = formats.TensorInfo(pub, shape, t, formats.gguf_nbytes(t, numel))
            else:
                fp32 = pub.startswith(formats.PUBLISHED_FP32_PREFIXES)
                tensors[pub] = formats.TensorInfo(pub, shape, "F32" if fp32 else "BF16", (4 if fp32 else 2) * numel)
        if kind == "pruned-fp8":
            tensors = real_pruned_fp8(tensors)
        out[part] = formats.TransformerSource("gguf" if kind == "gguf" else "single_file",
                                              pathlib.Path(f"<released {part}>"), tensors,
                                              formats.SHIPPED_CONFIG_ROOT, part, variant="fp8_scaled" if
                                              kind == "pruned-fp8" else "", pruned=kind == "pruned-fp8")
    return out
