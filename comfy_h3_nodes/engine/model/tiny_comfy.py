"""Tiny fixtures of Comfy-Org's file layouts, made from the tiny random checkpoint's own models (:mod:`.tiny`).

Written under ``<checkpoint>/comfy/`` as ComfyUI's model folders hold them::

    diffusion_models/minimax_h3_{t2va,ref2va}_pruned_bf16.safetensors        pruned AdaLN, bf16 (fp32 islands)
    diffusion_models/minimax_h3_{t2va,ref2va}_pruned_fp8_scaled.safetensors  + fp8 weights with per-tensor scales
    diffusion_models/minimax_h3_{t2va,ref2va}_pruned_int8_convrot.safetensors  + int8 rows, ConvRot
    diffusion_models/minimax_h3_{t2va,ref2va}_int8_convrot.safetensors       unpruned, int8 ConvRot
    diffusion_models/{transformer,transformer_ref}/config.json               the tiny configs, beside the files
    text_encoders/qwen3vl_h3_{bf16,int8_convrot,nvfp4_awq}.safetensors      50 layers, no final norm, no lm_head
    vae/minimax_h3_video_vae_{fp16,int8_convrot}.safetensors                 ComfyUI's names, q/k/v interleaved
    vae/minimax_h3_audio_vae_fp32.safetensors                                weight norm folded

**Pruning** (what a pruned file is, done to the tiny transformer): the curve ``c(t) = silu(time_embedder(t))`` sampled
on a uniform grid of ``GRID`` timesteps in [0, 1], centred at its mean ``mu`` and expressed in its first ``K`` principal
directions ``B`` (the table: the grid's coordinates), every AdaLN projection folded onto it: ``W' = W B``,
``b' = b + W mu``. With ``K`` below the embedding's width and a finite grid it is an approximation, as the real
pruned files are. Quantisation is comfy-kitchen's (:func:`.quant.quantize_layer`), of the layers ComfyUI's files
quantise (attention, MLP and text projections; never norms, biases, the fp32 islands or the curve).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
from safetensors.torch import save_file
from transformers import Qwen3VLForConditionalGeneration

from . import formats, quant

GRID, K = 33, 8
DIT_QUANT = re.compile(r"^(token_refiner\.)?blocks\.\d+\.(attn\.(qkv_proj|out_proj)|mlp\.(fc1|fc2))$|^condition_proj$")
TE_QUANT = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$")
VAE_QUANT = re.compile(r"^decoder\.transformer_blocks\.\d+\.(attn\.(to_qkv|to_out)|ff\.(w1|w2))$")
DIT_FILES = {"pruned_bf16": (True, None), "pruned_fp8_scaled": (True, "float8_e4m3fn"),
             "pruned_int8_convrot": (True, "int8_tensorwise"), "int8_convrot": (False, "int8_tensorwise")}
TE_FILES = {"bf16": None, "int8_convrot": "int8_tensorwise", "nvfp4_awq": "nvfp4"}
WORKFLOW_NAME = {"transformer": "t2va", "transformer_ref": "ref2va"}


def convrot_group(k: int) -> int:
    """The largest power of 4 (at most 256, ComfyUI's default) that divides ``k``: ConvRot rotates groups of it."""
    g = 256
    while g > 1 and k % g:
        g //= 4
    return g


def _quantized(state: dict, pattern, fmt: str | None, awq: bool = False) -> dict:
    """``state`` with every ``<layer>.weight`` whose layer matches ``pattern`` replaced by its stored parts."""
    if fmt is None:
        return state
    out = {}
    for name, value in state.items():
        layer = name[: -len(".weight")] if name.endswith(".weight") else None
        if layer is None or not pattern.match(layer):
            out[name] = value
            continue
        w = value.float()
        conf = {"convrot": True, "convrot_groupsize": convrot_group(w.shape[1])} if fmt == "int8_tensorwise" else {}
        scale = None
        if awq:  # AWQ: the stored weight is W / s per input column; ComfyUI multiplies the input by s
            scale = (1.0 + 0.5 * torch.rand(w.shape[1], generator=torch.Generator().manual_seed(w.shape[1])))
            w = w / scale[None, :]
        for part, t in quant.quantize_layer(w, fmt, **conf).items():
            out[f"{layer}.{part}"] = t
        if scale is not None:
            out[f"{layer}.pre_quant_scale"] = scale.float()
    return out


# ---------------------------------------------------------------------------------------------------- transformer
@torch.no_grad()
def pruned_curve(model, grid: int = GRID, k: int = K):
    """``(table [grid, k], B [D, k], mu [D])``: the time-embedding curve of ``model`` in its first ``k`` principal
    directions, sampled on a uniform grid of t in [0, 1]."""
    t = torch.linspace(0.0, 1.0, grid)
    emb = model.time_embedder(model.time_proj(t).to(torch.float32))
    c = torch.nn.functional.silu(emb).double()
    mu = c.mean(0)
    _, _, vh = torch.linalg.svd(c - mu, full_matrices=False)
    basis = vh[:k].T  # [D, k]
    return ((c - mu) @ basis).float(), basis, mu


def comfy_transformer_state(model, published: dict, pruned: bool, fmt: str | None = None) -> dict:
    """The tiny transformer as one of Comfy-Org's files holds it, from its ``published`` layout
    (``tiny.published_state_dict``): the release's mixed precision, pruned AdaLN and/or quantised layers."""
    state = {k: v.float() for k, v in published.items()}
    # Comfy-Org's files keep the rotary frequencies (ComfyUI's model detection reads their count from it); diffusers
    # does not save its copy (a non-persistent buffer) and the pack's loaders drop it (formats.DROPPED)
    state["rope.inv_freq"] = model.rope.inv_freq.detach().float()
    fp32 = {"rope.inv_freq"}
    if pruned:
        table, basis, mu = pruned_curve(model)
        state = {k: v for k, v in state.items() if not k.startswith("time_embedder.")}
        state[formats.PRUNED_MARKER] = table
        for name in [n for n in state if n.endswith("adaln_proj.linear.weight")]:
            w, b = state[name].double(), state[name[: -len("weight")] + "bias"].double()
            state[name] = (w @ basis).float()
            state[name[: -len("weight")] + "bias"] = (b + w @ mu).float()
            fp32 |= {name, name[: -len("weight")] + "bias"}
        fp32.add(formats.PRUNED_MARKER)
    for name, v in state.items():
        keep = name in fp32 or name.startswith(formats.PUBLISHED_FP32_PREFIXES)
        state[name] = v.to(torch.float32 if keep else torch.bfloat16).contiguous()
    return _quantized(state, DIT_QUANT, fmt)


# ---------------------------------------------------------------------------------------------------- A's parts
def comfy_text_encoder_state(text_encoder, fmt: str | None = None, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Qwen3-VL as Comfy-Org's H3 text encoder file holds it: ComfyUI's names, the first 50 decoder layers, no final
    norm, no lm_head, bf16."""
    out = {}
    for name, v in text_encoder.state_dict().items():
        if name.startswith("model.language_model."):
            new = "model." + name[len("model.language_model."):]
            m = re.match(r"model\.layers\.(\d+)\.", new)
            if new == "model.norm.weight" or (m and int(m.group(1)) >= 50):
                continue
        elif name.startswith("model.visual."):
            new = name[len("model."):]
        else:
            continue  # lm_head
        out[new] = v.detach().to(dtype).contiguous()
    return _quantized(out, TE_QUANT, fmt, awq=fmt == "nvfp4")


def comfy_video_vae_state(vae, fmt: str | None = None, dtype: torch.dtype = torch.float16) -> dict:
    """The video VAE in ComfyUI's names (the inverse of :func:`.comfy_files.key_map`), fp16, with its latent
    statistics and ComfyUI's unused ``decoder.mask_token``."""
    heads = int(vae.config.decoder_num_attention_heads)
    state = {k: v.detach().float() for k, v in vae.state_dict().items()}
    out = {}
    for name, v in state.items():
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2.", name)
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", new)
        new = new.replace(".conv_shortcut.", ".nin_shortcut.").replace("decoder.proj_in.", "decoder.x_embedder.")
        new = new.replace(".attn.to_out.0.", ".attn.to_out.").replace(".ff.net.2.", ".ff.w2.")
        if ".attn.to_k." in new or ".attn.to_v." in new:
            continue
        if ".attn.to_q." in new:
            qkv = [state[name.replace("to_q", p)] for p in ("to_q", "to_k", "to_v")]
            dh = qkv[0].shape[0] // heads
            v = torch.stack([t.reshape(heads, dh, *t.shape[1:]) for t in qkv], 1).reshape(3 * heads * dh,
                                                                                          *qkv[0].shape[1:])
            new = new.replace("to_q", "to_qkv")
        if ".ff.net.0.proj." in new:
            val, gate = v.chunk(2, dim=0)
            v, new = torch.cat([gate, val], 0), new.replace(".ff.net.0.proj.", ".ff.w1.")
        out[new] = v
    dim = out["decoder.register_tokens"].shape[-1]
    out["decoder.mask_token"] = torch.zeros(1, 1, dim)
    out = {k: v.to(dtype).contiguous() for k, v in out.items()}
    out["latents_mean"] = torch.tensor(vae.config.latents_mean, dtype=torch.float32)
    out["latents_std"] = torch.tensor(vae.config.latents_std, dtype=torch.float32)
    return _quantized(out, VAE_QUANT, fmt)


def comfy_audio_vae_state(audio_vae) -> dict:
    """The audio VAE as ComfyUI's file holds it: weight norm folded into ``X.weight`` (``g * v / |v|``, as torch's
    weight-norm hook computes it), fp32."""
    state = {k: v.detach().float() for k, v in audio_vae.state_dict().items()}
    out = {}
    for name, v in state.items():
        if name.endswith(".weight_v"):
            g = state[name[: -len("_v")] + "_g"]
            out[name[: -len("_v")]] = torch._weight_norm(v, g, 0).contiguous()  # what the weight-norm hook computes
        elif not name.endswith(".weight_g"):
            out[name] = v.contiguous()
    out["latents_mean"] = torch.tensor(audio_vae.config.latents_mean, dtype=torch.float32)
    out["latents_std"] = torch.tensor(audio_vae.config.latents_std, dtype=torch.float32)
    return out


# ---------------------------------------------------------------------------------------------------- writing
def _save(state: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: state[k] for k in sorted(state)}, str(path), metadata={"format": "pt"})
    return path


def write_comfy_fixtures(out_dir, models: dict, published) -> dict[str, Path]:
    """Every layout above under ``out_dir/comfy/`` from ``models`` (transformer, transformer_ref, text_encoder, vae,
    audio_vae; ``published(model)`` gives a transformer's published layout); returns ``{label: path}``."""
    root = Path(out_dir) / "comfy"
    paths = {}
    for part in ("transformer", "transformer_ref"):
        models[part].save_config(str(root / "diffusion_models" / part))  # the tiny configs, beside the files
        for label, (pruned, fmt) in DIT_FILES.items():
            name = f"minimax_h3_{WORKFLOW_NAME[part]}_{label}.safetensors"
            state = comfy_transformer_state(models[part], published(models[part]), pruned, fmt)
            paths[f"{part}:{label}"] = _save(state,
                                             root / "diffusion_models" / name)
    for label, fmt in TE_FILES.items():
        paths[f"text_encoder:{label}"] = _save(comfy_text_encoder_state(models["text_encoder"], fmt),
                                               root / "text_encoders" / f"qwen3vl_h3_{label}.safetensors")
    for label, fmt in (("fp16", None), ("int8_convrot", "int8_tensorwise")):
        paths[f"vae:{label}"] = _save(comfy_video_vae_state(models["vae"], fmt),
                                      root / "vae" / f"minimax_h3_video_vae_{label}.safetensors")
    paths["audio_vae:fp32"] = _save(comfy_audio_vae_state(models["audio_vae"]),
                                    root / "vae" / "minimax_h3_audio_vae_fp32.safetensors")
    return paths


def fixture(ckpt, label: str) -> Path:
    """The path of one fixture (``"transformer:pruned_fp8_scaled"``, ``"vae:fp16"``, ...) in a built checkpoint."""
    part, kind = label.split(":")
    root = Path(ckpt) / "comfy"
    if part in WORKFLOW_NAME:
        return root / "diffusion_models" / f"minimax_h3_{WORKFLOW_NAME[part]}_{kind}.safetensors"
    if part == "text_encoder":
        return root / "text_encoders" / f"qwen3vl_h3_{kind}.safetensors"
    if part == "vae":
        return root / "vae" / f"minimax_h3_video_vae_{kind}.safetensors"
    return root / "vae" / f"minimax_h3_audio_vae_{kind}.safetensors"


def write_tiny_part(ckpt, component: str, path) -> Path:
    """One A part of a tiny checkpoint folder as its plain Comfy-Org single file at ``path``, with the configs the
    file loads with beside it (``<component>/config.json``; a text encoder's ``tokenizer/`` and ``processor/``)."""
    ckpt, path = Path(ckpt), Path(path)
    cls = {"text_encoder": Qwen3VLForConditionalGeneration, "vae": AutoencoderKLMiniMaxH3,
           "audio_vae": AutoencoderKLMiniMaxH3Audio}[component]
    model = cls.from_pretrained(str(ckpt / component)).eval()
    state = {"text_encoder": comfy_text_encoder_state, "vae": comfy_video_vae_state,
             "audio_vae": comfy_audio_vae_state}[component](model)
    beside = (component, "tokenizer", "processor") if component == "text_encoder" else (component,)
    for sub in beside:
        shutil.rmtree(path.parent / sub, ignore_errors=True)
        shutil.copytree(ckpt / sub, path.parent / sub, ignore=shutil.ignore_patterns("*.safetensors"))
    tmp = path.with_name(f".{path.name}.tmp")
    _save(state, tmp)
    tmp.replace(path)
    return path
