"""The B side: the resident MiniMax-H3 DiT running every ``denoise.*`` block of diffusers, one request at a time.

B loads the transformer partitions (``transformer`` for t2va/fl2va, ``transformer_ref`` for ref2va) plus the two
schedulers. Each partition comes from the diffusers folder, a published single-file ``.safetensors`` or an unpruned
``.gguf`` (:mod:`comfy_h3_nodes.engine.formats` tells which, from headers only), and is stored at a precision: the load
dtype (``bf16``), ``fp8`` (diffusers' layerwise casting: fp8 storage, compute at the load dtype) or as stored
(``gguf``). Before anything loads, the memory plan (:mod:`comfy_h3_nodes.engine.memory_plan`) decides the residency:
both partitions when they fit next to the working memory (a ref2va after a t2va then loads nothing), else one at a
time, where a request for the other swaps it and the swap is recorded (and reported) as a load; a plan where not even
one fits is refused with the numbers and the options that fit. The schedulers are stateful: ``denoise`` holds a lock
for the whole request. When the plan still fits with it, B also holds the video VAE's decoder and decodes a share of a
request's clips from the latents it produced (``decode_share``; :mod:`comfy_h3_nodes.engine.split_decode`).

A FastH3 partition (:mod:`comfy_h3_nodes.engine.model.fasth3`) loads like any folder, then gets its VSA gates and the
VSA-H3 attention processors (:mod:`comfy_h3_nodes.engine.model.vsa`) on the kernel ``vsa_kernel`` names; its requests
must ask for the steps it was trained for, and run with its trained shifts.

Per-step reporting and cancellation are two small loop blocks inserted around diffusers' own ``denoiser`` and
``update`` loop blocks; they cost microseconds per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from diffusers import GGUFQuantizationConfig, MiniMaxH3Transformer3DModel
from diffusers.modular_pipelines import InputParam, ModularPipelineBlocks
from safetensors import safe_open

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.contract.configs import PARTITION_OF, PARTITIONS, SCHEDULERS
from comfy_h3_nodes.engine.contract.errors import DenoiseCancelled
from comfy_h3_nodes.engine.contract.timing import StepRecord
from comfy_h3_nodes.engine.model import (comfy_dit, fasth3, formats, memory_plan, parallel, preview, split,
                                        split_decode, vsa)
from comfy_h3_nodes.engine.model.quant import tensor_nbytes
from comfy_h3_nodes.engine.model.backends import apply_attention_backend, resolve_attention_backend
from comfy_h3_nodes.engine.model.folders import b_components, check_model_dir
from comfy_h3_nodes.engine.model.vsa_kernels import resolve_vsa_kernel
from comfy_h3_nodes.engine.process import maybe_profile

from .adapters import AdapterManager, AdapterSchedule, check_no_foreign_tensors
from .comfy_forward import ComfySamplerForwards
from .residency import Releasable


@dataclass
class StepMonitor:
    """Per-request step bookkeeping shared with the two loop hook blocks."""

    total: int = 0
    on_step: Callable[[StepRecord], None] | None = None
    should_cancel: Callable[[], bool] | None = None
    request_id: str = ""
    sync: Callable[[], None] | None = None  # CUDA: wait for the step's kernels, so step times are real
    #: in a DiT group: every rank's wish to stop, agreed (so all ranks stop before the same step)
    agree: Callable[[bool], bool] | None = None
    previewer: preview.Previewer | None = None  # live previews of the estimate, when A asked for them
    steps: list[StepRecord] = field(default_factory=list)
    _t0: float = 0.0

    def start(self, i: int) -> None:
        stop = self.should_cancel is not None and self.should_cancel()
        if self.agree is not None:
            stop = self.agree(stop)
        if stop:
            raise DenoiseCancelled(f"request {self.request_id} was cancelled before step {i + 1}/{self.total} on B")
        if self.sync is not None:  # the work queued before this step (the first: the noise, the layout) is not its
            self.sync()
        self._t0 = time.perf_counter()

    def end(self, i: int, block_state=None, components=None) -> None:
        if self.sync is not None:
            self.sync()
        seconds = time.perf_counter() - self._t0
        shown = None
        if self.previewer is not None and block_state is not None and self.previewer.due(i, self.total):
            shown = self._preview(i, seconds, block_state, components)
        rec = StepRecord(i, self.total, seconds, preview=shown)
        self.steps.append(rec)
        if self.on_step is not None:
            self.on_step(rec)

    def _preview(self, i: int, seconds: float, bs, components):
        timesteps = bs.timesteps
        sigma_next = 1.0 - float(timesteps[i + 1]) if i + 1 < len(timesteps) else 0.0  # t = 1 - sigma
        return self.previewer.make(
            i, self.total, bs.latents, bs.noise_pred, sigma_next, condition_rows=int(bs.num_condition_video_rows),
            grid=(int(bs.num_latent_frames), int(bs.latent_height), int(bs.latent_width)),
            patch=tuple(components.patch_size), step_s=seconds)


def on_device(inputs: dict, device: str) -> dict:
    """The wire's host tensors (lists of them too) on B's device: diffusers' denoise blocks move the latents and the
    layout there, not ``prompt_embeds``, which in one process come from a text encoder on the same device."""
    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(move(x) for x in v)
        return v
    return inputs if device == "cpu" else {k: move(v) for k, v in inputs.items()}


class MonitorSlot:
    """Holds the running request's monitor. Shared, never copied: ``init_pipeline`` deep-copies the blocks."""

    def __init__(self):
        self.monitor: StepMonitor | None = None

    def __deepcopy__(self, memo):
        return self


def _hook_block(kind: str, slot: MonitorSlot):
    """A diffusers loop block that calls the current request's monitor (``kind`` is ``start`` or ``end``)."""
    class H3StepHook(ModularPipelineBlocks):
        model_name = "minimax-h3"

        @property
        def description(self) -> str:
            return f"comfy-h3: step {kind} hook (progress events and cancellation between steps)."

        @property
        def inputs(self):  # the end hook reads what a preview needs (the loop's state holds them)
            if kind != "end":
                return []
            return [InputParam(name) for name in ("num_condition_video_rows", "num_latent_frames", "latent_height",
                                                  "latent_width")]

        @property
        def intermediate_outputs(self):
            return []

        def __call__(self, components, block_state, i, t):
            monitor = slot.monitor
            if monitor is not None:
                monitor.total = len(block_state.timesteps)
                if kind == "end":
                    monitor.end(i, block_state, components)
                else:
                    monitor.start(i)
            return components, block_state

    return H3StepHook()


@dataclass
class DenoiseResult:
    latents: wire.DenoisedLatents
    steps: list[StepRecord]
    compute_s: float
    swap_s: float = 0.0
    adapter_s: float = 0.0
    shift: float = 0.0
    audio_shift: float = 0.0
    profile_path: str | None = None
    notes: list = field(default_factory=list)  # more for the record's note (a benchmark's stand-in time)
    comm_s: float = 0.0  # in a DiT group: seconds inside the collectives (waiting for the slower rank included)
    parallel: dict = field(default_factory=dict)  # in a DiT group: rank, world, method, rows
    preview: dict = field(default_factory=dict)  # previews made: count, B seconds in all, bytes of the last, every
    reload_s: float = 0.0  # the weights were released (``BSide.release``): seconds this request spent reloading

    def schedule_note(self, adapters: tuple = ()) -> str:
        parts = [f"{len(self.steps)} forwards, shift {self.shift:g} (video) / {self.audio_shift:g} (audio)"]
        if adapters:
            parts.append("LoRA " + ", ".join(f"{os.path.basename(a.path)}x{a.weight:g}" for a in adapters)
                         + f" (switch {self.adapter_s * 1e3:.1f} ms)")
        if self.swap_s:
            parts.append(f"swapped partition in {self.swap_s:.2f} s")
        if self.profile_path:
            parts.append(f"profile {self.profile_path}")
        return "; ".join(parts + list(self.notes))


class BSide(ComfySamplerForwards, Releasable):
    """The resident DiT. ``denoise`` serves one request at a time.

    ``sources`` maps a partition to a ``.safetensors``/``.gguf`` file (or a diffusers folder) that replaces
    ``<model_dir>/<partition>/``; the folder still provides the schedulers and, when it has one, the transformer
    config. ``precision``: ``auto`` (the load dtype; as stored for GGUF), ``bf16``, ``fp8`` or ``gguf``.
    ``residency``: ``auto`` (both partitions when the plan fits them, else one), ``both`` (refused unless it fits) or
    ``one``. ``memory_limit_bytes`` replaces the measured free memory in the plan (tests; else
    ``H3_MEMORY_LIMIT_BYTES``); ``plan_canvas`` is the (height, width, frames) working memory is budgeted for (default:
    the checkpoint's default canvas, 1344x768x124 for the release); ``workers``: B's other workers, which the plan
    counts (:func:`memory_plan.counted_workers`; a dict, or a call that asks them at each plan)."""

    def __init__(self, model_dir: str | os.PathLike, partition: str = "transformer", dtype: str = "bfloat16",
                 attention_backend: str = "sdpa", device: str | None = None, allow_swap: bool = True,
                 path_check: Callable | None = None, precision: str = "auto", residency: str = "auto",
                 sources: dict | None = None, memory_limit_bytes: int | None = None,
                 plan_canvas: tuple | None = None, decoder: str = "auto", machine: str = "B",
                 vsa_kernel: str | None = None, workers: dict | None = None):
        # "A": a DiT rank on A's machine (parallel denoise), its plan says so; workers: B's others, its plan counts
        self.machine, self.workers = machine, workers
        self.attention_backend = resolve_attention_backend(attention_backend)
        self.device = split.pick_device(device)
        if precision == "bf16":
            dtype = "bfloat16"
        self.dtype = dtype
        self.allow_swap = allow_swap
        if residency not in ("auto", "both", "one"):
            raise ValueError(f"residency is {residency!r}; expected 'auto', 'both' or 'one'.")
        b_components(partition)  # validates the name
        sources = {k: v for k, v in (sources or {}).items() if v}
        for name, path in sources.items():
            b_components(name)
            if path_check is not None:
                path_check(path)
        from_folder = () if partition in sources else (partition,)
        self.model_dir = check_model_dir(model_dir, (*from_folder, *SCHEDULERS))
        self.sources: dict[str, formats.TransformerSource] = {}
        for name in PARTITIONS:
            if name in sources:
                self.sources[name] = formats.detect(sources[name], name, self.model_dir)
            elif (self.model_dir / name).is_dir() and any((self.model_dir / name).iterdir()):
                self.sources[name] = formats.detect(self.model_dir, name)
        for name, src in self.sources.items():
            if src.kind == "folder" and src.path != self.model_dir / name:
                raise formats.FormatError(f"{src.path} is a diffusers transformer folder outside {self.model_dir}: "
                                          f"put it there as {name}/, or give a single file.")
        tiles = {s.vsa.tile_size for s in self.sources.values() if s.vsa is not None}
        self.vsa_kernel = resolve_vsa_kernel(vsa_kernel, self.device, tiles) if tiles else None  # FastH3 only
        self.precision = memory_plan.resolve_precision(precision, self.sources[partition])
        self.memory_limit_bytes = memory_limit_bytes
        self.memory_plan = self._plan(partition, residency, memory_limit_bytes,
                                      tuple(plan_canvas) if plan_canvas else memory_plan.default_canvas(self.model_dir))
        #: set while the weights are released (``release``): what was resident, why, when, the bytes it held
        self.released: dict | None = None
        self.reloads = 0
        resident = tuple(c.name for c in self.memory_plan.components)
        self.residency = "both" if len(resident) > 1 else "one"
        self._lock = threading.RLock()  # denoise, release and their reload
        self._slot = MonitorSlot()
        self._preview_note = ""  # why a request asked for previews and got none
        self._pipes: dict[str, object] = {}
        self.load_records: list[split.LoadRecord] = []
        self._adapters: dict[str, AdapterManager] = {}
        self._comfy_lora: dict = {}  # ComfyUI's LoRA patches on each partition (:class:`ComfySamplerForwards`)
        self.path_check = path_check
        loaded = split.load_checked(self.model_dir, SCHEDULERS, dtype, self.device)
        self._host = loaded.host
        for name in resident:
            self._load_partition(name, "startup")
        self.load_records.extend(loaded.records)
        self.resident_partitions: list[str] = list(resident)
        self._activate(partition)
        self._load_decoder(decoder)

    # ------------------------------------------------------------------------------------------------ plan
    def _plan(self, partition: str, residency: str, limit: int | None, canvas: tuple) -> memory_plan.MemoryPlan:
        """The plan B loads by, checked before anything loads (:func:`memory_plan.choose_b_plan`)."""
        return memory_plan.choose_b_plan(self.sources, partition, self.precision, residency, self.dtype, self.device,
                                         canvas, limit, self.allow_swap, self.machine, self.others()).check()

    def memory_report(self) -> dict:
        """The plan B loaded by and what it really holds (health's ``memory_plan``)."""
        report = self.memory_plan.to_dict()
        report["precision"] = self.precision
        report["residency"] = self.residency
        report["resident_partitions"] = list(self.resident_partitions)
        report["measured_bytes"] = self.resident_bytes()
        report["sources"] = {p: {"kind": s.kind, "path": str(s.path), **({"vsa": s.vsa.to_dict()} if s.vsa else {})}
                             for p, s in self.sources.items()}
        report["video_vae"] = {**self.decoder_info(),
                               "plan": self.decoder_plan.to_dict() if self.decoder_plan is not None else None}
        return report

    # ------------------------------------------------------------------------------------------------ decode share
    def _load_decoder(self, decoder: str) -> None:
        """The video VAE's decoder for split decode (:mod:`comfy_h3_nodes.engine.split_decode`): loaded when
        ``decoder`` is ``auto`` and B's memory plan with it still fits (:func:`memory_plan.plan_b_decoder`), at B's
        load dtype; its encoder is freed. ``off`` never loads it. ``decoder_note`` says which and why."""
        if decoder not in ("auto", "off"):
            raise ValueError(f"decoder is {decoder!r}; expected 'auto' or 'off'.")
        self.vae, self.decoder_plan = None, None
        if decoder == "off":
            self.decoder_note = "not loaded: B was started with decoder 'off'"
            return
        self.decoder_plan = memory_plan.plan_b_decoder(self.memory_plan, self.model_dir, self.dtype, self.device)
        if self.decoder_plan is None:
            self.decoder_note = f"not loaded: {self.model_dir} has no vae/ weights"
            return
        if not self.decoder_plan.fits:
            self.decoder_note = "not loaded, it does not fit: " + self.decoder_plan.summary()
            return
        loaded = split.load_checked(self.model_dir, ("vae",), self.dtype, self.device, host=self._host)
        self.load_records.extend(loaded.records)
        self.vae = self._host.vae
        self.vae.encoder, self.vae.quant_conv = None, None  # a decode share never encodes
        self.vae_fingerprint = split_decode.vae_fingerprint(self.model_dir / "vae")
        self.decoder_note = "resident: " + self.decoder_plan.summary()

    def decoder_info(self) -> dict:
        """Whether B can take a split-decode share, and with what (A compares dtype and model before splitting)."""
        info = {"resident": self.vae is not None, "dtype": self.dtype, "model_dir": str(self.model_dir),
                "note": self.decoder_note}
        if self.vae is not None:
            info.update(fingerprint=self.vae_fingerprint, **split_decode.geometry(self.vae))
        return info

    def decode_share(self, latents: wire.DenoisedLatents, start: int, stop: int,
                     should_cancel: Callable[[], bool] | None = None, first_tile: int = 0) -> split_decode.Share:
        """Clips ``[start, stop)`` of the request's video, decoded with the real VAE (``split_decode``)."""
        if self.vae is None:
            raise RuntimeError(f"B holds no video VAE decoder ({self.decoder_note}).")
        return split_decode.decode_share(self.vae, latents.latents.to_torch(), start, stop, should_cancel,
                                         first_tile)

    def resident_bytes(self) -> dict[str, int]:
        """B's own accounting: bytes of the parameters and buffers of each resident transformer partition."""
        out = {}
        for name in self.resident_partitions:
            model = getattr(self._host, name)
            out[name] = int(sum(tensor_nbytes(t) for t in (*model.parameters(), *model.buffers())))
        return out

    # ------------------------------------------------------------------------------------------------ partitions
    def _load_partition(self, partition: str, reason: str) -> None:
        """Load one partition from its source at B's precision into the host pipeline, and record the load."""
        t0 = time.perf_counter()
        src = self.sources[partition]
        if src.kind == "folder":
            split.load_checked(self.model_dir, (partition,), self.dtype, self.device, reason=reason, host=self._host)
            model = getattr(self._host, partition)
            if src.vsa is not None:  # FastH3: its gates loaded by name, VSA-H3 on every main block
                vsa.install(model, src.vsa, self.vsa_kernel, src.path)
            check_no_foreign_tensors(self.model_dir, partition, model)
        else:
            model = load_transformer_file(src, self.dtype, self.device, self.precision)
            self._host.update_components(**{partition: model})
        if self.precision == "fp8":
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn,
                                           compute_dtype=split.torch_dtype(self.dtype))
            if self.device.startswith("cuda"):  # the bf16 blocks the cast freed go back to the shared pool
                torch.cuda.empty_cache()
        apply_attention_backend(model, self.attention_backend)
        label = self.dtype if self.precision == "bf16" else f"{self.precision}/{self.dtype}"
        self.load_records.append(split.LoadRecord(partition, time.perf_counter() - t0, label, reason))

    def _activate(self, partition: str) -> None:
        self.partition = partition
        self.text_dim = int(getattr(self._host, partition).config.text_dim)
        if partition not in self._adapters:
            self._adapters[partition] = AdapterManager(self._host, partition, self.path_check)
        self.adapters = self._adapters[partition]

    def _swap_to(self, partition: str) -> float:
        """Unload the resident partition and load ``partition``; returns the seconds it took."""
        if not self.allow_swap:
            raise RuntimeError(
                f"B holds the {self.partition!r} partition and was started without swapping; the request needs "
                f"{partition!r}: start B with --partition {partition}."
            )
        t0 = time.perf_counter()
        if partition not in self.sources:
            check_model_dir(self.model_dir, (partition,))  # raises, naming the missing folder
        old = self.partition
        setattr(self._host, old, None)
        self._adapters.pop(old, None)  # adapters lived on the old one
        self._pipes.clear()
        gc.collect()  # diffusers' hooks make cycles: the old partition is freed now, before the next one loads
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        self._load_partition(partition, f"swap {old} -> {partition}")
        self.resident_partitions = [partition]
        self._activate(partition)
        return time.perf_counter() - t0

    def _pipe(self, workflow: str):
        if workflow not in self._pipes:
            blocks = split.split_workflow(workflow)["denoise"]
            loop = next(b for b in blocks.sub_blocks.values() if hasattr(b, "loop_step"))
            subs = dict(loop.sub_blocks)
            loop.sub_blocks.clear()
            loop.sub_blocks["h3_step_start"] = _hook_block("start", self._slot)
            loop.sub_blocks.update(subs)
            loop.sub_blocks["h3_step_end"] = _hook_block("end", self._slot)
            self._pipes[workflow] = split.make_group_pipeline(blocks, self.model_dir, self._host,
                                                              b_components(PARTITION_OF[workflow]))
        return self._pipes[workflow]

    def weights(self) -> dict[str, dict]:
        """Per partition B can run: the file it loads from (None: the model folder) and what it runs as
        (:func:`memory_plan.runs_as`: a quantised file's layers as stored, fp8 storage, a GGUF, or the dtype)."""
        return {p: {"file": None if src.kind == "folder" else str(src.path),
                    "runs": memory_plan.runs_as(src, self.precision, self.dtype)} for p, src in self.sources.items()}

    def resident(self) -> dict[str, str]:
        names = (*self.resident_partitions, *SCHEDULERS, *(("vae",) if self.vae is not None else ()))
        return {n: type(getattr(self._host, n)).__name__ for n in names}

    # ------------------------------------------------------------------------------------------------ denoise
    def denoise(self, payload: wire.EncodedRequest, call: wire.DenoiseCall,
                on_step: Callable[[StepRecord], None] | None = None,
                should_cancel: Callable[[], bool] | None = None, validated: bool = False,
                ready_timeout: float = 600.0) -> DenoiseResult:
        """Denoise one run (``call``: its seed, steps and adapters) of an encoded request; ``validated=True`` when the
        caller already validated both (the actor does, to time it apart from the transfer). With ``call.parallel``
        this process is one rank of a DiT group (:mod:`comfy_h3_nodes.engine.model.parallel`): it waits (at most
        ``ready_timeout``) until every rank holds the payload and its model, runs the same blocks with the same seed
        under diffusers' context parallelism, and stops when any rank stops."""
        if not validated:
            call.validate(payload)
            payload.validate(text_dim=self.text_dim)
        trained = self.trained_schedule(PARTITION_OF[payload.workflow])
        if trained is not None:  # refused before anything runs (or swaps)
            trained.check_steps(call.num_inference_steps, str(self.sources[PARTITION_OF[payload.workflow]].path))
        with self._lock:
            reload_s = self.reload_if_released()  # B's model was released on request: loaded again, recorded
            swap_s = 0.0
            needed = PARTITION_OF[payload.workflow]
            if needed not in self.resident_partitions:
                swap_s = self._swap_to(needed)
            elif needed != self.partition:
                self._activate(needed)  # both resident: nothing loads
            pipe = self._pipe(payload.workflow)
            adapter_s, schedule = self.adapters.activate(tuple((a.path, a.weight) for a in call.adapters))
            shifts = self._apply_schedule(pipe, self._with_trained(schedule, needed))
            state = getattr(getattr(self._host, needed), "h3_vsa", None)
            if state is not None:
                state.take_stats()
            cuda = self.device.startswith("cuda")
            self._preview_note = ""
            monitor = StepMonitor(total=call.num_inference_steps, on_step=on_step, should_cancel=should_cancel,
                                  request_id=call.request_id, sync=torch.cuda.synchronize if cuda else None,
                                  previewer=self._previewer(call))
            clock = parallel.CommClock()
            grouped = self._grouped(call, monitor, clock, ready_timeout)
            self._slot.monitor = monitor
            t0 = time.perf_counter()
            self.last_profile = None
            try:
                generator = torch.Generator("cpu").manual_seed(call.seed)
                with grouped, maybe_profile(f"denoise_{call.request_id}", cuda) as prof:
                    out = pipe(**on_device(payload.pipeline_inputs(), self.device),
                               num_inference_steps=call.num_inference_steps,
                               generator=generator, output=["latents", "audio_latents"])
                self.last_profile = prof.path
            except DenoiseCancelled:
                raise
            except Exception:
                if call.parallel is not None:  # the peers' next collective fails at once, not after the timeout
                    parallel.leave()
                raise
            finally:
                self._slot.monitor = None
            if cuda:  # the blocks after the loop (unpacking the latents) are queued: wait for them, then read
                torch.cuda.synchronize()
            compute_s = time.perf_counter() - t0
        result = wire.DenoisedLatents(
            request_id=call.request_id,
            workflow=payload.workflow,
            height=payload.height,
            width=payload.width,
            num_frames=payload.num_frames,
            latents=wire.WireTensor.from_torch(out["latents"].float()),
            audio_latents=wire.WireTensor.from_torch(out["audio_latents"].float()),
        )
        res = DenoiseResult(result.validate(), monitor.steps, compute_s, swap_s, adapter_s, *shifts)
        res.profile_path = self.last_profile
        if reload_s:
            res.reload_s = reload_s
            res.notes.append(f"reloaded the model after a release in {reload_s:.2f} s")
        if self._preview_note:
            res.notes.append(self._preview_note)
        if monitor.previewer is not None and monitor.previewer.cost_s:
            pv = monitor.previewer
            res.preview = {"count": len(pv.cost_s), "cost_s": round(sum(pv.cost_s), 6), "every": pv.every,
                           "bytes": len(pv.latest.jpeg), "size": [pv.latest.width, pv.latest.height],
                           "source": pv.spec.source}
        if call.parallel is not None:
            res.comm_s = clock.seconds
            rows = clock.rows
            res.parallel = {"rank": call.parallel.rank, "world": call.parallel.world, "method": call.parallel.method,
                            "group": call.parallel.group_id, "collectives": clock.calls, "rows": rows,
                            "uneven": rows % call.parallel.world != 0}
        if state is not None:
            res.notes.append(state.note())
        return res

    def _previewer(self, call: wire.DenoiseCall) -> preview.Previewer | None:
        """Previews when A asked for them, made by one rank only (rank 0 of a DiT group: the one A follows); factors
        for another channel count are refused before any step runs."""
        if call.preview is None or (call.parallel is not None and call.parallel.rank != 0):
            return None
        config = getattr(getattr(self._host, self.partition), "config", None)
        try:
            call.preview.validate(latent_channels=getattr(config, "in_channels", None))
        except wire.WireError as exc:  # a preview never stops a denoise: the readout says why there is none
            self._preview_note = f"no previews: {exc}"
            return None
        return preview.Previewer(call.preview, call.request_id)

    def _grouped(self, call: wire.DenoiseCall, monitor: StepMonitor, clock, ready_timeout: float):
        """For a rank of a DiT group: check this process is in the call's group, wait for every rank to be ready,
        agree on stopping each step, and parallelise the partition for this request (a no-op context otherwise)."""
        if call.parallel is None:
            return contextlib.nullcontext()
        group = parallel.member(call.parallel, f"request {call.request_id}")
        parallel.barrier(group, ready_timeout)
        monitor.agree = lambda stop: parallel.agree_stop(stop, group)
        return parallel.applied(getattr(self._host, self.partition), group, call.parallel.method, clock)

    # ------------------------------------------------------------------------------------------------ FastH3
    def trained_schedule(self, partition: str) -> fasth3.VSASettings | None:
        """The VSA settings (and trained schedule) of a FastH3 partition; None for a dense one."""
        src = self.sources.get(partition)
        return src.vsa if src is not None else None

    def trained_steps(self) -> dict[str, int]:
        """Sigma points each FastH3 partition was trained for (health: clients refuse other counts early)."""
        return {p: s.vsa.steps for p, s in self.sources.items() if s.vsa is not None}

    def vsa_info(self) -> dict:
        return {p: {**s.vsa.to_dict(), "kernel": self.vsa_kernel.label} for p, s in self.sources.items()
                if s.vsa is not None}

    def _with_trained(self, schedule: AdapterSchedule, partition: str) -> AdapterSchedule:
        """A FastH3 partition runs its trained shifts; an adapter asking for others is refused."""
        trained = self.trained_schedule(partition)
        if trained is None:
            return schedule
        for key in ("shift", "audio_shift"):
            asked = getattr(schedule, key)
            if asked is not None and asked != getattr(trained, key):
                raise fasth3.TrainedScheduleError(
                    f"the active adapters ask for {key} {asked:g}, and {self.sources[partition].path} was trained "
                    f"with {getattr(trained, key):g}: drop the adapter's {key} (its sidecar .json) for FastH3.")
        return dataclasses.replace(schedule, shift=trained.shift, audio_shift=trained.audio_shift)

    def _apply_schedule(self, pipe, schedule: AdapterSchedule) -> tuple[float, float]:
        """Schedulers for this request: the checkpoint's own, or fresh ones with the adapter's shifts."""
        out = []
        for name, override in (("scheduler", schedule.shift), ("audio_scheduler", schedule.audio_shift)):
            base = getattr(self._host, name)
            sched = base if override is None else type(base).from_config(base.config, shift=override)
            pipe.update_components(**{name: sched})
            out.append(float(sched.config.shift))
        return out[0], out[1]


# ---------------------------------------------------------------------------------------------------- file loading
def load_transformer_file(src: formats.TransformerSource, dtype: str, device: str, precision: str = "bf16"):
    """A transformer partition from a published single-file ``.safetensors`` or a ``.gguf``, through diffusers'
    ``from_single_file`` with the config found offline (the user's folder, or the one the pack ships); Comfy-Org's
    pruned and quantised files through :func:`comfy_dit.load` (their quantised layers as stored when ``precision`` is
    ``stored``, else dequantised to ``dtype``).

    diffusers 0.42.1's ``from_single_file(torch_dtype=bf16)`` casts *every* module to bf16, the ones the class keeps
    in fp32 (patch projections, timestep MLP, output heads) and the computed ``rope.inv_freq`` buffer included, unlike
    ``from_pretrained``. Those are put back in fp32 from the file (the release stores them fp32), so a single-file
    run equals the folder run bit for bit. GGUF keeps them fp32 itself (its quantizer honours the list)."""
    torch_dtype = split.torch_dtype(dtype)
    if src.comfy:
        try:
            return comfy_dit.load(src, torch_dtype, device, stored=precision == "stored")
        except formats.FormatError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with the file named
            raise formats.FormatError(f"{src.path} failed to load as a {src.subfolder}: {type(exc).__name__}: "
                                      f"{exc}") from exc
    kwargs = {"config": str(src.config_root), "subfolder": src.subfolder, "local_files_only": True,
              "torch_dtype": torch_dtype}
    if device != "cpu":
        kwargs["device"] = device
    if src.kind == "gguf":
        kwargs["quantization_config"] = GGUFQuantizationConfig(compute_dtype=torch_dtype)
    try:
        model = MiniMaxH3Transformer3DModel.from_single_file(str(src.path), **kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised with the file named
        raise formats.FormatError(f"{src.path} failed to load as a {src.subfolder}: {type(exc).__name__}: {exc}") \
            from exc
    if src.kind == "single_file" and torch_dtype != torch.float32:
        _restore_fp32_modules(model, src, device)
    return model.eval()


def _restore_fp32_modules(model, src: formats.TransformerSource, device: str) -> None:
    cls = type(model)
    names = [n for n, _ in model.named_parameters() if memory_plan.keep_fp32(cls, n)]
    with safe_open(str(src.path), framework="pt", device="cpu") as fh:
        for name in names:
            param = model.get_parameter(name)
            value = fh.get_tensor(formats.diffusers_to_published_name(name)).to(torch.float32)
            param.data = value.to(param.device)
    rope = getattr(model, "rope", None)
    if rope is not None and hasattr(rope, "inv_freq"):
        fresh = type(rope)(model.config.rope_freq_dim, model.config.rope_theta)  # the buffer as built, fp32
        rope.inv_freq = fresh.inv_freq.to(rope.inv_freq.device)
