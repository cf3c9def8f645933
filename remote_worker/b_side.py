"""The B side: the resident MiniMax-H3 DiT running every ``denoise.*`` block of diffusers, one request at a time.

B loads only one transformer partition (``transformer`` for t2va/fl2va, ``transformer_ref`` for ref2va) plus the two
schedulers. Both partitions together do not fit one Spark next to activations, so B holds one at a time; a request
for the other swaps it and the swap is recorded (and reported) as a load. The schedulers are stateful: ``denoise``
holds a lock for the whole request.

Per-step reporting and cancellation are two small loop blocks inserted around diffusers' own ``denoiser`` and
``update`` loop blocks; they cost microseconds per step.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from comfy_h3_nodes.engine import split, wire
from comfy_h3_nodes.engine.backends import apply_attention_backend, resolve_attention_backend
from comfy_h3_nodes.engine.profiling import maybe_profile

from .adapters import AdapterManager, AdapterSchedule, check_no_foreign_tensors


class DenoiseCancelled(RuntimeError):
    """B stopped a request between two steps because its caller cancelled it."""


@dataclass
class StepRecord:
    index: int
    total: int
    seconds: float


@dataclass
class StepMonitor:
    """Per-request step bookkeeping shared with the two loop hook blocks."""

    total: int = 0
    on_step: Callable[[StepRecord], None] | None = None
    should_cancel: Callable[[], bool] | None = None
    request_id: str = ""
    sync: Callable[[], None] | None = None  # CUDA: wait for the step's kernels, so step times are real
    steps: list[StepRecord] = field(default_factory=list)
    _t0: float = 0.0

    def start(self, i: int) -> None:
        if self.should_cancel is not None and self.should_cancel():
            raise DenoiseCancelled(f"request {self.request_id} was cancelled before step {i + 1}/{self.total} on B")
        self._t0 = time.perf_counter()

    def end(self, i: int) -> None:
        if self.sync is not None:
            self.sync()
        rec = StepRecord(i, self.total, time.perf_counter() - self._t0)
        self.steps.append(rec)
        if self.on_step is not None:
            self.on_step(rec)


class MonitorSlot:
    """Holds the running request's monitor. Shared, never copied: ``init_pipeline`` deep-copies the blocks."""

    def __init__(self):
        self.monitor: StepMonitor | None = None

    def __deepcopy__(self, memo):
        return self


def _hook_block(kind: str, slot: MonitorSlot):
    """A diffusers loop block that calls the current request's monitor (``kind`` is ``start`` or ``end``)."""
    from diffusers.modular_pipelines import ModularPipelineBlocks

    class H3StepHook(ModularPipelineBlocks):
        model_name = "minimax-h3"

        @property
        def description(self) -> str:
            return f"comfy-h3: step {kind} hook (progress events and cancellation between steps)."

        @property
        def inputs(self):
            return []

        @property
        def intermediate_outputs(self):
            return []

        def __call__(self, components, block_state, i, t):
            monitor = slot.monitor
            if monitor is not None:
                monitor.total = len(block_state.timesteps)
                getattr(monitor, kind)(i)
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

    def schedule_note(self, adapters: tuple = ()) -> str:
        parts = [f"{len(self.steps)} forwards, shift {self.shift:g} (video) / {self.audio_shift:g} (audio)"]
        if adapters:
            parts.append("LoRA " + ", ".join(f"{os.path.basename(a.path)}x{a.weight:g}" for a in adapters)
                         + f" (switch {self.adapter_s * 1e3:.1f} ms)")
        if self.swap_s:
            parts.append(f"swapped partition in {self.swap_s:.2f} s")
        if self.profile_path:
            parts.append(f"profile {self.profile_path}")
        return "; ".join(parts)


class BSide:
    """The resident DiT. ``denoise`` serves one request at a time."""

    def __init__(self, model_dir: str | os.PathLike, partition: str = "transformer", dtype: str = "bfloat16",
                 attention_backend: str = "sdpa", device: str | None = None, allow_swap: bool = True,
                 path_check: Callable | None = None):
        import torch

        self._torch = torch
        self.attention_backend = resolve_attention_backend(attention_backend)
        self.device = split.pick_device(device)
        self.dtype = dtype
        self.allow_swap = allow_swap
        self.model_dir = split.check_model_dir(model_dir, split.b_components(partition))
        self._lock = threading.Lock()
        self._slot = MonitorSlot()
        self._pipes: dict[str, object] = {}
        self.load_records: list[split.LoadRecord] = []
        loaded = split.load_checked(self.model_dir, split.b_components(partition), dtype, self.device)
        self._host = loaded.host
        self.load_records.extend(loaded.records)
        self.partition = partition
        apply_attention_backend(getattr(self._host, partition), self.attention_backend)
        self.text_dim = int(getattr(self._host, partition).config.text_dim)
        self.path_check = path_check
        self.adapters = AdapterManager(self._host, partition, path_check)
        check_no_foreign_tensors(self.model_dir, partition, getattr(self._host, partition))

    # ------------------------------------------------------------------------------------------------ partitions
    def _swap_to(self, partition: str) -> float:
        """Unload the resident partition and load ``partition``; returns the seconds it took."""
        if not self.allow_swap:
            raise RuntimeError(
                f"B holds the {self.partition!r} partition and was started without swapping; the request needs "
                f"{partition!r}: start B with --partition {partition}."
            )
        t0 = time.perf_counter()
        split.check_model_dir(self.model_dir, (partition,))
        old = self.partition
        setattr(self._host, old, None)
        self._pipes.clear()
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()
        loaded = split.load_checked(self.model_dir, (partition,), self.dtype, self.device,
                                    reason=f"swap {old} -> {partition}", host=self._host)
        self.load_records.extend(loaded.records)
        check_no_foreign_tensors(self.model_dir, partition, getattr(self._host, partition))
        apply_attention_backend(getattr(self._host, partition), self.attention_backend)
        self.partition = partition
        self.text_dim = int(getattr(self._host, partition).config.text_dim)
        self.adapters = AdapterManager(self._host, partition, self.path_check)  # adapters lived on the old one
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
                                                              split.b_components(self.partition))
        return self._pipes[workflow]

    def resident(self) -> dict[str, str]:
        return {n: type(getattr(self._host, n)).__name__ for n in split.b_components(self.partition)}

    # ------------------------------------------------------------------------------------------------ denoise
    def denoise(self, payload: wire.EncodedRequest, on_step: Callable[[StepRecord], None] | None = None,
                should_cancel: Callable[[], bool] | None = None, validated: bool = False) -> DenoiseResult:
        """Denoise one request; ``validated=True`` when the caller already ran ``payload.validate(text_dim=...)``
        (the actor does, to time it apart from the transfer)."""
        if not validated:
            payload.validate(text_dim=self.text_dim)
        with self._lock:
            swap_s = 0.0
            needed = split.PARTITION_OF[payload.workflow]
            if needed != self.partition:
                swap_s = self._swap_to(needed)
            pipe = self._pipe(payload.workflow)
            adapter_s, schedule = self.adapters.activate(tuple((a.path, a.weight) for a in payload.adapters))
            shifts = self._apply_schedule(pipe, schedule)
            cuda = self.device.startswith("cuda")
            monitor = StepMonitor(total=payload.num_inference_steps, on_step=on_step, should_cancel=should_cancel,
                                  request_id=payload.request_id,
                                  sync=self._torch.cuda.synchronize if cuda else None)
            self._slot.monitor = monitor
            t0 = time.perf_counter()
            self.last_profile = None
            try:
                generator = self._torch.Generator("cpu").manual_seed(payload.seed)
                with maybe_profile(f"denoise_{payload.request_id}", cuda) as prof:
                    out = pipe(**payload.pipeline_inputs(), generator=generator,
                               output=["latents", "audio_latents"])
                self.last_profile = prof.path
            finally:
                self._slot.monitor = None
            compute_s = time.perf_counter() - t0
        result = wire.DenoisedLatents(
            request_id=payload.request_id,
            workflow=payload.workflow,
            height=payload.height,
            width=payload.width,
            num_frames=payload.num_frames,
            latents=wire.WireTensor.from_torch(out["latents"].float()),
            audio_latents=wire.WireTensor.from_torch(out["audio_latents"].float()),
        )
        res = DenoiseResult(result.validate(), monitor.steps, compute_s, swap_s, adapter_s, *shifts)
        res.profile_path = self.last_profile
        return res

    def _apply_schedule(self, pipe, schedule: AdapterSchedule) -> tuple[float, float]:
        """Schedulers for this request: the checkpoint's own, or fresh ones with the adapter's shifts."""
        out = []
        for name, override in (("scheduler", schedule.shift), ("audio_scheduler", schedule.audio_shift)):
            base = getattr(self._host, name)
            sched = base if override is None else type(base).from_config(base.config, shift=override)
            pipe.update_components(**{name: sched})
            out.append(float(sched.config.shift))
        return out[0], out[1]
