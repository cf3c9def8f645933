"""The memory plan: what each machine will hold before it loads anything, checked against what it has.

Resident bytes come from the sources' headers and configs only (no tensor data is read): each tensor's element count
times the bytes it will hold at the requested precision, following diffusers' own rules:

* ``bf16`` (more exactly: the load dtype): every parameter at that dtype, except the modules the class keeps in fp32
  (``_keep_in_fp32_modules``, matched per dotted name component as ``from_pretrained`` does); buffers as built.
* ``fp8``: ``enable_layerwise_casting(storage_dtype=float8_e4m3fn)`` stores every Linear outside the skip patterns
  (diffusers' defaults + the class's ``_skip_layerwise_casting_patterns`` + its fp32 modules) at 1 byte per value;
  everything else as above. Loading it first at the load dtype peaks at that size for the partition being loaded.
* ``gguf``: quantized tensors (and BF16 ones) as stored, F32/F16 tensors at the load dtype, anything in an fp32
  module dequantized to fp32 (diffusers' GGUF quantizer). On CUDA the whole file is first read into host memory.
* ``stored`` (``auto`` for Comfy-Org's quantised files: fp8_scaled, int8/convrot, w4a8): each quantised layer as stored
  (its weight and scales, comfy-kitchen dequantises per call), everything else at the load dtype; ``bf16`` dequantises
  them at load. A pruned file's curve projections and table are fp32 (:mod:`.comfy_dit`).

Working memory is an estimate for the canvas (packed rows x bytes per row, plus one block's weights upcast for fp8 or
GGUF, plus allocator slack); it is stated as such wherever it is shown. Available memory is MemAvailable (psutil), or
CUDA free memory with a GPU; on unified memory (DGX Spark: GPU and host share one pool) the smaller of the two, once.
``H3_MEMORY_LIMIT_BYTES`` (or the ``limit_bytes`` parameter) replaces the measurement; a safety margin of
``H3_MEMORY_MARGIN`` (default 3 %) is kept free.

A plan that does not fit raises :class:`MemoryPlanError` before any load, with the numbers and the options that fit.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
from dataclasses import asdict, dataclass, field

import psutil
import torch
from accelerate import init_empty_weights
from diffusers import MiniMaxH3Transformer3DModel
from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS
from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

from ..contract import wire
from ..contract.configs import PARTITIONS, PRECISIONS
from ..contract.errors import ModelFolderError
from . import comfy_dit, comfy_files, comfy_keys, formats
from .cgroup_memory import cgroup_memory_left
from .vsa import add_gate_projections

LIMIT_ENV = "H3_MEMORY_LIMIT_BYTES"
MARGIN_ENV = "H3_MEMORY_MARGIN"
DEFAULT_MARGIN = 0.03
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: the default canvas a plan budgets working memory for (t2va's default size, 124 frames, 256 prompt tokens)
DEFAULT_CANVAS = (768, 1344, 124)
GiB = 2**30


class MemoryPlanError(ModelFolderError):
    """A plan that does not fit; the message carries the numbers and the options that would."""


def human(n: float) -> str:
    n = float(n)
    if abs(n) >= 2**30 * 0.1:
        return f"{n / GiB:.1f} GiB"
    if abs(n) >= 2**20 * 0.1:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"


# ---------------------------------------------------------------------------------------------------- skeletons
@functools.lru_cache(maxsize=8)
def _skeleton(config_json: str, vsa: bool = False):
    """The transformer built on the meta device from its config (no weights): names, shapes, module types; a FastH3
    one (``vsa``) with the gate of every main block, as B builds it."""
    config = {k: v for k, v in json.loads(config_json).items() if not k.startswith("_") and k != "vsa"}
    with init_empty_weights():
        model = MiniMaxH3Transformer3DModel.from_config(config)
        if vsa:
            add_gate_projections(model)
    return model


def skeleton(config: dict, vsa: bool = False):
    return _skeleton(json.dumps(config, sort_keys=True), vsa)


def source_skeleton(source: formats.TransformerSource):
    """The model a source loads into, on the meta device: the config's, pruned like the file when it is."""
    if source.pruned:
        return comfy_dit.skeleton(source)
    return skeleton(source.config(), vsa=getattr(source, "vsa", None) is not None)


def keeps_fp32(model, name: str) -> bool:
    """Whether a parameter is held in fp32: the class's fp32 modules, and a pruned model's curve projections."""
    return keep_fp32(type(model), name) or (getattr(model, "_h3_pruned", False) and comfy_dit.is_curve_param(name))


def keep_fp32(cls, name: str) -> bool:
    """diffusers' ``from_pretrained`` rule: a parameter stays fp32 when a dotted component of its name is listed in
    the class's ``_keep_in_fp32_modules``."""
    keep = getattr(cls, "_keep_in_fp32_modules", None) or []
    parts = name.split(".")
    return any(m in parts for m in keep)


def _fp8_skip_patterns(cls) -> tuple[str, ...]:
    return tuple(set(DEFAULT_SKIP_MODULES_PATTERN) | set(getattr(cls, "_keep_in_fp32_modules", None) or [])
                 | set(getattr(cls, "_skip_layerwise_casting_patterns", None) or []))


def fp8_cast_modules(model) -> set[str]:
    """Names of the leaf modules ``enable_layerwise_casting`` stores in fp8 (diffusers' traversal: a module whose
    name matches a skip pattern is skipped with everything under it; supported layers are cast whole)."""
    patterns = _fp8_skip_patterns(type(model))
    out: set[str] = set()

    def walk(module, prefix):
        if prefix and any(re.search(p, prefix) for p in patterns):
            return
        if isinstance(module, _GO_LC_SUPPORTED_PYTORCH_LAYERS):
            out.add(prefix)
            return
        for name, child in module.named_children():
            walk(child, f"{prefix}.{name}" if prefix else name)

    walk(model, "")
    return out


# ---------------------------------------------------------------------------------------------------- components
@dataclass
class ComponentPlan:
    name: str
    precision: str  # "bfloat16", "fp8", "gguf Q8_0", ...
    bytes: int
    load_peak_bytes: int = 0  # bytes above ``bytes`` while this component loads (freed after)
    detail: str = ""


def transformer_bytes(source: formats.TransformerSource, precision: str, dtype: str = "bfloat16",
                      device: str = "cpu", partition: str | None = None) -> ComponentPlan:
    """Resident bytes of one transformer partition at ``precision`` ("bf16" means the load ``dtype``), from the
    source's headers and config; also checks that the source's tensors are exactly the config's."""
    precision = resolve_precision(precision, source)
    model = source_skeleton(source)  # FastH3: + 1 gate per block (1.93 B at release size)
    cls = type(model)
    params = dict(model.named_parameters())
    formats.check_covers(source, {n: tuple(p.shape) for n, p in params.items()})
    size = DTYPE_BYTES[dtype]
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # rope.inv_freq, fp32
    if precision == "gguf":
        view = formats.diffusers_view(source)
        total, types = buffers, {}
        for name, p in params.items():
            info = view[name]
            types[info.dtype] = types.get(info.dtype, 0) + 1
            if keep_fp32(cls, name):
                total += 4 * p.numel()
            elif info.dtype in formats.GGUF_PLAIN:
                total += size * p.numel()
            else:
                total += info.nbytes
        quant = sorted(t for t in types if t not in ("F32", "F16", "BF16")) or ["BF16"]
        extra = source.file_bytes if device.startswith("cuda") else 0
        return ComponentPlan(partition or source.subfolder, f"gguf {'+'.join(quant)}", total, extra,
                             f"{source.path.name}: as stored ({', '.join(f'{k} x{v}' for k, v in sorted(types.items()))})")
    full = sum((4 if keeps_fp32(model, n) else size) * p.numel() for n, p in params.items()) + buffers
    if precision == "stored":
        view = formats.diffusers_view(source)
        total = buffers + sum(view[n].nbytes if view[n].dtype in comfy_keys.VARIANTS
                              else (4 if keeps_fp32(model, n) else size) * p.numel() for n, p in params.items())
        return ComponentPlan(partition or source.subfolder, f"{source.variant}{' pruned' if source.pruned else ''}",
                             total, 0, f"{source.path.name}: quantised layers as stored, the rest {dtype}")
    if precision == "fp8":
        cast = fp8_cast_modules(model)
        total = buffers
        for name, p in params.items():
            owner = name.rsplit(".", 1)[0]
            total += p.numel() if owner in cast else (4 if keeps_fp32(model, name) else size) * p.numel()
        return ComponentPlan(partition or source.subfolder, "fp8", total, full - total,
                             f"fp8 storage, {dtype} compute ({len(cast)} layers cast); loads at {dtype} first")
    what = f"{dtype}, fp32 modules kept fp32" + (f" ({source.variant} dequantised at load)" if source.variant else "")
    return ComponentPlan(partition or source.subfolder, dtype + (" pruned" if source.pruned else ""), full, 0, what)


def resolve_precision(precision: str, source: formats.TransformerSource) -> str:
    """``auto`` -> ``gguf`` for a GGUF file, ``stored`` for a Comfy-Org quantised file, else ``bf16`` (the load
    dtype); refuses mismatches. ``stored`` (already resolved) stays ``stored`` for a quantised file, else ``bf16``."""
    if precision == "stored":
        return "stored" if source.variant else "bf16"
    if precision not in PRECISIONS:
        raise MemoryPlanError(f"precision is {precision!r}; expected one of {PRECISIONS}.")
    if source.variant:
        if precision in ("auto", "bf16"):
            return "stored" if precision == "auto" else "bf16"
        raise MemoryPlanError(f"{source.path.name} is a Comfy-Org {source.variant} file: choose precision 'auto' (its "
                              f"layers as stored) or 'bf16' (dequantised at load), not {precision!r}.")
    if source.kind == "gguf":
        if precision in ("auto", "gguf"):
            return "gguf"
        raise MemoryPlanError(f"{source.path.name} is a GGUF file, used as stored: choose precision 'gguf' (or "
                              f"'auto'), not {precision!r}.")
    if precision == "gguf":
        raise MemoryPlanError(f"precision 'gguf' needs a .gguf file; {source.path} is a {source.kind}: choose 'bf16' "
                              "or 'fp8', or give a .gguf file.")
    return "bf16" if precision == "auto" else precision


def runs_as(source: formats.TransformerSource, precision: str, dtype: str) -> str:
    """What a partition really runs as, in a readout's words, for a *resolved* ``precision``
    (:func:`resolve_precision`): a Comfy-Org quantised file at ``stored`` keeps its layers as stored (comfy-kitchen
    tensors, dequantised per call, as ComfyUI runs them), at ``bf16`` they were dequantised once at load; ``fp8`` is
    fp8 storage with ``dtype`` compute (diffusers' layerwise casting); a GGUF file runs as stored."""
    if precision == "stored" and source.variant:
        text = f"{source.variant} layers as stored, dequantised per call to {dtype}"
    elif source.variant:
        text = f"{source.variant} dequantised to {dtype} at load"
    elif precision == "gguf" or source.kind == "gguf":
        quant = sorted(t for t in source.quant_types() if t.upper() not in ("F32", "F16", "BF16"))
        text = f"GGUF {'/'.join(quant) or 'plain'} as stored, dequantised per call to {dtype}"
    elif precision == "fp8":
        text = f"fp8 storage, {dtype} compute"
    else:
        text = dtype
    return text + (", pruned AdaLN in fp32" if source.pruned else "")


def packed_rows(height: int, width: int, frames: int, tokens: int = 256) -> int:
    """Rows of B's packed sequence: video patches (2x2 of the 16x latent), stereo audio rows, prompt tokens
    (shared/design.md section 2: 37,966 rows at 1344x768x124)."""
    f = wire.video_latent_frames(frames)
    return f * (height // 32) * (width // 32) + 2 * wire.audio_latent_frames(frames) + tokens


def working_bytes_b(config: dict, precision: str, dtype: str, canvas=DEFAULT_CANVAS, tokens: int = 256,
                    device: str = "cpu") -> int:
    """Estimate of B's activation memory for one forward at ``canvas`` (height, width, frames): per packed row the
    residual stream and modulation (4 x hidden), q/k/v/attention output (4 x heads x head_dim) and the SwiGLU
    (3 x ffn) at the compute dtype; plus one transformer block's weights upcast for fp8/GGUF; plus 1 GiB of allocator
    and CUDA context slack on a GPU."""
    h, w, f = canvas
    rows = packed_rows(h, w, f, tokens)
    hidden, inner = config["hidden_size"], config["num_attention_heads"] * config["attention_head_dim"]
    ffn = config["ffn_dim"]
    size = DTYPE_BYTES[dtype]
    per_row = size * (4 * hidden + 4 * inner + 3 * ffn)
    block = 0
    if precision in ("fp8", "gguf", "stored"):
        model = skeleton(config)
        block = size * sum(p.numel() for p in model.transformer_blocks[0].parameters())
    slack = GiB if device.startswith("cuda") else 0
    return rows * per_row + block + slack


# ---------------------------------------------------------------------------------------------------- available
def _within_cgroup(fn):
    """``available_memory`` no higher than the process's memory cgroup leaves (min of the two); a given limit stays."""
    @functools.wraps(fn)
    def wrapper(device: str = "cpu", limit_bytes: int | None = None) -> tuple[int, str]:
        avail, where = fn(device, limit_bytes)
        if limit_bytes is not None or where == LIMIT_ENV:
            return avail, where
        cg = cgroup_memory_left()
        return (cg[0], f"{cg[1]}, under {where}") if cg is not None and cg[0] < avail else (avail, where)
    return wrapper


@_within_cgroup
def available_memory(device: str = "cpu", limit_bytes: int | None = None) -> tuple[int, str]:
    """``(bytes, where from)``: the limit when given (parameter, then ``H3_MEMORY_LIMIT_BYTES``), else MemAvailable,
    CUDA free memory, or on unified memory MemAvailable plus what this process's allocator holds reserved but unused
    (one pool, counted once)."""
    if limit_bytes is not None:
        return int(limit_bytes), "limit"
    env = os.environ.get(LIMIT_ENV)
    if env:
        try:
            return int(float(env)), LIMIT_ENV
        except ValueError as exc:
            raise MemoryPlanError(f"{LIMIT_ENV}={env!r} is not a number of bytes.") from exc
    vm = psutil.virtual_memory()
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        free, total = torch.cuda.mem_get_info(idx)
        if abs(total - vm.total) < 0.2 * vm.total:
            # one pool (a Spark): CUDA's free figure leaves out reclaimable page cache, MemAvailable counts it; the
            # blocks this process's caching allocator holds unused are free to it too (and not to MemAvailable)
            idle = max(0, torch.cuda.memory_reserved(idx) - torch.cuda.memory_allocated(idx))
            return vm.available + idle, "unified memory: MemAvailable + this process's reserved-unused CUDA blocks"
        return free, "CUDA free"
    return vm.available, "MemAvailable"


def margin_fraction() -> float:
    try:
        return float(os.environ.get(MARGIN_ENV, DEFAULT_MARGIN))
    except ValueError:
        return DEFAULT_MARGIN


# ---------------------------------------------------------------------------------------------------- plans
@dataclass
class MemoryPlan:
    machine: str  # "A" | "B"
    label: str  # e.g. "fp8, both partitions"
    components: list[ComponentPlan]
    working_bytes: int
    available_bytes: int
    available_from: str
    margin_bytes: int
    canvas: tuple = DEFAULT_CANVAS
    options: list[tuple[str, int]] = field(default_factory=list)  # alternatives that fit: (label, need)
    held_elsewhere: dict = field(default_factory=dict)  # not free: name -> bytes (A: ComfyUI's loaded models)
    advice: list = field(default_factory=list)  # other ways out (A: free ComfyUI's models, a smaller file, ...)
    #: free now but another holder's (B: the other workers' models, :func:`counted_workers`): name -> bytes
    reserved: dict = field(default_factory=dict)

    @property
    def resident_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def load_peak_bytes(self) -> int:
        """The highest point while loading in order: what is already resident + the next component's extra."""
        peak, held = 0, 0
        for c in self.components:
            peak = max(peak, held + c.bytes + c.load_peak_bytes)
            held += c.bytes
        return peak

    @property
    def need_bytes(self) -> int:
        return max(self.resident_bytes + self.working_bytes, self.load_peak_bytes)

    @property
    def usable_bytes(self) -> int:
        return self.available_bytes - self.margin_bytes - sum(self.reserved.values())

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.usable_bytes

    def terms(self) -> str:
        parts = [f"{c.name} {human(c.bytes)}" for c in self.components]
        return " + ".join(parts + [f"working {human(self.working_bytes)}"])

    def summary(self) -> str:
        rel = "<=" if self.fits else ">"
        peak = (f"; loading peaks at {human(self.load_peak_bytes)}"
                if self.load_peak_bytes > self.resident_bytes + self.working_bytes else "")
        text = (f"{self.machine} plan ({self.label}): {self.terms()} = {human(self.resident_bytes + self.working_bytes)}"
                f"{peak} {rel} {human(self.usable_bytes)} free on {self.machine} ({self.available_from}, "
                f"{human(self.margin_bytes)} margin kept"
                + "".join(f", less {k}'s {human(v)}" for k, v in self.reserved.items() if v > 0) + ")")
        held = {k: v for k, v in self.held_elsewhere.items() if v > 0}
        if held:
            text += ("; besides the free memory " + ", ".join(f"{k} hold {human(v)}" for k, v in held.items()))
        if not self.fits and self.options:
            text += "; " + "; ".join(f"{label} ({human(need)}) fits" for label, need in self.options)
        if not self.fits and self.advice:
            text += "; options: " + "; ".join(self.advice)
        elif not self.fits and not self.options:
            text += "; no precision or residency of these files fits: free memory on this machine"
        return text

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(resident_bytes=self.resident_bytes, need_bytes=self.need_bytes, usable_bytes=self.usable_bytes,
                 load_peak_bytes=self.load_peak_bytes, fits=self.fits, summary=self.summary())
        return d

    def check(self) -> "MemoryPlan":
        if not self.fits:
            raise MemoryPlanError("memory plan refused before loading anything: " + self.summary())
        return self


def counted_workers(workers: dict | None, where: str) -> tuple[dict, dict]:
    """``(reserved, held_elsewhere)`` of a plan beside B's other workers (``name -> {"planned": bytes its plan holds
    resident, "working": its working memory, "now": bytes it holds now, "released": bool}``). Each may denoise while
    this one does: its working memory is taken out of the free figure. A fixed figure (a limit) is B's whole budget,
    so its model is too; a measured one (MemAvailable) already lacks what it holds now, so only a released worker's
    model is (its next request loads it again); what it holds now is said besides the free memory."""
    fixed = where in ("limit", LIMIT_ENV)
    reserved, held = {}, {}
    for name, w in sorted((workers or {}).items()):
        planned = int(w.get("planned") or 0) if fixed or w.get("released") else 0
        reserved[f"worker {name}"] = planned + int(w.get("working") or 0)
        if not fixed and w.get("now"):
            held[f"worker {name}'s weights"] = int(w["now"])
    return reserved, held


def plan_b(sources: dict[str, formats.TransformerSource], partitions: tuple[str, ...], precision: str = "auto",
           dtype: str = "bfloat16", device: str = "cpu", canvas=DEFAULT_CANVAS, limit_bytes: int | None = None,
           with_options: bool = True, machine: str = "B", workers: dict | None = None) -> MemoryPlan:
    """B's plan: ``partitions`` resident at ``precision`` from ``sources`` (partition -> source), plus working memory
    for ``canvas``, beside the ``workers`` B already holds (:func:`counted_workers`). ``options`` lists the other
    precisions/residencies of the same files that would fit."""
    avail, where = available_memory(device, limit_bytes)
    reserved, held = counted_workers(workers, where)
    comps = [transformer_bytes(sources[p], precision, dtype, device, p) for p in partitions]
    first = sources[partitions[0]]
    working = working_bytes_b(comfy_dit.model_config(first), resolve_precision(precision, first), dtype, canvas, device=device)
    residency = "both partitions" if len(partitions) > 1 else f"{partitions[0]} only, swapping"
    label = f"{comps[0].precision}, {residency}"
    plan = MemoryPlan(machine, label, comps, working, avail, where, int(avail * margin_fraction()), tuple(canvas),
                      held_elsewhere=held, reserved=reserved)
    if with_options and not plan.fits:
        plan.options = fitting_options_b(sources, dtype, device, canvas, avail - sum(reserved.values()),
                                         plan.margin_bytes, exclude=label)
    if not plan.fits and reserved:  # the way out a second worker has: the one B holds
        plan.advice = [f"set actor_name to {', '.join(k.removeprefix('worker ') for k in reserved)}, which B holds"]
    return plan


def choose_b_plan(sources: dict[str, formats.TransformerSource], partition: str, precision: str = "auto",
                  residency: str = "auto", dtype: str = "bfloat16", device: str = "cpu", canvas=DEFAULT_CANVAS,
                  limit_bytes: int | None = None, allow_swap: bool = True, machine: str = "B",
                  workers: dict | None = None) -> MemoryPlan:
    """The plan B loads by (unchecked): both partitions when ``residency`` is ``both``, or ``auto`` and they fit;
    else ``partition`` alone (requests for the other swap it). B's loader and ``remote_worker preflight`` share it."""
    other = next((p for p in PARTITIONS if p != partition and p in sources), None)
    if residency != "one" and other is not None and allow_swap:
        both = plan_b(sources, (partition, other), precision, dtype, device, canvas, limit_bytes, machine=machine,
                      workers=workers)
        if both.fits or residency == "both":
            return both
    return plan_b(sources, (partition,), precision, dtype, device, canvas, limit_bytes, machine=machine,
                  workers=workers)


def fitting_options_b(sources, dtype, device, canvas, avail, margin, exclude="") -> list[tuple[str, int]]:
    gguf = all(s.kind == "gguf" for s in sources.values())
    stored = all(s.variant for s in sources.values())
    precisions = ("gguf",) if gguf else ("auto", "bf16") if stored else ("bf16", "fp8")
    both = tuple(p for p in PARTITIONS if p in sources)
    out = []
    for prec in precisions:
        for parts in ((both,) if len(both) > 1 else ()) + ((both[:1],) if both else ()):
            try:
                p = plan_b(sources, parts, prec, dtype, device, canvas, limit_bytes=avail, with_options=False)
            except (formats.FormatError, MemoryPlanError):
                continue
            if p.label != exclude and p.need_bytes <= avail - margin:
                name = p.components[0].precision
                label = f"{name} for both" if len(parts) > 1 else f"{name} for one partition (swapping)"
                out.append((label, p.need_bytes))
    return out


# ---------------------------------------------------------------------------------------------------- A side
def _class_of(folder: pathlib.Path):
    """The model class a component folder's config names (diffusers ``_class_name`` or transformers
    ``architectures``), for its ``_keep_in_fp32_modules``; ``None`` when it cannot be imported."""
    cfg = json.loads((folder / "config.json").read_text())
    name = cfg.get("_class_name") or (cfg.get("architectures") or [None])[0]
    for lib in ("diffusers", "transformers"):
        try:
            mod = __import__(lib)
            cls = getattr(mod, name, None)
            if cls is not None:
                return cls
        except Exception:  # noqa: BLE001
            continue
    return None


def folder_bytes(folder: pathlib.Path, dtype: str, exclude: tuple[str, ...] = ()) -> ComponentPlan:
    """Resident bytes of a diffusers/transformers component folder loaded at ``dtype``, from its headers (tensors
    whose names start with an ``exclude`` prefix are not counted: freed after loading)."""
    cls = _class_of(folder)
    size = DTYPE_BYTES[dtype]
    total, n = 0, 0
    for f in sorted(folder.glob("*.safetensors")):
        tensors, _ = formats.read_safetensors_header(f)
        for name, t in tensors.items():
            if exclude and name.startswith(exclude):
                continue
            n += 1
            if t.dtype not in ("F32", "F16", "BF16", "F64"):
                total += t.nbytes
            else:
                total += (4 if (cls is not None and keep_fp32(cls, name)) else size) * t.numel
    return ComponentPlan(folder.name, dtype, total, 0, f"{n} tensors")


def default_canvas(model_dir: str | os.PathLike | None) -> tuple[int, int, int]:
    """The canvas a checkpoint's t2va default produces (its index's ``canvas_short_edge`` x
    ``canvas_max_pixels / short edge``, 124 frames): 768x1344 for the release, 64x128 for the tiny model."""
    try:
        cfg = json.loads((pathlib.Path(os.path.expanduser(str(model_dir))) / "modular_model_index.json").read_text())
        short, pixels = int(cfg["canvas_short_edge"]), int(cfg["canvas_max_pixels"])
        return short, pixels // short, DEFAULT_CANVAS[2]
    except Exception:  # noqa: BLE001 - no folder or an index without canvas configs: the release's default
        return DEFAULT_CANVAS


def working_bytes_a(dtype: str, canvas=DEFAULT_CANVAS, device: str = "cpu", vae_channels: int = 128) -> int:
    """Estimate of A's decode memory at ``canvas``: the decoded video in fp32 twice (VAE output and the frames handed
    on), one 17-frame clip of VAE activations at the VAE's full-resolution width (``vae_channels``, 128 for the
    release), and 1 GiB of slack on a GPU."""
    h, w, f = canvas
    return (2 * f * h * w * 3 * 4 + 17 * h * w * vae_channels * DTYPE_BYTES[dtype]
            + (GiB if device.startswith("cuda") else 0))


def part_bytes(src: comfy_files.PartSource, dtype: str) -> ComponentPlan:
    """Resident bytes of an A part loaded from a single file at ``dtype`` (quantised layers dequantised, the class's
    fp32 modules fp32), from its config and header (the model built on the meta device)."""
    model = comfy_files.skeleton(src.component, src.config(), src.tensors)
    params = comfy_files.resident_params(src, model)
    size = DTYPE_BYTES[dtype]
    total = sum((4 if keep_fp32(type(model), n) else size) * p.numel() for n, p in params.items())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    what = f"{src.path.name} ({src.variant or 'plain'}" + (", dequantised)" if src.variant else ")")
    return ComponentPlan(src.component, dtype, total, 0, what)


def plan_a(model_dir: str | os.PathLike, components: tuple[str, ...], dtype: str = "bfloat16", device: str = "cpu",
           canvas=None, limit_bytes: int | None = None, parts: dict | None = None,
           held_elsewhere: dict | None = None) -> MemoryPlan:
    """A's plan: the text encoder and VAEs of the diffusers folder (or, for those in ``parts``, of their single
    files) at ``dtype`` plus decode working memory for ``canvas`` (default: the checkpoint's own default canvas).
    ``held_elsewhere``: what other holders on A have (the host's figure: ComfyUI's own loaded models), counted besides
    the free memory: a plan that does not fit says what freeing them gives and the other ways out (:func:`a_advice`)."""
    root = pathlib.Path(os.path.expanduser(str(model_dir)))
    parts = parts or {}
    canvas = tuple(canvas) if canvas else default_canvas(root)
    avail, where = available_memory(device, limit_bytes)
    comps = [part_bytes(parts[c], dtype) if c in parts else folder_bytes(root / c, dtype) for c in components
             if c in parts or (root / c / "config.json").is_file()]
    try:
        vae_cfg = parts["vae"].config() if "vae" in parts else json.loads((root / "vae" / "config.json").read_text())
        channels = int(vae_cfg["block_out_channels"][0])
    except Exception:  # noqa: BLE001
        channels = 128
    plan = MemoryPlan("A", dtype, comps, working_bytes_a(dtype, canvas, device, channels), avail, where,
                      int(avail * margin_fraction()), canvas, held_elsewhere=dict(held_elsewhere or {}))
    if not plan.fits and dtype == "float32":
        alt = plan_a(root, components, "bfloat16", device, canvas, avail, parts)
        if alt.need_bytes <= plan.usable_bytes:
            plan.options = [("bfloat16", alt.need_bytes)]
    if not plan.fits:
        plan.advice = a_advice(plan, "text_encoder" in parts)
    return plan


#: the text encoder, bf16, at the released size (the README's plan arithmetic): the diffusers folder's, Comfy-Org's file
RELEASED_TEXT_ENCODER_BYTES = {"folder": int(62.1 * 2**30), "comfy_org_file": int(48.0 * 2**30)}


def a_advice(plan: MemoryPlan, text_encoder_from_file: bool) -> list[str]:
    """The ways out of an A plan that does not fit, with figures: freeing each other holder (ComfyUI's models: its
    Unload models button or ``POST /free``; A's DiT rank: ``parallel`` off), a smaller text-encoder file."""
    short, out = plan.need_bytes - plan.usable_bytes, []
    for name, held in ((n, h) for n, h in plan.held_elsewhere.items() if h > 0):
        how = ("press ComfyUI's Unload models (POST /free {\"unload_models\": true})" if "ComfyUI" in name else
               "set H3RemoteDiT.parallel to off (A's DiT rank leaves A)" if "rank" in name else f"free {name}")
        out.append(f"{how}: frees {human(held)}, " + ("then it fits" if held >= short else
                                                       f"still {human(short - held)} short"))
    if not text_encoder_from_file:
        saved = RELEASED_TEXT_ENCODER_BYTES["folder"] - RELEASED_TEXT_ENCODER_BYTES["comfy_org_file"]
        out.append("a smaller text-encoder file: H3LoadEncoders.text_encoder = Comfy-Org's qwen3vl_32b_minimax_h3_*"
                   f" (50 layers: {human(saved)} less than the folder's at bf16, released size)")
    if not any("rank" in n for n in plan.held_elsewhere):
        out.append("parallel off on H3RemoteDiT, so no DiT rank shares A's memory")
    return out


#: the video VAE's modules a decode never uses; B frees them after loading (its split-decode share only decodes)
VAE_ENCODER_PREFIXES = ("encoder.", "quant_conv.")


def plan_b_decoder(base: MemoryPlan, model_dir: str | os.PathLike, dtype: str = "bfloat16",
                   device: str = "cpu") -> MemoryPlan | None:
    """B's plan with the video VAE's decoder added (split decode), checked by the caller with ``fits``: ``base``
    (B's transformer plan) + the VAE at ``dtype`` without its encoder + decode working memory at ``base``'s canvas.
    B decodes its share between two denoises (one queue), so working memory is the larger of the two, not the sum.
    ``None`` when the model folder has no ``vae/``."""
    folder = pathlib.Path(os.path.expanduser(str(model_dir))) / "vae"
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):  # shipped configs: no weights
        return None
    full = folder_bytes(folder, dtype).bytes
    kept = folder_bytes(folder, dtype, exclude=VAE_ENCODER_PREFIXES)
    comp = ComponentPlan("vae decoder", dtype, kept.bytes, full - kept.bytes,
                         f"video VAE without its encoder ({kept.detail}); loads whole first")
    try:
        channels = int(json.loads((folder / "config.json").read_text())["block_out_channels"][0])
    except Exception:  # noqa: BLE001
        channels = 128
    working = max(base.working_bytes, working_bytes_a(dtype, base.canvas, device, channels))
    return dataclasses.replace(base, label=f"{base.label} + video VAE decoder", components=[*base.components, comp],
                               working_bytes=working, options=[])
