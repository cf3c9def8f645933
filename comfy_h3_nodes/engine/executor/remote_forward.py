"""A's client of B's per-forward calls: ComfyUI's own sampler on A, the DiT's forwards on B.

A sampler calls the model once or twice a step (CFG). Per sampling run A opens one :class:`RemoteSampling` on one
DiT worker; per conditioning it puts one :class:`~..contract.ForwardContext` in its object store (text states,
the packed layout, the guide and reference rows) and sends that object's reference with every forward, so B fetches
it once and keeps it by id; per forward only the target rows cross A->B, and their model output B->A.

Every wait is bounded: a forward waits at most ``forward_timeout`` seconds, in slices of ``poll`` seconds, between
which the caller's ``interrupted`` is asked (ComfyUI's Cancel): then B is told to stop (it stops before its next
transformer block) and :class:`~..contract.errors.H3Cancelled` is raised. A worker lost mid-sampling raises
:class:`~..contract.errors.H3Error` at once with the forward named; the next sampling picks a worker again.

One :class:`ForwardRecord` per forward, on the receiver's clock for each hand-off: A->B is B's arrival minus A's
send (B's clock, corrected by the measured offset), B->A is A's receipt minus B's end; :meth:`RemoteSampling.summary`
adds them up for the readout.
"""

from __future__ import annotations

import hashlib
import itertools
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

import ray
import torch

from ..contract import wire
from ..contract.forward_payloads import ForwardCall, ForwardContext
from ..contract.errors import H3Cancelled, H3Error, H3Timeout
from .failures import remote_error

_ids = itertools.count()


@dataclass(frozen=True)
class ForwardRecord:
    """One forward as the two machines saw it (seconds)."""

    index: int
    round_trip_s: float  # A's send to A's receipt of the result
    compute_s: float     # B's forward
    a_to_b_s: float      # B's arrival minus A's send (on B's clock, offset-corrected)
    b_to_a_s: float      # A's receipt minus B's end
    bytes_a_to_b: int
    bytes_b_to_a: int
    context_s: float = 0.0  # the first forward of a context: B's fetch of it


@dataclass
class RemoteSampling:
    """The forwards of one sampler run on one DiT worker (``handle``, named ``worker``)."""

    handle: object
    worker: str
    clock_offset_s: float = 0.0  # B's clock minus A's
    forward_timeout: float = 600.0
    poll: float = 0.1
    sampling_id: str = field(default_factory=lambda: f"s{next(_ids)}-{uuid.uuid4().hex[:8]}")
    records: list[ForwardRecord] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    _contexts: dict = field(default_factory=dict)
    lora_ref: object = None  # the sampling's LoRA patch set (ComfyLoraSet), put once; None: no LoRA
    lora_modules: int = 0  # how many of B's modules it patched (B's answer)
    lora_bytes_fetched: int = 0  # what B fetched of it for this sampling (0: B had it from an earlier one)

    def context_ref(self, key: tuple, make: Callable[[], ForwardContext], keep=None):
        """The object reference of the context ``key`` names (``make`` builds it the first time): put once per
        sampling and conditioning, so B fetches it once. ``keep`` (what an ``id`` in the key names) stays referenced
        with it, so that id names nothing else while the sampling runs."""
        hit = self._contexts.get(key)
        if hit is None:
            ctx = make()
            ctx.validate()
            hit = self._contexts[key] = (ray.put(ctx), keep)
        return hit[0]

    def forward(self, ctx_ref, video, audio, timestep, timestep_indices,
                interrupted: Callable[[], bool] = lambda: False) -> tuple:
        """One forward: ``video`` / ``audio`` the target rows (float32 torch), ``timestep`` the distinct values,
        ``timestep_indices`` per row of the sequence. Returns B's ``(video, audio)`` output rows (torch)."""
        index = len(self.records)
        call = ForwardCall(self.sampling_id, index, wire.WireTensor.from_torch(video),
                           wire.WireTensor.from_torch(audio), wire.WireTensor.from_torch(timestep),
                           wire.WireTensor.from_torch(timestep_indices))
        sent = time.time()
        refs = [ctx_ref] if self.lora_ref is None else [ctx_ref, self.lora_ref]
        ref = self.handle.forward.options(num_returns=2).remote(refs, call)
        result_ref, info_ref = ref
        deadline = time.monotonic() + self.forward_timeout
        while True:
            ready, _ = ray.wait([info_ref], timeout=self.poll, fetch_local=True)
            if ready:
                break
            if interrupted():
                self.cancel()
                raise H3Cancelled(f"sampling {self.sampling_id} was interrupted at forward {index + 1}; B stopped "
                                  "it between two transformer blocks.")
            if time.monotonic() > deadline:
                self.cancel()
                raise H3Timeout(f"B's worker {self.worker} took over {self.forward_timeout:.0f} s for forward "
                                f"{index + 1} of sampling {self.sampling_id}; check B's health (python -m "
                                "remote_worker status) or raise the forward timeout.")
        try:
            result, info = ray.get([result_ref, info_ref], timeout=self.forward_timeout)
        except ray.exceptions.RayError as exc:
            err = remote_error("B", f"forward {index + 1} of ComfyUI's sampler", self.sampling_id, exc)
            if isinstance(err, H3Cancelled):
                raise err from None
            raise H3Error(f"{err} The sampler on A stopped at forward {index + 1}; queue the prompt again: the "
                          "next sampling picks a DiT worker that answers.") from None
        got = time.time()
        result.validate(call)
        self.lora_modules = info.get("lora_modules", 0)
        self.lora_bytes_fetched += info.get("lora_bytes", 0)
        arrived = info["arrived"] - self.clock_offset_s
        ended = info["ended"] - self.clock_offset_s
        self.records.append(ForwardRecord(
            index, round(got - sent, 6), round(info["compute_s"], 6), round(max(arrived - sent, 0.0), 6),
            round(max(got - ended, 0.0), 6), call.nbytes, result.nbytes, info.get("context_fetch_s", 0.0)))
        return result.video.to_torch(), result.audio.to_torch()

    def cancel(self) -> None:
        try:
            ray.get(self.handle.cancel.remote(self.sampling_id), timeout=10.0)
        except Exception:  # noqa: BLE001 - the worker is gone or slow: the caller reports the interrupt anyway
            pass

    def summary(self) -> dict:
        """The readout's figures: forwards, B's compute and both hand-offs, per forward and in all."""
        n = len(self.records)
        tot = {k: round(sum(getattr(r, k) for r in self.records), 6)
               for k in ("round_trip_s", "compute_s", "a_to_b_s", "b_to_a_s", "bytes_a_to_b", "bytes_b_to_a")}
        per = {k: round(v / n, 6) for k, v in tot.items()} if n else {}
        return {"sampling_id": self.sampling_id, "worker": self.worker, "forwards": n, "total": tot,
                "lora_modules": self.lora_modules, "lora_bytes_fetched": self.lora_bytes_fetched,
                "per_forward": per, "started": self.started, "wall_s": round(time.time() - self.started, 6),
                "records": [asdict(r) for r in self.records]}


def fingerprint(*tensors) -> str:
    """A content key of CPU tensors (the conditioning a sampler hands each forward may be a new tensor with the same
    values: concatenated for CFG, cast, moved): the context is put once per distinct content."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own bytes, not a copy
    return h.hexdigest()
