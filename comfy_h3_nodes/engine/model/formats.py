"""What a MiniMax-H3 transformer source is, read from its headers alone (no tensor data is read).

Sources B can load a transformer partition from (shared/design.md section 8):

===============  ==========================================================  ==========================================
kind             what it is                                                  loaded by (diffusers 0.42.1)
===============  ==========================================================  ==========================================
``folder``       ``<model_dir>/transformer/`` or ``transformer_ref/`` of a    ``load_components`` (as before)
                 diffusers checkpoint (``config.json`` + safetensors shards)
``single_file``  one ``.safetensors`` in the published single-file layout    ``MiniMaxH3Transformer3DModel
                 (Comfy-Org's unpruned ``minimax_h3_*_bf16``: ``blocks.N``,    .from_single_file(path, config=, subfolder=)``
                 stacked ``attn.qkv_proj``, ``mlp.fc1`` = [gate; value])
``gguf``         an unpruned ``.gguf`` with the same tensor names             the same call plus
                 (Q8_0, K-quants, ...; small tensors F32/BF16)                ``GGUFQuantizationConfig``
``single_file``  Comfy-Org's other variants (``variant``/``pruned`` set): pruned  :func:`.comfy_dit.load` (the pack's:
(Comfy-Org)      AdaLN (``adaln_t_table`` in place of ``time_embedder``) and/or  diffusers refuses pruned files and has
                 quantised layers (fp8_scaled, int8/convrot, w4a8/w6a8;          no reader for ComfyUI's quantised
                 :mod:`.comfy_keys`)                                             layers)
===============  ==========================================================  ==========================================

A ``folder`` may be a FastH3 one (FastVideo's VSA checkpoints: ``to_gate_compress`` tensors in every main block);
:mod:`.fasth3` reads its VSA settings into ``TransformerSource.vsa``.

Refused, each with one sentence naming what was found and what works instead: pruned GGUFs, VSA gates in a single file
or a GGUF (FastH3 loads as a folder), diffusers-named shards given as a file, LoRA files, layers quantised in a format
comfy-kitchen cannot read, and anything else that is not an H3 transformer (a text encoder or VAE file is named as
such, with the machine and folder it belongs in).

:func:`detect` is the one entry point (B's loader and the memory plan call it); :func:`is_h3_transformer` is the
cheap, never-raising test a model picker uses to recognise ``.safetensors`` / ``.gguf`` files by their keys.

The released transformer config (both partitions share the architecture) ships with the pack in
``engine/h3_configs/<partition>/config.json``, so a single file or a GGUF loads offline without a diffusers folder
for the config. Its values are the released checkpoint's, stated identically by independent public sources (read,
not copied): diffusers 0.42.1's ``MiniMaxH3Transformer3DModel`` class defaults and docstring, a FastH3 loader's
``official_config()``, a conversion recipe's transformer config (annotated with the reference implementation's
names), a checkpoint verifier's ``EXPECTED_CONFIG`` for the 14-shard diffusers transformer, and a Rust port's
"published config" parse test: 56 heads x 128, hidden 5376, 50 layers, 2 refiner layers, FFN 14336, text_dim 5120,
freq_dim 256, time embedding 5376 -> 2688, RoPE 16 frequencies per axis at theta 10000, eps 1e-5. It gives
33,122,992,896 parameters = 61.7 GiB in bf16, the published size of each partition.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
from dataclasses import dataclass, field

import gguf

from ..contract.configs import PARTITIONS
from ..contract.errors import ModelFolderError
from . import comfy_keys, fasth3

H3_CLASS = "MiniMaxH3Transformer3DModel"
#: diffusers' own detection key for the published single-file layout (``CHECKPOINT_KEY_NAMES["minimax-h3"]``)
PUBLISHED_MARKER = "token_refiner.blocks.0.attn.qkv_proj.weight"
DIFFUSERS_MARKER = "token_refiner.refiner_blocks.0.attn.to_q.weight"
PRUNED_MARKER = "adaln_t_table"
VSA_MARKERS = ("gate_compress",)
LORA_MARKERS = ("lora_A", "lora_B", "lora_down", "lora_up", "lora_unet_")
COMFY_PREFIX = "model.diffusion_model."

#: the partition each workflow's transformer file is (Comfy-Org names its files ``minimax_h3_<workflow>_...``); the two
#: partitions share every tensor name and shape (ComfyUI's own detection cannot tell them apart either), so a file's
#: name, or its header's metadata, is all that says which one it is
WORKFLOW_PARTITION = {"t2va": "transformer", "fl2va": "transformer", "ref2va": "transformer_ref"}
#: the workflows of each partition, for the readouts
PARTITION_WORKFLOWS = {"transformer": "t2va/fl2va", "transformer_ref": "ref2va"}

#: the configs shipped with the pack (the released model's), one folder per partition
SHIPPED_CONFIG_ROOT = pathlib.Path(__file__).resolve().parent / "h3_configs"
#: the release's index and scheduler configs: what B loads beside a transformer file when it has no diffusers folder
RELEASED_CONFIG_DIR = SHIPPED_CONFIG_ROOT / "released"

SAFETENSORS_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                     "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
#: GGUF tensor types diffusers loads as plain torch tensors (everything else becomes a GGUFParameter)
GGUF_PLAIN = ("F32", "F16")


class FormatError(ModelFolderError):
    """A source B cannot load as an H3 transformer; the message names what was found and what works instead."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its file header describes it: logical (torch) shape, stored type, stored bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype ("BF16", "F32", ...) or GGUF type name ("Q8_0", "Q6_K", "F32", "BF16", ...)
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n


@dataclass
class TransformerSource:
    """A transformer partition's weights and where its config comes from."""

    kind: str  # "folder" | "single_file" | "gguf"
    path: pathlib.Path  # the component folder, or the file
    tensors: dict[str, TensorInfo] = field(default_factory=dict)  # names as stored in the file(s)
    config_root: pathlib.Path | None = None  # from_single_file(config=config_root, subfolder=subfolder)
    subfolder: str = "transformer"
    metadata: dict = field(default_factory=dict)
    variant: str = ""  # Comfy-Org's quantised variant of the layers ("fp8_scaled", "int8", ...; "" = plain)
    pruned: bool = False  # ``adaln_t_table`` in place of ``time_embedder``
    vsa: fasth3.VSASettings | None = None  # a FastH3 folder: how its VSA-H3 attention runs

    @property
    def comfy(self) -> bool:
        """A Comfy-Org variant diffusers cannot load itself (pruned and/or quantised): :mod:`.comfy_dit` loads it."""
        return bool(self.variant) or self.pruned

    @property
    def file_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def config_path(self) -> pathlib.Path:
        if self.kind == "folder":
            return self.path / "config.json"
        return self.config_root / self.subfolder / "config.json"

    def config(self) -> dict:
        return json.loads(self.config_path.read_text())

    def quant_types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.dtype] = out.get(t.dtype, 0) + 1
        return out

    def describe(self) -> str:
        types = ", ".join(f"{k} x{v}" for k, v in sorted(self.quant_types().items()))
        what = {"folder": "diffusers folder", "single_file": "single-file safetensors (published layout)",
                "gguf": "GGUF"}[self.kind]
        if self.comfy:
            what = "Comfy-Org " + ", ".join(x for x in (self.variant, "pruned" if self.pruned else "") if x)
        return f"{self.path} ({what}; {len(self.tensors)} tensors, {_gib(self.file_bytes)} on disk; {types})"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.2f} MiB"


# ---------------------------------------------------------------------------------------------------- headers
def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], dict]:
    """Tensor infos and ``__metadata__`` of a ``.safetensors`` file: its first 8 + N bytes only."""
    p = pathlib.Path(path)
    with open(p, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise FormatError(f"{p} is {len(head)} bytes long: not a safetensors file (no header).")
        (n,) = struct.unpack("<Q", head)
        size = p.stat().st_size
        if n > min(size - 8, 100 * 2**20):
            raise FormatError(f"{p} does not start with a safetensors header (declared header of {n} bytes in a "
                              f"{size}-byte file).")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{p} has an unreadable safetensors header ({exc}).") from exc
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in header.items():
        dtype = info["dtype"]
        shape = tuple(int(s) for s in info["shape"])
        begin, end = info["data_offsets"]
        out[name] = TensorInfo(name, shape, dtype, int(end) - int(begin))
    return out, meta


def read_gguf_header(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], dict]:
    """Tensor infos (torch-order logical shapes) and scalar metadata of a ``.gguf`` file. ``GGUFReader`` parses the
    header and memory-maps the data; no tensor data is touched here."""
    p = pathlib.Path(path)
    try:
        reader = gguf.GGUFReader(str(p), "r")
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a GGUF we can read"
        raise FormatError(f"{p} is not a readable GGUF file ({type(exc).__name__}: {exc}).") from exc
    meta = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or not fld.types or len(fld.types) != 1:
            continue
        try:
            meta[key] = fld.contents()
        except Exception:  # noqa: BLE001 - metadata is informative only
            continue
    out = {}
    for t in reader.tensors:
        shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
        out[t.name] = TensorInfo(t.name, shape, t.tensor_type.name, int(t.n_bytes))
    return out, meta


# ---------------------------------------------------------------------------------------------------- layout
#: published single-file name fragment -> diffusers name fragment (the format's definition; diffusers' converter
#: ``convert_minimax_h3_transformer_checkpoint_to_diffusers`` applies the same renames, and a test checks that the two
#: agree on the tiny fixture). ``prefix`` entries apply at the start of a name only.
_PREFIX_RENAMES = (
    ("time_embedder.proj_in.", "time_embedder.linear_1."),
    ("time_embedder.proj_out.", "time_embedder.linear_2."),
    ("video_patch_proj.", "proj_in."),
    ("audio_patch_proj.", "audio_proj_in."),
    ("condition_proj.", "context_embedder."),
    ("final_layer.norm.", "norm_out.norm."),
    ("final_layer.adaln_proj.linear.", "norm_out.linear."),
    ("final_layer.video_out.", "proj_out."),
    ("final_layer.audio_out.", "audio_proj_out."),
    ("token_refiner.blocks.", "token_refiner.refiner_blocks."),
    ("blocks.", "transformer_blocks."),
)
_INFIX_RENAMES = (
    (".attn.q_norm.", ".attn.norm_q."),
    (".attn.k_norm.", ".attn.norm_k."),
    (".attn.out_proj.", ".attn.to_out.0."),
    (".mlp.fc1.", ".ff.net.0.proj."),
    (".mlp.fc2.", ".ff.net.2."),
)
QKV = ".attn.qkv_proj.weight"
DROPPED = ("rope.inv_freq",)  # recomputed from the config by MiniMaxH3RotaryPosEmbed


def published_to_diffusers_name(name: str) -> str:
    for old, new in _PREFIX_RENAMES:
        if name.startswith(old):
            name = new + name[len(old):]
            break
    for old, new in _INFIX_RENAMES:
        name = name.replace(old, new)
    return name


def diffusers_to_published_name(name: str) -> str:
    for old, new in _INFIX_RENAMES:
        name = name.replace(new, old)
    for old, new in _PREFIX_RENAMES:
        if name.startswith(new):
            return old + name[len(new):]
    return name


def diffusers_view(source: TransformerSource) -> dict[str, TensorInfo]:
    """The source's tensors under diffusers' names and shapes (a stacked ``qkv_proj`` becomes ``to_q/to_k/to_v``,
    each a third of its rows and bytes). A folder is already in diffusers' names."""
    if source.kind == "folder":
        return dict(source.tensors)
    out = {}
    layers = comfy_keys.quantized_layers(source.tensors, source.metadata) if source.variant else {}
    for name, t in source.tensors.items():
        if name in DROPPED or (source.variant and comfy_keys.is_side_key(name)):
            continue
        if name == PRUNED_MARKER:
            out["time_embedder.adaln_t_table"] = t
            continue
        layer = name[: -len(".weight")]
        if layer in layers:  # a quantised weight: its logical shape, and what it holds with its scales
            t = TensorInfo(name, _logical_shape(source.tensors, layer, layers[layer]), layers[layer],
                           comfy_keys.stored_bytes(source.tensors, layer))
        if name.endswith(QKV):
            base = published_to_diffusers_name(name[: -len(QKV)])
            rows = t.shape[0] // 3
            nbytes = comfy_keys.stored_bytes(source.tensors, layer, 3) if layer in layers else t.nbytes // 3
            for part in ("to_q", "to_k", "to_v"):
                new = f"{base}.attn.{part}.weight"
                out[new] = TensorInfo(new, (rows, *t.shape[1:]), t.dtype, nbytes)
            continue
        new = published_to_diffusers_name(name)
        out[new] = TensorInfo(new, t.shape, t.dtype, t.nbytes)
    return out


def _logical_shape(tensors: dict, layer: str, fmt: str) -> tuple[int, ...]:
    shape = tensors[f"{layer}.weight"].shape
    if fmt == "asym_w4a8_int8":
        return (shape[0], tensors[f"{layer}.weight_s_rel"].shape[1] * 16)
    if fmt == "nvfp4":
        return (shape[0], 2 * shape[1])
    return tuple(shape)


# ---------------------------------------------------------------------------------------------------- detection
def _sample(names, limit: int = 3) -> str:
    names = sorted(names)
    return ", ".join(f"`{n}`" for n in names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _guess_foreign(names: list[str]) -> str:
    """What a file that is not an H3 transformer most likely is, from its tensor names."""
    joined = " ".join(names[:2000])
    part = comfy_keys.part_of(names)
    if part is not None:
        return (f"a {comfy_keys.PART_NAMES[part]} (it belongs on machine A, in ComfyUI's "
                f"models/{comfy_keys.PART_FOLDERS[part]}/, chosen on H3LoadEncoders' {part})")
    if any(m in joined for m in LORA_MARKERS):
        return "a LoRA adapter (load it with H3LoRA / the adapters of a request, not as a transformer)"
    if "language_model." in joined or "lm_head" in joined or "embed_tokens" in joined:
        return "a text encoder (Qwen3-VL belongs in the diffusers folder's text_encoder/ on machine A)"
    if "decoder." in joined and ("encoder." in joined or "post_quant" in joined or "quant_conv" in joined):
        return "a VAE (the video/audio VAEs load from the diffusers folder on machine A)"
    if any(n.startswith(COMFY_PREFIX) for n in names):
        return f"a ComfyUI-prefixed checkpoint (`{COMFY_PREFIX}...` keys) of another model"
    return "another model"


def classify_keys(names: list[str], where: str, vsa_ok: bool = False) -> str:
    """``"published"`` or ``"diffusers"`` for an H3 transformer's tensor names; otherwise :class:`FormatError`.
    ``vsa_ok``: a folder, where VSA gates are FastH3's (:mod:`.fasth3` checks them)."""
    keys = set(names)
    vsa = [n for n in names if any(m in n for m in VSA_MARKERS)]
    if vsa and not vsa_ok:
        raise FormatError(
            f"{where} holds FastVideo VSA (video sparse attention) gates ({len(vsa)} tensors such as `{vsa[0]}`) "
            "in a single file, and dense attention is no substitute: FastH3 (VSA) checkpoints load as a diffusers "
            "folder (its transformer/ with config.json and shards), so point B at the FastH3 folder instead.")
    if PUBLISHED_MARKER in keys:
        return "published"
    if DIFFUSERS_MARKER in keys:
        return "diffusers"
    if COMFY_PREFIX + PUBLISHED_MARKER in keys:
        raise FormatError(
            f"{where} holds an H3 transformer under ComfyUI's `{COMFY_PREFIX}` key prefix, which diffusers' "
            "single-file converter does not strip: re-save it without the prefix, or use Comfy-Org's "
            "`minimax_h3_*_bf16.safetensors` as published.")
    raise FormatError(
        f"{where} is not a MiniMax-H3 transformer: it looks like {_guess_foreign(names)} (keys such as "
        f"{_sample(names)}; an H3 transformer has `{PUBLISHED_MARKER}`): give a MiniMax-H3 transformer as a "
        "diffusers folder, a single-file .safetensors (Comfy-Org's, pruned or not) or an unpruned .gguf.")


def _check_vsa_config(config: dict, where: str) -> None:
    hits = [k for k in config if "vsa" in k.lower() or "sparse" in k.lower() or "sparsity" in k.lower()]
    if hits:
        raise FormatError(
            f"{where} is configured for FastVideo's VSA attention (config keys {', '.join(hits)}) without the VSA "
            "gate tensors it needs, and dense attention is no substitute: use the FastH3 folder with its gates, or a "
            "dense MiniMax-H3 checkpoint.")
    cls = config.get("_class_name")
    if cls and cls != H3_CLASS:
        raise FormatError(f"{where} is a {cls}, not a {H3_CLASS}: point B at a MiniMax-H3 transformer.")


def config_root_for(partition: str, model_dir: str | os.PathLike | None = None,
                    near: str | os.PathLike | None = None) -> pathlib.Path:
    """Where ``from_single_file`` finds ``<partition>/config.json``: a ``<partition>/config.json`` beside the file
    (``near``: the file's folder), else the user's diffusers folder when it has one, else the released config shipped
    with the pack."""
    if partition not in PARTITIONS:
        raise FormatError(f"partition is {partition!r}; expected one of {PARTITIONS}.")
    for candidate in (near, model_dir):
        if candidate is not None:
            root = pathlib.Path(os.path.expanduser(str(candidate)))
            if (root / partition / "config.json").is_file():
                return root.resolve()
    return SHIPPED_CONFIG_ROOT


def named_workflow(path: pathlib.Path, metadata: dict | None = None) -> str | None:
    """The workflow a transformer file says it is for (``t2va``, ``fl2va``, ``ref2va``), from its name's words
    (``minimax_h3_ref2va_int8.safetensors``) or its header's metadata values; None when it says none or several."""
    words = {w for w in path.stem.lower().replace("-", "_").split("_")}
    for value in (metadata or {}).values():
        if isinstance(value, str) and len(value) < 256:
            words |= {w for w in value.lower().replace("-", "_").replace(" ", "_").split("_")}
    found = {w for w in WORKFLOW_PARTITION if w in words}
    return found.pop() if len(found) == 1 else None


def check_partition(path: pathlib.Path, partition: str, metadata: dict | None = None) -> None:
    """Refuse a file that says it is the other partition's (a ref2va file picked for ``transformer``, a t2va or
    fl2va one for ``transformer_ref``): it would load (the partitions share their tensors' names and shapes) and
    run the wrong model without a word."""
    workflow = named_workflow(path, metadata)
    if workflow is None or partition not in PARTITION_WORKFLOWS or WORKFLOW_PARTITION[workflow] == partition:
        return
    other = WORKFLOW_PARTITION[workflow]
    raise FormatError(
        f"{path.name} is the {workflow} transformer (its name says so), picked for partition {partition} "
        f"({PARTITION_WORKFLOWS[partition]}): set partition to {other} for it, or pick a "
        f"{PARTITION_WORKFLOWS[partition]} transformer file for {partition}.")


def detect(path: str | os.PathLike, partition: str = "transformer",
           model_dir: str | os.PathLike | None = None, partition_check: bool = True) -> TransformerSource:
    """Identify a transformer source by its headers: a diffusers component folder (or a checkpoint folder, whose
    ``<partition>/`` is taken), a published single-file ``.safetensors`` or an unpruned ``.gguf``. Raises
    :class:`FormatError` with one sentence for anything B cannot load, and (``partition_check``) for a file that
    says it is the other partition's (:func:`check_partition`)."""
    p = pathlib.Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise FormatError(f"transformer source {p} does not exist.")
    if p.is_dir():
        if (p / "modular_model_index.json").is_file():
            p = p / partition
            if not p.is_dir():
                raise FormatError(f"model folder {p.parent} has no {partition}/; copy it there, or give a single "
                                  f"file for {partition}.")
        files = sorted(p.glob("*.safetensors"))
        cfg_path = p / "config.json"
        if not cfg_path.is_file() or not files:
            raise FormatError(f"{p} is not a diffusers transformer folder (it needs config.json and *.safetensors "
                              "shards).")
        config = json.loads(cfg_path.read_text())
        tensors: dict[str, TensorInfo] = {}
        for f in files:
            tensors.update(read_safetensors_header(f)[0])
        vsa = fasth3.detect(p, config, tensors, str(p))
        _check_vsa_config(config if vsa is None else {"_class_name": config.get("_class_name")}, str(p))
        kind = classify_keys(list(tensors), str(p), vsa_ok=vsa is not None)
        if kind != "diffusers":
            raise FormatError(f"{p} holds the published single-file layout in a diffusers folder; give the file "
                              "itself instead of the folder.")
        return TransformerSource("folder", p.resolve(), tensors, p.parent.resolve(), p.name, vsa=vsa)
    suffix = p.suffix.lower()
    if suffix == ".safetensors":
        tensors, meta = read_safetensors_header(p)
        kind = classify_keys(list(tensors), str(p))
        if kind == "diffusers":
            raise FormatError(
                f"{p} holds diffusers-named tensors (one shard of a diffusers transformer folder, not the published "
                "single-file layout): point B at the diffusers checkpoint folder that holds it instead.")
        layers = comfy_keys.quantized_layers(tensors, meta)
        comfy_keys.check_supported(layers, tensors, str(p))
        if partition_check:
            check_partition(p, partition, meta)
        root = config_root_for(partition, model_dir, near=p.parent)
        src = TransformerSource("single_file", p.resolve(), tensors, root, partition, meta,
                                comfy_keys.variant_of(tensors, meta), PRUNED_MARKER in tensors)
        _check_vsa_config(src.config(), str(src.config_path))
        return src
    if suffix == ".gguf":
        tensors, meta = read_gguf_header(p)
        classify_keys(list(tensors), str(p))
        if any(n.endswith(PRUNED_MARKER) for n in tensors):
            raise FormatError(
                f"{p} is a pruned MiniMax-H3 GGUF (`{PRUNED_MARKER}` in place of `time_embedder`), which diffusers' "
                "GGUF loader cannot read: use Comfy-Org's pruned .safetensors (bf16, fp8_scaled or int8_convrot) or "
                "an unpruned GGUF.")
        try:
            # diffusers (and torch) load only when a GGUF file is checked, never to list or read headers
            from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES

            supported = {q.name for q in SUPPORTED_GGUF_QUANT_TYPES} | set(GGUF_PLAIN)
        except Exception:  # noqa: BLE001 - without diffusers' GGUF support the loader will say so itself
            supported = None
        if supported is not None:
            bad = sorted({t.dtype for t in tensors.values()} - supported)
            if bad:
                raise FormatError(
                    f"{p} uses GGUF tensor types {', '.join(bad)}, which diffusers cannot dequantize: use a file "
                    f"quantized to {', '.join(sorted(supported - {'F32', 'F16'}))}.")
        if partition_check:
            check_partition(p, partition, {k: v for k, v in meta.items() if isinstance(v, str)})
        root = config_root_for(partition, model_dir, near=p.parent)
        src = TransformerSource("gguf", p.resolve(), tensors, root, partition, meta)
        _check_vsa_config(src.config(), str(src.config_path))
        return src
    raise FormatError(f"{p} is neither a folder, a .safetensors nor a .gguf file: give a MiniMax-H3 transformer as a "
                      "diffusers folder, a single-file .safetensors (Comfy-Org's, pruned or not) or an unpruned .gguf.")


def is_h3_transformer(path: str | os.PathLike) -> bool:
    """True when ``path`` (a ``.safetensors``/``.gguf`` file or a folder) is a MiniMax-H3 transformer B can load,
    recognised by its keys (never by its name). Never raises: for model pickers."""
    try:
        detect(path, partition_check=False)  # either partition's file is one
        return True
    except Exception:  # noqa: BLE001
        return False


def check_covers(source: TransformerSource, expected: dict[str, tuple[int, ...]]) -> None:
    """The source's tensors (in diffusers' names) must be exactly the model's: refuse missing, unexpected and
    mis-shaped tensors before anything loads (diffusers would only warn and drop them)."""
    have = diffusers_view(source)
    missing = sorted(set(expected) - set(have))
    extra = sorted(set(have) - set(expected))
    shaped = sorted(n for n in set(have) & set(expected)
                    if source.kind != "gguf" and tuple(have[n].shape) != tuple(expected[n]))
    if source.kind == "gguf":  # quantized byte shapes: compare element counts
        shaped = sorted(n for n in set(have) & set(expected) if have[n].numel != _numel(expected[n]))
    if missing or extra or shaped:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing ({_sample(missing)})")
        if extra:
            parts.append(f"{len(extra)} unexpected ({_sample(extra)})")
        if shaped:
            n = shaped[0]
            parts.append(f"{len(shaped)} with other shapes (`{n}` is {tuple(have[n].shape)}, the config wants "
                         f"{tuple(expected[n])})")
        raise FormatError(f"{source.path} does not match the transformer config {source.config_path}: "
                          + "; ".join(parts) + ". It is another size or variant of the model: give the config that "
                          "matches it (a diffusers folder with its config.json), or the matching checkpoint.")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# ---------------------------------------------------------------------------------------------------- GGUF policy
#: published names of the modules the release stores in fp32 (diffusers keeps them fp32: ``_keep_in_fp32_modules``)
PUBLISHED_FP32_PREFIXES = ("video_patch_proj.", "audio_patch_proj.", "time_embedder.", "final_layer.video_out.",
                           "final_layer.audio_out.")
GGUF_BLOCK = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q2_K": 256, "Q3_K": 256, "Q4_K": 256,
              "Q5_K": 256, "Q6_K": 256}
#: bytes per block of each GGUF type (``gguf.GGML_QUANT_SIZES``), for arithmetic without the gguf package
GGUF_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q2_K": 84, "Q3_K": 110,
                    "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def gguf_type_for(published_name: str, shape, qtype: str) -> str:
    """The GGUF type of one tensor in the pack's GGUF files (the tiny fixtures, and the real-size arithmetic of
    ``bench memory``): F32 for 1-D tensors and the release's fp32 modules, ``qtype`` where a row is a whole number of
    its blocks, BF16 otherwise (what community converters do with tensors a block does not fit)."""
    if len(shape) < 2 or published_name.startswith(PUBLISHED_FP32_PREFIXES) or published_name in DROPPED:
        return "F32"
    return qtype if int(shape[-1]) % GGUF_BLOCK[qtype] == 0 else "BF16"


def gguf_nbytes(kind: str, numel: int) -> int:
    if kind == "F32":
        return 4 * numel
    if kind in ("F16", "BF16"):
        return 2 * numel
    return numel // GGUF_BLOCK[kind] * GGUF_BLOCK_BYTES[kind]
