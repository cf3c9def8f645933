"""Comfy-Org's single files for MiniMax-H3, told apart by their headers alone (names, stored dtypes, shapes; no tensor
data, no torch): which H3 part a file is, and which of ComfyUI's quantised layouts its layers use.

=====================  ============================================================  =========================
file (ComfyUI folder)  recognised by (the same rules as ComfyUI's own detection)     loaded as
=====================  ============================================================  =========================
``diffusion_models/``  ``token_refiner.blocks.0.attn.qkv_proj.weight`` (``formats``)  ``transformer`` (B)
``text_encoders/``     ``visual.deepstack_merger_list.0.norm.weight`` and             ``text_encoder`` (A)
                       ``model.layers.49.self_attn.q_proj.weight`` (Qwen3-VL as H3
                       uses it: 50 layers, no final norm, no lm_head)
``vae/`` (video)       ``decoder.transformer_blocks.0.scale1`` and                    ``vae`` (A)
                       ``encoder.down.0.block.0.conv1.weight``
``vae/`` (audio)       ``pre_block.attn.zero_k_bias``                                 ``audio_vae`` (A)
=====================  ============================================================  =========================

A quantised Linear ``<p>`` stores ``<p>.weight`` in a low-precision type beside its scales and, in the current
convention, a ``<p>.comfy_quant`` U8 tensor holding its JSON (``{"format": ...}``); legacy "scaled fp8" files carry a
``scaled_fp8`` marker and ``<p>.scale_weight``; some list the layers in the header's ``_quantization_metadata``.
:mod:`.quant` reads and dequantises them through comfy-kitchen.
"""

from __future__ import annotations

import importlib.metadata
import json

from ..contract.errors import ModelFolderError

#: the stored parts of a quantised layer besides its ``weight`` (legacy names renamed on read)
SIDE = ("comfy_quant", "weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale", "weight_s_rel",
        "weight_s_channel", "weight_codebook", "weight_correction", "scale_weight", "scale_input")
LEGACY_MARKER = "scaled_fp8"
METADATA_KEY = "_quantization_metadata"
#: comfy_quant formats comfy-kitchen dequantises, and the name of the Comfy-Org variant each is
VARIANTS = {"float8_e4m3fn": "fp8_scaled", "float8_e5m2": "fp8_scaled_e5m2", "int8_tensorwise": "int8",
            "nvfp4": "nvfp4", "asym_w4a8_int8": "w4a8"}
_DTYPE_FORMAT = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}

TE_MARKERS = ("visual.deepstack_merger_list.0.norm.weight", "model.layers.49.self_attn.q_proj.weight")
VAE_MARKERS = ("decoder.transformer_blocks.0.scale1", "encoder.down.0.block.0.conv1.weight")
AUDIO_VAE_MARKERS = ("pre_block.attn.zero_k_bias",)
PART_MARKERS = {"text_encoder": TE_MARKERS, "vae": VAE_MARKERS, "audio_vae": AUDIO_VAE_MARKERS}
#: where ComfyUI keeps each part (its ``folder_paths`` kinds)
PART_FOLDERS = {"text_encoder": "text_encoders", "vae": "vae", "audio_vae": "vae"}
PART_NAMES = {"text_encoder": "Qwen3-VL text encoder", "vae": "video VAE", "audio_vae": "audio VAE"}


class QuantError(ModelFolderError):
    """A quantised layer this installation cannot read; the message names it and the fix."""


def kitchen_version() -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in importlib.metadata.version("comfy-kitchen").split(".")[:3])
    except Exception:  # noqa: BLE001 - not installed or an unversioned build: the load says so itself
        return (0,)


def is_side_key(name: str) -> bool:
    """A stored part of a quantised layer other than its weight, or the legacy marker (never a model tensor)."""
    return name == LEGACY_MARKER or name.rsplit(".", 1)[-1] in SIDE


def quantized_layers(tensors: dict, metadata: dict | None = None) -> dict[str, str]:
    """``{layer prefix: comfy_quant format}`` from a header alone: the side keys say a layer is quantised, the
    weight's stored type which format (``int8_tensorwise`` layers' JSON adds ``convrot``; it is read at load)."""
    listed = {}
    raw = (metadata or {}).get(METADATA_KEY)
    if raw:
        try:
            listed = {k: v.get("format", "") for k, v in json.loads(raw).get("layers", {}).items()}
        except (ValueError, AttributeError):
            listed = {}
    out = {}
    for name, info in tensors.items():
        if not name.endswith(".weight"):
            continue
        p = name[: -len(".weight")]
        marked = any(f"{p}.{s}" in tensors for s in ("comfy_quant", "weight_scale", "scale_weight", "weight_s_rel"))
        if not marked and p not in listed:
            continue
        if listed.get(p):
            out[p] = listed[p]
        elif info.dtype in _DTYPE_FORMAT:
            out[p] = _DTYPE_FORMAT[info.dtype]
        elif f"{p}.weight_s_rel" in tensors:
            out[p] = "asym_w4a8_int8"
        elif info.dtype == "I8":
            out[p] = "int8_tensorwise"
        elif info.dtype == "U8" and f"{p}.weight_scale_2" in tensors:
            out[p] = "nvfp4"
        else:
            out[p] = f"unknown ({info.dtype} weight)"
    return out


def w4a8_bits(tensors: dict, prefix: str, group_size: int = 16) -> int:
    """4 or 6: the bit depth of an ``asym_w4a8_int8`` layer, implied by its packed row width."""
    k = tensors[f"{prefix}.weight_s_rel"].shape[1] * group_size
    return 6 if tensors[f"{prefix}.weight"].shape[1] * 8 == 6 * k else 4


def variant_of(tensors: dict, metadata: dict | None = None) -> str:
    """The Comfy-Org variant from a header: ``""`` (not quantised), ``fp8_scaled``, ``int8`` (``int8_convrot`` when
    its layers' JSON says so), ``nvfp4`` / ``nvfp4_awq`` (AWQ scales), ``w4a8`` or ``w6a8``; ``+``-joined if mixed."""
    layers = quantized_layers(tensors, metadata)
    names = []
    for k in sorted(set(layers.values())):
        name = VARIANTS.get(k, k)
        if k == "nvfp4" and any(n.endswith(".pre_quant_scale") for n in tensors):
            name = "nvfp4_awq"
        if k == "asym_w4a8_int8":
            p = next(p for p, f in layers.items() if f == k)
            name = f"w{w4a8_bits(tensors, p)}a8"
        names.append(name)
    return "+".join(names)


def stored_bytes(tensors: dict, prefix: str, split: int = 1) -> int:
    """Bytes a quantised layer holds as stored: its weight and scales (its JSON and activation-only scales are not
    kept); with ``split``, those of one of ``split`` row blocks (per-row parts are cut, per-tensor scales copied)."""
    keep = ("weight", "weight_scale", "weight_scale_2", "pre_quant_scale", "weight_s_rel", "weight_s_channel",
            "weight_codebook", "scale_weight")
    rows = tensors[f"{prefix}.weight"].shape[0]
    total = 0
    for s in keep:
        t = tensors.get(f"{prefix}.{s}")
        if t is not None:
            total += t.nbytes // split if (t.shape and t.shape[0] == rows and rows > 1) else t.nbytes
    return total


def check_supported(layers: dict[str, str], tensors: dict, where: str) -> None:
    """One sentence for a layer format this installation cannot read, before anything loads."""
    bad = sorted({f for f in layers.values() if f not in VARIANTS})
    if bad:
        raise QuantError(f"{where} holds layers quantised as {', '.join(bad)}, which comfy-kitchen cannot dequantise: "
                         "use a bf16, fp8_scaled, int8_convrot, nvfp4 or w4a8 file of the same model.")
    six = [p for p, f in layers.items() if f == "asym_w4a8_int8" and w4a8_bits(tensors, p) == 6]
    if six and kitchen_version() < (0, 2, 40):
        raise QuantError(f"{where} is a w6a8 file (6-bit rows such as `{six[0]}`), which comfy-kitchen "
                         f"{'.'.join(map(str, kitchen_version()))} cannot decode: install comfy-kitchen>=0.2.40 "
                         "(`pip install -U comfy-kitchen`), or use the fp8_scaled or int8_convrot file.")


def part_of(names) -> str | None:
    """Which A part (``text_encoder``, ``vae``, ``audio_vae``) a header's names are, else ``None``."""
    keys = set(names)
    for part, markers in PART_MARKERS.items():
        if all(m in keys for m in markers):
            return part
    return None
