"""A's parts from Comfy-Org's single files: the text encoder (``models/text_encoders``), the video VAE and the audio
VAE (``models/vae``), loaded into diffusers' / transformers' own classes.

=============  ======================================================  ============================================
part           file layout (ComfyUI's module names)                    into
=============  ======================================================  ============================================
text_encoder   ``model.*`` / ``visual.*``; 50 decoder layers, no final  ``Qwen3VLForConditionalGeneration``:
               norm, no ``lm_head`` (bf16, int8_convrot, nvfp4_awq)      ``model.X`` -> ``model.language_model.X``,
                                                                        ``visual.X`` -> ``model.visual.X``
vae            ``encoder.down.I.block.J``, ``nin_shortcut``,            ``AutoencoderKLMiniMaxH3``: renamed, q/k/v
               ``decoder.x_embedder``, ``attn.to_qkv`` interleaved per   split per head, SwiGLU halves swapped,
               head, ``ff.w1`` = [gate; value] (fp16, int8_convrot)     ``mask_token`` dropped
audio_vae      the same names, weight norm folded into ``X.weight``      ``AutoencoderKLMiniMaxH3Audio`` with its weight
               (fp32)                                                   norm removed (``remove_weight_norm``): the
                                                                        folded ``X.weight`` loads as it is, exactly
=============  ======================================================  ============================================

Both VAE files carry ``latents_mean`` / ``latents_std``; they replace the config's. Quantised layers are dequantised on
load (comfy-kitchen, :mod:`.quant`) to the load dtype; the classes' fp32 modules stay fp32.

**Layer 50.** MiniMax-H3 conditions on the raw output of the text encoder's 50th decoder layer: diffusers' encoder
block reads ``hidden_states[50]`` and refuses a stack of 50 layers or fewer (transformers replaces the last entry of
``hidden_states`` by the final-normed state). A 50-layer file is loaded as 51 layers whose last one is a pass-through
(:class:`ZeroAttention` and :class:`ZeroMLP`: it adds nothing to the residual, holds no weights and costs nothing), so
``hidden_states[50]`` is exactly the file's 50th layer, diffusers' check passes and diffusers is not edited.

**Configs.** Each part's configs come from the first of: a ``<part>/config.json`` beside the file, the diffusers folder
``model_path`` names, the released configs shipped with the pack (``h3_configs/released/``), whose shapes match the
file's header. The text encoder's tokenizer and processor come from the same place; the shipped set holds their
configs and takes the Qwen2 BPE vocabulary (``vocab.json``, ``merges.txt``) from the tokenizer folders the host names
(ComfyUI's own, which its H3 text encoder reads), or a diffusers folder's.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import time
from dataclasses import dataclass, field

import torch
from accelerate import init_empty_weights
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
from safetensors import safe_open
from torch import nn
from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

from . import comfy_keys, formats, quant
from .compat import ensure_processor_compat
from .split import LoadRecord, quiet_weight_norm, torch_dtype

#: the hidden state MiniMax-H3 reads (diffusers' ``text_encoder_layer``)
TEXT_LAYER = 50
CLASSES = {"text_encoder": Qwen3VLForConditionalGeneration, "vae": AutoencoderKLMiniMaxH3,
           "audio_vae": AutoencoderKLMiniMaxH3Audio}
SHIPPED = formats.RELEASED_CONFIG_DIR
VOCAB_FILES = ("vocab.json", "merges.txt")


class ZeroAttention(nn.Module):
    """Self-attention of the pass-through layer: adds nothing."""

    def forward(self, hidden_states, *args, **kwargs):
        return torch.zeros_like(hidden_states), None


class ZeroMLP(nn.Module):
    def forward(self, hidden_states):
        return torch.zeros_like(hidden_states)


class ZeroHead(nn.Module):
    """The text encoder's ``lm_head`` when the file has none (an untied vocabulary projection: 1.5 GB of zeros at
    bf16 for the release). A never reads logits, only hidden states: zeros as a stride-0 view, no weight held."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    def forward(self, hidden_states):
        return hidden_states.new_zeros(()).expand(*hidden_states.shape[:-1], self.out_features)


@dataclass
class PartSource:
    """One A part from a file, and the folder its configs come from."""

    component: str  # "text_encoder" | "vae" | "audio_vae"
    path: pathlib.Path
    tensors: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    variant: str = ""
    config_root: pathlib.Path | None = None
    tokenizer_dir: pathlib.Path | None = None  # text encoder: where vocab.json / merges.txt come from

    @property
    def config_path(self) -> pathlib.Path:
        return self.config_root / self.component / "config.json"

    def config(self) -> dict:
        return json.loads(self.config_path.read_text())

    def describe(self) -> str:
        what = f"{comfy_keys.PART_NAMES[self.component]}, {self.variant or 'plain'}"
        return f"{self.path.name} ({what}; configs from {self.config_root})"


# ---------------------------------------------------------------------------------------------------- key maps
_VAE_RENAMES = ((r"^encoder\.down\.(\d+)\.block\.(\d+)\.", r"encoder.down_blocks.\1.resnets.\2."),
                (r"^encoder\.down\.(\d+)\.downsample\.", r"encoder.down_blocks.\1.downsamplers.0."),
                (r"\.nin_shortcut\.", ".conv_shortcut."), (r"^decoder\.x_embedder\.", "decoder.proj_in."),
                (r"\.attn\.to_out\.", ".attn.to_out.0."), (r"\.ff\.w2\.", ".ff.net.2."))
VAE_DROPPED = ("decoder.mask_token", "latents_mean", "latents_std")


def key_map(component: str, names, expected: set[str]) -> dict[str, tuple[str, str, int]]:
    """``{target name: (file tensor, how, index)}``: ``plain``; ``qkv`` (index 0..2 of a per-head interleaved
    ``to_qkv``); ``swap`` (SwiGLU halves [gate; value] -> [value; gate]). Side keys of quantised layers and dropped
    tensors are not listed."""
    out = {}
    for name in names:
        if comfy_keys.is_side_key(name):
            continue
        if component == "text_encoder":
            if name.startswith("model."):
                out["model.language_model." + name[len("model."):]] = (name, "plain", 0)
            elif name.startswith("visual."):
                out["model." + name] = (name, "plain", 0)
            else:
                out[name] = (name, "plain", 0)
        elif component == "vae":
            if name in VAE_DROPPED:
                continue
            new = name
            for pat, rep in _VAE_RENAMES:
                new = re.sub(pat, rep, new)
            if ".attn.to_qkv." in new:
                for i, part in enumerate(("to_q", "to_k", "to_v")):
                    out[new.replace("to_qkv", part)] = (name, "qkv", i)
            elif ".ff.w1." in new:
                out[new.replace(".ff.w1.", ".ff.net.0.proj.")] = (name, "swap", 0)
            else:
                out[new] = (name, "plain", 0)
        elif name not in ("latents_mean", "latents_std"):
            out[name] = (name, "plain", 0)
    return out


def _apply(value: torch.Tensor, how: str, index: int, heads: int) -> torch.Tensor:
    if how == "plain":
        return value
    if how == "qkv":  # rows grouped per head as [q_h; k_h; v_h]
        dh = value.shape[0] // (3 * heads)
        return value.reshape(heads, 3, dh, *value.shape[1:])[:, index].reshape(heads * dh, *value.shape[1:])
    gate, val = value.chunk(2, dim=0)  # swap
    return torch.cat([val, gate], dim=0)


# ---------------------------------------------------------------------------------------------------- configs
def _file_layers(tensors) -> int:
    found = [int(m.group(1)) for n in tensors if (m := re.match(r"model\.layers\.(\d+)\.", n))]
    return max(found) + 1 if found else 0


def build_config(component: str, config: dict, source_tensors: dict | None = None):
    """The part's model config from its ``config.json`` (a text encoder file of exactly 50 layers gets the
    pass-through 51st; a VAE file's latent statistics replace the config's when given as ``stats``)."""
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    if component != "text_encoder":
        return config
    cfg = Qwen3VLConfig(**config)
    if source_tensors is not None:
        n = _file_layers(source_tensors)
        cfg.text_config.num_hidden_layers = n + 1 if n == TEXT_LAYER else n
        cfg.text_config.tie_last_hidden_states = False
    return cfg


def skeleton(component: str, config: dict, source_tensors: dict | None = None):
    """The part's model on the meta device (names, shapes): what the file must fill."""
    cfg = build_config(component, config, source_tensors)
    with init_empty_weights():
        if component == "text_encoder":
            return Qwen3VLForConditionalGeneration(cfg)
        with quiet_weight_norm():  # the audio VAE's construction warns on every build (split.quiet_weight_norm)
            model = CLASSES[component].from_config(cfg)
        if component == "audio_vae":  # the file holds the folded weights: no weight norm to recompute them by
            for module in model.modules():
                if hasattr(module, "weight_g"):
                    nn.utils.remove_weight_norm(module)
        return model


def expected_names(component: str, model, file_tensors) -> dict[str, tuple]:
    """The model's tensors the file must hold (not the pass-through layer, a final norm and lm_head the file has not)."""
    out = {n: tuple(p.shape) for n, p in model.state_dict().items()}  # parameters and persistent buffers
    if component == "text_encoder":
        n = _file_layers(file_tensors)
        out = {k: v for k, v in out.items() if not k.startswith(f"model.language_model.layers.{n}.")}
        out.pop("lm_head.weight", None)
        out.pop("model.language_model.norm.weight", None)
    return out


def _heads(component: str, config) -> int:
    return int(config.get("decoder_num_attention_heads", 1)) if component == "vae" else 1


def _mismatch(src: PartSource, config: dict) -> str:
    """Empty when the file fills exactly the model ``config`` builds, else what differs (one clause)."""
    model = skeleton(src.component, config, src.tensors)
    want = expected_names(src.component, model, src.tensors)
    plan = key_map(src.component, src.tensors, set(model.state_dict()))
    layers = comfy_keys.quantized_layers(src.tensors, src.metadata)
    missing = sorted(set(want) - set(plan))
    extra = sorted(set(plan) - set(want))
    if missing or extra:
        return (f"{len(missing)} missing (such as {missing[:1]}), {len(extra)} unexpected (such as {extra[:1]})")
    for target, (name, how, _) in plan.items():
        info = src.tensors[name]
        layer = name[: -len(".weight")]
        shape = tuple(formats._logical_shape(src.tensors, layer, layers[layer]) if layer in layers else info.shape)
        if how == "qkv":
            shape = (shape[0] // 3, *shape[1:])
        if shape != tuple(want[target]):
            return f"`{name}` is {shape}, the config wants {tuple(want[target])}"
    return ""


def detect_part(path: str | os.PathLike, component: str, model_dir: str | os.PathLike | None = None,
                tokenizer_dirs=()) -> PartSource:
    """A part file recognised by its keys, with the first config root that fits it; :class:`formats.FormatError`
    with one sentence otherwise."""
    p = pathlib.Path(os.path.expanduser(str(path)))
    label = comfy_keys.PART_NAMES[component]
    if not p.is_file() or p.suffix.lower() != ".safetensors":
        raise formats.FormatError(f"{component} file {p} does not exist or is not a .safetensors file: choose a "
                                  f"{label} file from ComfyUI's models/{comfy_keys.PART_FOLDERS[component]}/.")
    tensors, meta = formats.read_safetensors_header(p)
    found = comfy_keys.part_of(tensors)
    if found != component:
        what = (f"a {comfy_keys.PART_NAMES[found]}" if found else "a MiniMax-H3 transformer (it belongs on machine B)"
                if formats.PUBLISHED_MARKER in tensors else f"another model (keys such as {formats._sample(list(tensors))})")
        raise formats.FormatError(f"{p} is {what}, not a {label}: choose a {label} file for {component} (recognised "
                                  f"by `{comfy_keys.PART_MARKERS[component][0]}`).")
    layers = comfy_keys.quantized_layers(tensors, meta)
    comfy_keys.check_supported(layers, tensors, str(p))
    src = PartSource(component, p.resolve(), tensors, meta, comfy_keys.variant_of(tensors, meta))
    tried = []
    for root in (p.parent, model_dir, SHIPPED):
        if root is None:
            continue
        root = pathlib.Path(os.path.expanduser(str(root)))
        cfg = root / component / "config.json"
        if not cfg.is_file():
            continue
        why = _mismatch(src, json.loads(cfg.read_text()))
        if not why:
            src.config_root = root.resolve()
            break
        tried.append(f"{cfg} ({why})")
    else:
        raise formats.FormatError(f"{p} matches no {component} config ({'; '.join(tried)}): it is another size of the "
                                  f"model; put its config beside it as {component}/config.json.")
    if component == "text_encoder":
        src.tokenizer_dir = _tokenizer_dir(src.config_root, model_dir, tokenizer_dirs, p)
    return src


def _tokenizer_dir(root: pathlib.Path, model_dir, tokenizer_dirs, path) -> pathlib.Path:
    """The tokenizer of the config set: its own ``tokenizer/`` when it has one, else a vocabulary folder the host
    names (or the diffusers folder's) for the shipped configs."""
    if (root / "tokenizer" / "tokenizer_config.json").is_file() and root != SHIPPED:
        return root / "tokenizer"
    cands = [*(pathlib.Path(d) for d in tokenizer_dirs)]
    if model_dir is not None:
        cands.append(pathlib.Path(os.path.expanduser(str(model_dir))) / "tokenizer")
    for d in cands:
        if all((d / f).is_file() for f in VOCAB_FILES):
            return d
    raise formats.FormatError(f"the text encoder {path} needs the Qwen2 tokenizer vocabulary (vocab.json, merges.txt), "
                              "found in none of " + ", ".join(map(str, cands or ["(no folder)"]))
                              + ": run inside ComfyUI (its text_encoders/qwen25_tokenizer/), or set model_path to "
                              "the MiniMaxAI/MiniMax-H3 diffusers folder.")


def is_part_file(path, component: str) -> bool:
    """True when ``path`` is a ``.safetensors`` file of ``component`` by its keys (header only; never raises)."""
    try:
        p = pathlib.Path(path)
        return p.suffix.lower() == ".safetensors" and comfy_keys.part_of(formats.read_safetensors_header(p)[0]) == \
            component
    except Exception:  # noqa: BLE001
        return False


# ---------------------------------------------------------------------------------------------------- loading
def _keep32(cls, name: str) -> bool:
    keep = getattr(cls, "_keep_in_fp32_modules", None) or []
    return any(m in name.split(".") for m in keep)


def load_part(src: PartSource, dtype: torch.dtype, device: str = "cpu"):
    """The part's diffusers/transformers model from its file: quantised layers dequantised to ``dtype`` (fp32 where
    the class keeps fp32), tensors renamed and reshaped by :func:`key_map`, every parameter filled."""
    config = src.config()
    if src.component != "text_encoder":
        with safe_open(str(src.path), framework="pt", device="cpu") as fh:
            for stat in ("latents_mean", "latents_std"):
                if stat in src.tensors:
                    config[stat] = [round(float(x), 8) for x in fh.get_tensor(stat).float().tolist()]
    model = skeleton(src.component, config, src.tensors)
    cls = type(model)
    params = dict(model.named_parameters())
    buffers = {n for n, _ in model.named_buffers()}
    plan = key_map(src.component, src.tensors, set(model.state_dict()))
    layers = comfy_keys.quantized_layers(src.tensors, src.metadata)
    heads = _heads(src.component, config)
    names = set(src.tensors)
    cache: dict[str, torch.Tensor] = {}
    with safe_open(str(src.path), framework="pt", device="cpu") as fh:
        for target, (name, how, index) in plan.items():
            want = torch.float32 if _keep32(cls, target) else dtype
            if name not in cache:
                layer = name[: -len(".weight")]
                if layer in layers:
                    shape = formats._logical_shape(src.tensors, layer, layers[layer])
                    value = quant.dequantize(quant.read_layer(fh.get_tensor, names, layer), layers[layer], shape,
                                             torch.float32)
                else:
                    value = fh.get_tensor(name)
                cache = {name: value}  # a split q/k/v reads its tensor once
            value = _apply(cache[name], how, index, heads)
            if target in buffers:
                owner, leaf = target.rsplit(".", 1)
                buf = model.get_submodule(owner)._buffers[leaf]
                model.get_submodule(owner)._buffers[leaf] = value.to(buf.dtype).to(device)
            else:
                _set(model, target, value.to(want).to(device))
    _fill_rest(model, src, params, dtype, device)
    return model.eval()


def _set(model, name: str, value: torch.Tensor) -> None:
    owner, leaf = name.rsplit(".", 1)
    model.get_submodule(owner)._parameters[leaf] = nn.Parameter(value, requires_grad=False)


def _fill_rest(model, src: PartSource, params: dict, dtype, device: str) -> None:
    """What the file does not hold: the text encoder's pass-through layer, its unused final norm (ones) and lm_head
    (tied to the embeddings, or a :class:`ZeroHead` that holds no weight)."""
    if src.component != "text_encoder":
        return
    lm = model.model.language_model
    n = _file_layers(src.tensors)
    if len(lm.layers) > n:
        extra = lm.layers[n]
        extra.self_attn, extra.mlp = ZeroAttention(), ZeroMLP()
        for norm in (extra.input_layernorm, extra.post_attention_layernorm):
            norm.weight = nn.Parameter(torch.ones(norm.weight.shape, dtype=dtype, device=device), requires_grad=False)
    lm.norm.weight = nn.Parameter(torch.ones(lm.norm.weight.shape, dtype=dtype, device=device), requires_grad=False)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = lm.embed_tokens.weight
    elif model.lm_head.weight.is_meta:  # no 1.5 GB of zeros on A's device (nor in A's plan)
        model.lm_head = ZeroHead(model.lm_head.in_features, model.lm_head.out_features)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise formats.FormatError(f"{src.path} left {len(left)} tensors of the {src.component} unfilled (such as "
                                  f"`{left[0]}`): give a complete file.")


# ---------------------------------------------------------------------------------------------------- A's host
def resident_params(src: PartSource, model) -> dict:
    """The parameters the loaded part holds (the pass-through layer's attention and MLP hold none)."""
    params = dict(model.named_parameters())
    if src.component == "text_encoder":
        n = _file_layers(src.tensors)
        skip = (f"model.language_model.layers.{n}.self_attn.", f"model.language_model.layers.{n}.mlp.")
        params = {k: v for k, v in params.items() if not k.startswith(skip)}
        params.pop("lm_head.weight", None)  # the embedding table (tied), else a ZeroHead holding nothing
    return params


def tokenizer_folder(src: PartSource, cache_root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``(tokenizer folder, processor folder)`` of a text encoder part: its config set's own, or for the shipped set a
    folder made once in ``cache_root`` from the shipped configs and the vocabulary found (:func:`_tokenizer_dir`)."""
    root = src.config_root
    if root != SHIPPED and (root / "processor").is_dir():
        return src.tokenizer_dir, root / "processor"
    out = cache_root / f"qwen3vl-h3-tokenizer-{hashlib.sha256(str(src.tokenizer_dir).encode()).hexdigest()[:12]}"
    if not (out / "processor" / "processor_config.json").is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        for sub in ("tokenizer", "processor"):
            (tmp / sub).mkdir(parents=True, exist_ok=True)
            for f in VOCAB_FILES:
                shutil.copy(src.tokenizer_dir / f, tmp / sub / f)
            shutil.copy(SHIPPED / "tokenizer" / "tokenizer_config.json", tmp / sub / "tokenizer_config.json")
        shutil.copy(SHIPPED / "processor" / "processor_config.json", tmp / "processor" / "processor_config.json")
        if out.exists():  # another process made it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, out)
    return out / "tokenizer", out / "processor"


def load_parts(host, parts: dict[str, PartSource], dtype: str, device: str, cache_root: pathlib.Path) -> list:
    """Load each part from its file into ``host`` (a ModularPipeline), with the text encoder's tokenizer and
    processor (a shipped set's made in ``cache_root``); returns the load records."""
    records = []
    for component, src in parts.items():
        t0 = time.perf_counter()
        model = load_part(src, torch_dtype(dtype), device)
        extra = {}
        if component == "text_encoder":
            tok_dir, proc_dir = tokenizer_folder(src, pathlib.Path(cache_root))
            extra["tokenizer"] = AutoTokenizer.from_pretrained(str(tok_dir))
            ensure_processor_compat()  # the folders hold no video processor (transformers' need torchvision)
            extra["processor"] = Qwen3VLProcessor.from_pretrained(str(proc_dir))
        host.update_components(**{component: model}, **extra)
        records.append(LoadRecord(component, time.perf_counter() - t0, dtype, f"startup (file {src.path.name})"))
    return records
