"""Quantised layers of Comfy-Org's files (ComfyUI's "mixed precision" convention), read and run through comfy-kitchen.

A quantised Linear ``<p>`` of such a file stores ``<p>.weight`` in a low-precision type beside its scales and, in the
current convention, a ``<p>.comfy_quant`` U8 tensor holding its JSON (``{"format": ...}``); the legacy "scaled fp8"
files carry a ``scaled_fp8`` marker and ``<p>.scale_weight`` instead, and some files list the layers in the header's
``_quantization_metadata``. Everything else (norms, biases, buffers, the fp32 islands) is stored plainly.

=======================  =================================================  ==================================
format (``comfy_quant``)  stored                                             comfy-kitchen layout
=======================  =================================================  ==================================
``float8_e4m3fn``/e5m2    ``weight`` F8 [N,K], ``weight_scale`` F32 scalar    ``TensorCoreFP8Layout``
``int8_tensorwise``       ``weight`` I8 [N,K], ``weight_scale`` F32 [N,1]     ``TensorWiseINT8Layout`` (``convrot``,
                          (``"convrot": true`` = "int8_convrot")              ``convrot_groupsize`` from the JSON)
``nvfp4``                 ``weight`` U8 [N,K/2], ``weight_scale`` F8 blocks,  ``TensorCoreNVFP4Layout``; AWQ's
                          ``weight_scale_2`` F32, ``pre_quant_scale`` [K]      ``pre_quant_scale`` folded into columns
``asym_w4a8_int8``        ``weight`` I8 [N,K/2] (4-bit) or [N,3K/4] (6-bit:   ``AsymW4A8Int8Layout``
                          "w6a8"), ``weight_s_rel``, ``weight_s_channel``
=======================  =================================================  ==================================

The dequantisation is comfy-kitchen's own (ComfyUI's kernel library; its eager backend is pure PyTorch and runs on
CPU), never code of ours: :func:`stored_tensor` builds kitchen's ``QuantizedTensor`` from the stored parts, which
either stays the weight of a ``torch.nn.Linear`` (B keeps a file's layers as stored, as ComfyUI runs them: kitchen
dequantises them per call) or is dequantised once at load (:func:`dequantize`; A, and B at ``precision bf16``).
comfy-kitchen 0.2.31 (ComfyUI's pin) decodes 4-bit ``asym_w4a8_int8`` rows only; 6-bit rows need 0.2.40 or newer.
"""

from __future__ import annotations

import json

import torch
from comfy_kitchen.tensor import (AsymW4A8Int8Layout, QuantizedTensor, TensorCoreFP8Layout, TensorCoreNVFP4Layout,
                                  TensorWiseINT8Layout)

from .comfy_keys import SIDE, QuantError

#: comfy_quant formats and the kitchen layout each is held in
LAYOUTS = {"float8_e4m3fn": "TensorCoreFP8Layout", "float8_e5m2": "TensorCoreFP8Layout",
           "int8_tensorwise": "TensorWiseINT8Layout", "nvfp4": "TensorCoreNVFP4Layout",
           "asym_w4a8_int8": "AsymW4A8Int8Layout"}
STORAGE = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "int8_tensorwise": torch.int8,
           "nvfp4": torch.uint8, "asym_w4a8_int8": torch.int8}


# ---------------------------------------------------------------------------------------------------- layers
def read_layer(get, names: set[str], prefix: str) -> dict[str, torch.Tensor]:
    """The stored parts of one quantised layer, ``get(name) -> tensor``; legacy names become the current ones."""
    parts = {}
    for s in ("weight", *SIDE):
        if f"{prefix}.{s}" in names:
            parts[s] = get(f"{prefix}.{s}")
    if "scale_weight" in parts:
        parts["weight_scale"] = parts.pop("scale_weight")
    parts.pop("scale_input", None)
    return parts


def layer_config(parts: dict, fmt: str) -> dict:
    """The layer's comfy_quant JSON (the stored one, else what its format implies); ``params`` flattened in."""
    conf = {"format": fmt}
    if "comfy_quant" in parts:
        conf = json.loads(bytes(parts["comfy_quant"].to(torch.uint8).tolist()).decode("utf-8"))
    params = conf.get("params") if isinstance(conf.get("params"), dict) else {}
    return {**params, **{k: v for k, v in conf.items() if k != "params"}}


def stored_tensor(parts: dict, fmt: str, shape: tuple[int, ...], dtype: torch.dtype) -> QuantizedTensor:
    """kitchen's ``QuantizedTensor`` of one layer: logical ``shape`` [N, K], dequantising to ``dtype``."""
    conf = layer_config(parts, fmt)
    fmt = conf.get("format", fmt)
    if fmt not in LAYOUTS:
        raise QuantError(f"a layer is quantised as {fmt!r}, which comfy-kitchen cannot dequantise.")
    w = parts["weight"]
    shape = tuple(int(s) for s in shape)
    if fmt.startswith("float8"):
        params = TensorCoreFP8Layout.Params(scale=parts["weight_scale"].float(), orig_dtype=dtype, orig_shape=shape)
    elif fmt == "int8_tensorwise":
        params = TensorWiseINT8Layout.Params(scale=parts["weight_scale"].float(), orig_dtype=dtype, orig_shape=shape,
                                             convrot=bool(conf.get("convrot", False)),
                                             convrot_groupsize=int(conf.get("convrot_groupsize", 256)))
    elif fmt == "nvfp4":
        params = TensorCoreNVFP4Layout.Params(scale=parts["weight_scale_2"].float(), orig_dtype=dtype,
                                              orig_shape=shape,
                                              block_scale=parts["weight_scale"].view(torch.float8_e4m3fn))
    else:
        s_rel = parts["weight_s_rel"]
        params = AsymW4A8Int8Layout.Params(
            scale=s_rel.view(torch.float8_e4m3fn) if s_rel.dtype == torch.uint8 else s_rel, orig_dtype=dtype,
            orig_shape=shape, s_channel=parts.get("weight_s_channel"), codebook=parts.get("weight_codebook"),
            group_size=int(conf.get("group_size", 16)), convrot_groupsize=int(conf.get("convrot_groupsize", 256)))
    return QuantizedTensor(w.view(STORAGE[fmt]) if w.dtype != STORAGE[fmt] else w, LAYOUTS[fmt], params)


def dequantize(parts: dict, fmt: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The layer's weight as a plain ``dtype`` tensor (kitchen's dequantisation at fp32, then cast); an AWQ
    ``pre_quant_scale`` (ComfyUI multiplies the input by it) is folded into the columns."""
    w = stored_tensor(parts, fmt, shape, torch.float32).dequantize().float()
    w = w[: shape[0], : shape[1]] if w.shape != torch.Size(shape) else w
    if "pre_quant_scale" in parts:
        w = w * parts["pre_quant_scale"].float()[None, :]
    return w.to(dtype).contiguous()


def split_rows(parts: dict, fmt: str, sizes: list[int]) -> list[dict]:
    """A quantised layer's stored parts cut into row blocks of ``sizes`` (a stacked q/k/v, a SwiGLU's halves): the
    weight and every per-row scale are cut with the rows, per-tensor scales are shared. Not for nvfp4 (its swizzled
    block scales do not cut by rows)."""
    if fmt == "nvfp4":
        raise QuantError("an nvfp4 layer cannot be cut by rows; dequantise it first.")
    n = parts["weight"].shape[0]
    out = [dict() for _ in sizes]
    for key, t in parts.items():
        if key != "comfy_quant" and t.dim() >= 1 and t.shape[0] == n and n > 1:
            for d, piece in zip(out, torch.split(t, sizes, dim=0)):
                d[key] = piece.contiguous()
        else:
            for d in out:
                d[key] = t
    return out


def cat_rows(blocks: list[dict]) -> dict:
    """The inverse of :func:`split_rows`: row blocks stacked back into one layer (per-tensor scales must agree)."""
    first = blocks[0]
    n = first["weight"].shape[0]
    out = {}
    for key, t in first.items():
        if key != "comfy_quant" and t.dim() >= 1 and t.shape[0] == n and n > 1:
            out[key] = torch.cat([b[key] for b in blocks], dim=0)
        else:
            out[key] = t
    return out


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes a tensor really holds: a kitchen ``QuantizedTensor`` reports its logical (dequantised) dtype, so its
    stored data and scales are counted instead."""
    if isinstance(t, QuantizedTensor):
        p = t._params
        extra = sum(v.numel() * v.element_size() for v in vars(p).values() if isinstance(v, torch.Tensor))
        return t._qdata.numel() * t._qdata.element_size() + extra
    return t.numel() * t.element_size()


# ---------------------------------------------------------------------------------------------------- writing
def json_tensor(conf: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def quantize_layer(weight: torch.Tensor, fmt: str, **conf) -> dict[str, torch.Tensor]:
    """The stored parts of ``weight`` (fp32 [N,K]) quantised as ``fmt`` by comfy-kitchen, with its comfy_quant JSON:
    what the tiny fixtures and the cross-check against ComfyUI write. ``conf``: ``convrot``/``convrot_groupsize`` for
    int8, ``group_size``/``bits`` for w4a8."""
    w = weight.detach().float().contiguous()
    if fmt.startswith("float8"):
        q, p = TensorCoreFP8Layout.quantize(w, dtype=STORAGE[fmt])
        return {"weight": q, "weight_scale": p.scale.float().reshape(()), "comfy_quant": json_tensor({"format": fmt})}
    if fmt == "int8_tensorwise":
        convrot = bool(conf.get("convrot", True))
        g = int(conf.get("convrot_groupsize", 256))
        q, p = TensorWiseINT8Layout.quantize(w, is_weight=True, per_channel=True, convrot=convrot,
                                             convrot_groupsize=g)
        js = {"format": fmt, **({"convrot": True, "convrot_groupsize": g} if convrot else {})}
        return {"weight": q, "weight_scale": p.scale.float(), "comfy_quant": json_tensor(js)}
    if fmt == "nvfp4":
        q, p = TensorCoreNVFP4Layout.quantize(w)
        return {"weight": q.view(torch.uint8), "weight_scale": p.block_scale.view(torch.float8_e4m3fn),
                "weight_scale_2": p.scale.float().reshape(()), "comfy_quant": json_tensor({"format": fmt})}
    if fmt == "asym_w4a8_int8":
        g, cr = int(conf.get("group_size", 16)), int(conf.get("convrot_groupsize", 256))
        q, p = AsymW4A8Int8Layout.quantize(w, bits=int(conf.get("bits", 4)), group_size=g, convrot_groupsize=cr)
        out = {"weight": q, "weight_s_rel": p.scale, "weight_s_channel": p.s_channel.float(),
               "comfy_quant": json_tensor({"format": fmt, "group_size": g, "convrot_groupsize": cr})}
        if p.codebook is not None:
            out["weight_codebook"] = p.codebook.float()
        return out
    raise QuantError(f"quantize_layer: unknown format {fmt!r}.")
