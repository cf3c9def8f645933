"""Comfy-Org's transformer variants on diffusers' ``MiniMaxH3Transformer3DModel``: pruned AdaLN and quantised layers.

**Pruned** files (``minimax_h3_*_pruned_*``) hold ``adaln_t_table`` [G, k] (fp32) in place of ``time_embedder``: the
time-embedding curve ``silu(time_embedder(t))`` sampled on a uniform grid of t in [0, 1] in a k-dimensional basis, that
basis folded into every AdaLN projection (``blocks.N.adaln_proj.linear`` and ``final_layer.adaln_proj.linear`` become
fp32 ``k -> 18·H`` / ``k -> 2·H`` projections, applied without a SiLU). ComfyUI's H3 model
(``comfy/ldm/minimax/model.py``) interpolates the table linearly at each distinct timestep, runs the projections in
fp32 and casts each modulation row to the stream's dtype. The same here, on diffusers' model, by four replacements:
``time_proj`` -> identity (raw t), ``time_embedder`` -> :class:`CurveTimeEmbedding` (the table and its
interpolation; the name keeps it in the class's fp32 modules), each block's ``adaln_proj`` -> :class:`CurveModulation`
and ``norm_out`` -> :class:`CurveNormOut`. Their projections are :class:`CurveLinear` (not ``torch.nn.Linear``), so
diffusers' fp8 layerwise casting and peft leave them alone; a LoRA that adapts the full-width AdaLN is refused.

**Quantised** layers (fp8_scaled, int8/convrot, w4a8) stay as stored: each Linear's weight becomes comfy-kitchen's
``QuantizedTensor``, which dequantises per call as ComfyUI runs these files (``precision auto``); or they are
dequantised once to the load dtype (``precision bf16``). :func:`load` reads the file tensor by tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from accelerate import init_empty_weights
from diffusers import MiniMaxH3Transformer3DModel
from safetensors import safe_open
from torch import nn

from . import comfy_keys, formats, quant

PRUNED_KEY = formats.PRUNED_MARKER  # "adaln_t_table"
TABLE = "time_embedder.adaln_t_table"


class CurveLinear(nn.Module):
    """An fp32 projection of the curve coordinates (``F.linear`` on fp32 inputs, whatever the model's dtype)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.zeros(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight.float(), self.bias.float())


class CurveTimeEmbedding(nn.Module):
    """``time_embedder`` of a pruned file: the coordinates of the time-embedding curve at each timestep, interpolated
    linearly between the two grid rows around ``t`` (clamped to [0, 1]; t = 1 uses the last interval)."""

    def __init__(self, grid: int, k: int):
        super().__init__()
        self.adaln_t_table = nn.Parameter(torch.zeros(grid, k), requires_grad=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        table = self.adaln_t_table.float()
        pos = t.float().clamp(0.0, 1.0) * (table.shape[0] - 1)
        i0 = pos.floor().long().clamp(max=table.shape[0] - 2)
        return torch.lerp(table[i0], table[i0 + 1], (pos - i0).unsqueeze(1))


class CurveModulation(nn.Module):
    """A block's ``adaln_proj`` of a pruned file: six modulations per (timestep, modality) row, from the curve
    coordinates without a SiLU, in fp32, each cast to the block stream's dtype."""

    def __init__(self, k: int, hidden_size: int, stream_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.hidden_size, self.stream_dtype = hidden_size, stream_dtype
        self.linear = CurveLinear(k, 6 * hidden_size * 3)

    def forward(self, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.linear(temb).view(-1, 6 * self.hidden_size)
        return tuple(c.to(self.stream_dtype) for c in out.chunk(6, dim=-1))


class CurveNormOut(nn.Module):
    """``norm_out`` of a pruned file: RMSNorm, then shift and scale from the curve coordinates (fp32, no SiLU)."""

    def __init__(self, hidden_size: int, k: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self.linear = CurveLinear(k, 2 * hidden_size)

    def forward(self, hidden_states, temb, timestep_indices):
        shift, scale = self.linear(temb).chunk(2, dim=-1)
        hidden_states = self.norm(hidden_states)
        return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(0,
                                                                                                    timestep_indices)


def prune(model, grid: int, k: int, stream_dtype: torch.dtype = torch.float32):
    """Swap the four modules of a pruned file into ``model`` (built with ``time_embed_dim = k``)."""
    hidden = model.config.hidden_size
    model.time_proj = nn.Identity()
    model.time_embedder = CurveTimeEmbedding(grid, k)
    for block in model.transformer_blocks:
        block.adaln_proj = CurveModulation(k, hidden, stream_dtype)
    model.norm_out = CurveNormOut(hidden, k, model.config.final_norm_eps)
    model._h3_pruned = True
    return model


def is_curve_param(name: str) -> bool:
    """Parameters a pruned model keeps in fp32 besides the class's fp32 modules (its curve projections)."""
    return name.endswith((".adaln_proj.linear.weight", ".adaln_proj.linear.bias")) or name.startswith("norm_out.linear.")


def grid_of(source: formats.TransformerSource) -> tuple[int, int]:
    g, k = source.tensors[PRUNED_KEY].shape
    return int(g), int(k)


def model_config(source: formats.TransformerSource) -> dict:
    """The source's config, with ``time_embed_dim`` = the table's width for a pruned file."""
    config = {n: v for n, v in source.config().items() if not n.startswith("_")}
    if source.pruned:
        config["time_embed_dim"] = grid_of(source)[1]
    return config


def skeleton(source: formats.TransformerSource, stream_dtype: torch.dtype = torch.float32):
    """The source's model on the meta device (names, shapes, module types), pruned like the file when it is."""
    with init_empty_weights():
        model = MiniMaxH3Transformer3DModel.from_config(model_config(source))
        if source.pruned:
            prune(model, *grid_of(source), stream_dtype)
    return model


# ---------------------------------------------------------------------------------------------------- conversion
def comfy_to_diffusers(names) -> dict[str, tuple[str, str, int]]:
    """``{diffusers name: (file layer or tensor, how, part)}`` for a Comfy-Org transformer file's tensor names (side
    keys of quantised layers excluded): ``how`` is ``plain``, ``rows`` (part ``i`` of 3 of a stacked ``qkv_proj``)
    or ``swap`` (``mlp.fc1`` = [gate; up] stored as diffusers' [up; gate])."""
    out = {}
    for name in names:
        if comfy_keys.is_side_key(name) or name in formats.DROPPED:
            continue
        if name == PRUNED_KEY:
            out[TABLE] = (name, "plain", 0)
        elif name.endswith(formats.QKV):
            base = formats.published_to_diffusers_name(name[: -len(formats.QKV)])
            for i, part in enumerate(("to_q", "to_k", "to_v")):
                out[f"{base}.attn.{part}.weight"] = (name, "rows", i)
        elif name.endswith(".mlp.fc1.weight"):
            out[formats.published_to_diffusers_name(name)] = (name, "swap", 0)
        else:
            out[formats.published_to_diffusers_name(name)] = (name, "plain", 0)
    return out


def cut_rows(value, how: str, part: int, fmt: str | None):
    """One stored tensor (plain) or quantised layer's parts (``fmt``) cut or reordered as ``how`` says."""
    if how == "plain":
        return value
    if fmt is None:
        if how == "rows":
            return value.chunk(3, dim=0)[part].contiguous()
        gate, up = value.chunk(2, dim=0)
        return torch.cat([up, gate], dim=0)
    n = value["weight"].shape[0]
    if how == "rows":
        return quant.split_rows(value, fmt, [n // 3] * 3)[part]
    gate, up = quant.split_rows(value, fmt, [n // 2] * 2)
    return quant.cat_rows([up, gate])


def load(source: formats.TransformerSource, dtype: torch.dtype, device: str = "cpu", stored: bool = True):
    """The transformer of a Comfy-Org file (pruned and/or quantised) on ``device``: plain tensors at ``dtype`` (the
    class's fp32 modules and a pruned file's curve projections in fp32), quantised layers as comfy-kitchen
    ``QuantizedTensor`` weights (``stored``) or dequantised to ``dtype``. The file's tensors must be exactly the
    model's (``formats.check_covers`` checked them before, from the header)."""
    model = skeleton(source, dtype)
    cls = type(model)
    layers = comfy_keys.quantized_layers(source.tensors, source.metadata)
    comfy_keys.check_supported(layers, source.tensors, str(source.path))
    plan = comfy_to_diffusers(source.tensors)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(plan))
    if missing:
        raise formats.FormatError(f"{source.path} lacks {len(missing)} tensors of the transformer (such as "
                                  f"`{missing[0]}`): it is another variant of the model; give a complete file.")
    names = set(source.tensors)
    with safe_open(str(source.path), framework="pt", device="cpu") as fh:
        for name, (stored_name, how, part) in plan.items():
            if name not in params:
                raise formats.FormatError(f"{source.path} holds `{stored_name}`, which the transformer has no place "
                                          "for: it is another variant of the model; give the matching config.")
            keep32 = _keeps_fp32(cls, name, source.pruned)
            layer = stored_name[: -len(".weight")] if stored_name.endswith(".weight") else None
            fmt = layers.get(layer) if layer is not None else None
            target = params[name]
            if fmt is None:
                value = cut_rows(fh.get_tensor(stored_name), how, part, None)
                value = value.to(torch.float32 if keep32 else dtype)
            else:
                parts = cut_rows(quant.read_layer(fh.get_tensor, names, layer), how, part, fmt)
                if stored and not keep32:
                    value = quant.stored_tensor({k: v.to(device) for k, v in parts.items()}, fmt,
                                                tuple(target.shape), dtype)
                else:
                    value = quant.dequantize(parts, fmt, tuple(target.shape), torch.float32 if keep32 else dtype)
            if tuple(value.shape) != tuple(target.shape):
                raise formats.FormatError(f"{source.path}: `{stored_name}` is {tuple(value.shape)}, the transformer "
                                          f"wants {tuple(target.shape)}: give the config that matches the file.")
            _set_param(model, name, value.to(device))
    _fresh_rope(model, device)
    return model.eval()


def _keeps_fp32(cls, name: str, pruned: bool) -> bool:
    keep = getattr(cls, "_keep_in_fp32_modules", None) or []
    return any(m in name.split(".") for m in keep) or (pruned and is_curve_param(name))


def _set_param(model, name: str, value: torch.Tensor) -> None:
    owner, leaf = name.rsplit(".", 1)
    module = model.get_submodule(owner)
    module._parameters[leaf] = nn.Parameter(value, requires_grad=False)


def _fresh_rope(model, device: str) -> None:
    """``rope.inv_freq`` as diffusers builds it from the config (fp32; the file's copy is dropped, like diffusers'
    own single-file converter does)."""
    rope = getattr(model, "rope", None)
    if rope is not None and hasattr(rope, "inv_freq"):
        fresh = type(rope)(model.config.rope_freq_dim, model.config.rope_theta)
        rope.inv_freq = fresh.inv_freq.to(device)
