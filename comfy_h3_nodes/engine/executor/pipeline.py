"""The one request path: a conditioning encoded on A becomes a :class:`Job` on B, whose latents come back to A and
are decoded there (or split with B). A single request is a batch of one.

``Pipeline.denoise(conditioning, params, on_step) -> Job``
    waits for the encode, puts the payload (at most ``Slots.n`` requests between A's put and A's receipt of their
    latents: each holds a payload in the object store), has B denoise it (:class:`~.b_client.BClient`) and, for an
    in-process A, receives the latents on A at once; returns at once with the job in flight.
``Job``
    ``result()`` / ``await wait()`` (bounded, polling a ``should_cancel`` such as ComfyUI's interrupt flag), the
    received ``latents()``, ``cancel()`` (B stops before its next step, a queued encode never starts, a split decode
    stops before its next clip) and ``decode(a, decode_on)`` (by A alone or split with B, per
    :mod:`.decode_plan`; B's copy of the latents is released after it).
``Pipeline.generate(a, request)``
    encode, denoise and decode of one whole request, holding one slot from the encode to the decode.
``BatchProgress``
    one counter for a whole batch (B's steps and A's decodes), read by whichever node shows the progress bar.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable

import ray

from ..contract.configs import PARTITION_OF
from ..contract.errors import DecodeCancelled, H3Cancelled, H3Error
from ..contract.request import DenoiseParams, ValidRequest
from ..contract.timing import StageRecord, TimingLog, summarize
from .a_client import Conditioning
from .b_client import BClient, Denoised
from .decode_plan import DecodePlan, DecodePlanner, alone_record


def check_trained_steps(health: dict | None, workflow: str, steps: int) -> None:
    """Refuse, before anything is sent, a step count that B's FastH3 partition for ``workflow`` was not trained for
    (``trained_steps`` of B's last health check; B itself checks again before it denoises)."""
    part = PARTITION_OF.get(workflow)
    want = (((health or {}).get("B") or {}).get("trained_steps") or {}).get(part)
    if want is not None and int(steps) != int(want):
        raise H3Error(f"B's {part} is a FastH3 checkpoint trained for {want} sigma points ({want - 1} transformer "
                      f"forwards) and the request asks for {steps} steps: set steps to {want}.")


class Slots:
    """At most ``n`` requests in flight between A's put and A's receipt (the semaphore lives on the executor loop)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"max_in_flight is {n}; it must be at least 1.")
        self.n, self._sem = n, None
        self.in_flight = self.max_seen = 0

    async def __aenter__(self):
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.n)
        await self._sem.acquire()
        self.in_flight += 1
        self.max_seen = max(self.max_seen, self.in_flight)

    async def __aexit__(self, *exc):
        self.in_flight -= 1
        self._sem.release()


class _Held:
    """No slot: the caller already holds one for this job (``generate``)."""

    async def __aenter__(self):
        return None

    async def __aexit__(self, *exc):
        return None


@dataclass
class GenerationResult:
    request_id: str
    media: object  # a_side.DecodedMedia
    records: list[StageRecord] = field(default_factory=list)

    def stage_seconds(self) -> dict[str, float]:
        return summarize(self.records)


class Job:
    """One denoise run of a conditioning: in flight on B, then its latents on A, then (once) its decode."""

    def __init__(self, pipeline: "Pipeline", conditioning: Conditioning, params: DenoiseParams, request_id: str):
        self.pipeline, self.conditioning, self.params = pipeline, conditioning, params
        self.request_id, self.workflow = request_id, conditioning.workflow
        self.future: Future | None = None  # of Denoised
        self.denoised: Denoised | None = None
        self.received = None  # wire.DenoisedLatents on A (in-process A)
        self.b_to_a: StageRecord | None = None
        self.encode_record: StageRecord | None = None
        self.share: list = []  # B's decode-share refs while a split decode runs

    def shape(self) -> tuple[int, int, int] | None:
        """(height, width, num_frames) of the request: from its latents on A, else from A's encode record."""
        if self.received is not None:
            return self.received.height, self.received.width, self.received.num_frames
        info = (self.encode_record.info or {}) if self.encode_record is not None else {}
        return (info["height"], info["width"], info["num_frames"]) if "num_frames" in info else None

    # ------------------------------------------------------------------------------------------------ waiting
    def done(self) -> bool:
        return self.future is not None and self.future.done()

    def result(self, timeout: float | None = None, should_cancel: Callable[[], bool] | None = None,
               poll: float = 0.1) -> Denoised:
        """B's result, waiting at most ``timeout`` seconds (None: the denoise's own bounds); ``should_cancel`` is
        polled meanwhile and cancels the job (raising :class:`H3Cancelled`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.future.result(timeout=poll)
            except FutureTimeout:
                pass
            if should_cancel is not None and should_cancel():
                self.cancel()
                raise H3Cancelled(f"request {self.request_id} was interrupted; B stopped it.")
            if deadline is not None and time.monotonic() > deadline:
                raise H3Error(f"request {self.request_id} did not finish within {timeout:.0f} s.")

    async def wait(self, should_cancel: Callable[[], bool] | None = None, poll: float = 0.1) -> Denoised:
        """:meth:`result` for an event loop (ComfyUI's): the job's own bounds, ``should_cancel`` polled."""
        fut = asyncio.wrap_future(self.future)
        while True:
            done, _ = await asyncio.wait({fut}, timeout=poll)
            if done:
                return fut.result()
            if should_cancel is not None and should_cancel():
                self.cancel()
                try:
                    await fut
                except Exception:  # noqa: BLE001 - cancelled on B, or failed meanwhile: the interrupt wins
                    pass
                raise H3Cancelled(f"request {self.request_id} was interrupted; B stopped it.")

    def latents(self, should_cancel: Callable[[], bool] | None = None):
        """The latents received on A (in-process A; a cached job keeps them, so they outlive the cluster)."""
        self.result(should_cancel=should_cancel)
        return self.received

    @property
    def records(self) -> list[StageRecord]:
        """This run's records so far: ``a_to_b``, ``denoise`` (B's) and ``b_to_a`` (A's)."""
        recs = list(self.denoised.records) if self.denoised else []
        return recs + ([self.b_to_a] if self.b_to_a is not None else [])

    # ------------------------------------------------------------------------------------------------ control
    def cancel(self) -> None:
        self.pipeline.cancel(self)

    def release(self) -> None:
        """B's copy of the latents is not needed any more (decoded): the object store may free it."""
        if self.denoised is not None:
            self.denoised.latents_ref = None

    def decode(self, a=None, decode_on: str | None = None, b_clips: int | None = None,
               should_cancel: Callable[[], bool] | None = None):
        """Decode on ``a`` (default: the A client that encoded it); ``(media, records, plan)``."""
        return self.pipeline.call(self.pipeline.decode(self, a or self.conditioning.a, decode_on, b_clips,
                                                       should_cancel))


class BatchProgress:
    """Steps of a whole batch: ``steps_per_request`` forwards of each of ``n`` requests, plus one decode each."""

    def __init__(self, n: int, steps_per_request: int):
        self.n = n
        self.total = n * max(1, steps_per_request) + n
        self._done: dict[str, int] = {}
        self._decoded = 0
        self._lock = threading.Lock()

    def step(self, request_id: str, index: int) -> None:
        with self._lock:  # index -1: the request starts over (a rank was lost), its steps count again from 0
            self._done[request_id] = 0 if index < 0 else max(self._done.get(request_id, 0), index + 1)

    def decoded(self) -> None:
        with self._lock:
            self._decoded += 1

    @property
    def value(self) -> int:
        with self._lock:
            return min(self.total, sum(self._done.values()) + self._decoded)


class Pipeline:
    """Runs jobs on the executor's loop (``run`` submits a coroutine to it from any thread)."""

    def __init__(self, b: BClient, planner: DecodePlanner, run: Callable, timings: TimingLog, max_in_flight: int,
                 health: Callable[[], dict | None] = lambda: None):
        """``run(coro) -> Future`` runs a coroutine on the executor's loop; ``health()`` is the pair's last health
        check (B's video VAE facts and host name come from it)."""
        self.b, self.planner, self.run, self.timings, self.health = b, planner, run, timings, health
        self.slots = Slots(max_in_flight)
        self.closed = False  # the executor shut down (a new cluster): its jobs still decode, on A alone

    def b_decoder(self) -> dict | None:
        return ((self.health() or {}).get("B") or {}).get("video_vae")

    def b_hostname(self) -> str:
        return ((self.health() or {}).get("B") or {}).get("hostname", "")

    def call(self, coro):
        """Run a coroutine to its end from any thread: on the executor's loop, or here once that loop is gone."""
        if self.closed:
            return asyncio.run(coro)
        return self.run(coro).result()

    # ------------------------------------------------------------------------------------------------ denoise
    def denoise(self, cond: Conditioning, params: DenoiseParams, on_step: Callable | None = None,
                slots: Slots | None = None, on_done: Callable | None = None) -> Job:
        """Start B's denoise of ``cond`` with ``params``; returns the job in flight. ``on_done(job)`` runs once its
        latents are on A (the executor's thread)."""
        check_trained_steps(self.health(), cond.workflow, params.steps)
        job = Job(self, cond, params, cond.next_request_id())
        self.b.pending += 1
        job.future = self.run(self._run(job, slots or self.slots, on_step, on_done))
        return job

    async def _run(self, job: Job, slots, on_step, on_done) -> Denoised:
        cond, rid = job.conditioning, job.request_id
        try:
            async with slots:
                if rid in self.b.cancelled:
                    raise H3Cancelled(f"request {rid} was cancelled before B started it.")
                ref, job.encode_record = await cond.a.put(cond)
                self.timings.add([job.encode_record])
                den = await self.b.denoise(ref, job.params.call(rid, cond.request_id), cond.workflow,
                                           job.encode_record, on_step)
                del ref  # B has the payload: the object store frees it
                self.b.pending -= 1
                job.denoised = den
                job.received, job.b_to_a = await cond.a.receive(den)
                self.timings.add(job.records)
        except BaseException:
            if job.denoised is None:
                self.b.pending -= 1
            self.b.cancelled.discard(rid)
            raise
        if on_done is not None:
            on_done(job)
        return den

    def cancel(self, job: Job) -> None:
        """B stops it before its next step, a queued encode never starts, a split decode stops before its next
        clip on both machines."""
        job.conditioning.cancel()
        self.b.cancel(job.request_id)
        job.conditioning.a.cancel(job.request_id)
        for ref in job.share[:1]:
            try:
                ray.cancel(ref)  # still queued on B: never starts (a running share stops at its next clip)
            except Exception:  # noqa: BLE001 - already finished or not cancellable
                pass

    # ------------------------------------------------------------------------------------------------ decode
    async def decode(self, job: Job, a, decode_on: str | None, b_clips: int | None,
                     should_cancel: Callable[[], bool] | None = None) -> tuple[object, list[StageRecord], DecodePlan]:
        """Decode ``job`` on ``a`` alone, or split with the B worker that still holds its latents."""
        if self.closed and not job.done():
            raise H3Error(f"request {job.request_id} was still on B when its connection closed (a new cluster): "
                          "run it again.")
        await asyncio.wrap_future(job.future)
        rid, den = job.request_id, job.denoised
        shape = job.shape()
        choice = decode_on or self.planner.decode_on
        gone = ("its connection to B was closed (a new cluster)" if self.closed
                else "B no longer holds this request's latents" if den.latents_ref is None else "")
        if shape is None:
            plan = DecodePlan("A", 0, 0, "the request's canvas is unknown", choice)
        elif gone and choice != "A":
            n = self.planner.plan(*shape, a.decoder_info(), None, 0, "A").clips
            plan = DecodePlan("A", n, n, gone, choice)
        else:
            plan = self.planner.plan(*shape, a.decoder_info(), self.b_decoder(), self.b.pending, decode_on, b_clips)
        share = None
        if plan.mode == "A+B":
            share = job.share = self.b.start_share(den.latents_ref, rid, plan.b_start, plan.clips, plan.b_tile)
        try:
            media, records = await a.decode(job, plan, share, should_cancel)
        except DecodeCancelled:
            job.cancel()
            raise H3Cancelled(f"request {rid} was cancelled during its decode; A and B stopped.") from None
        finally:
            job.share = ()
            self.b.cancelled.discard(rid)
            if job.received is not None:  # A holds the latents: B's copy is not needed again
                job.release()
        if plan.mode == "A":
            records = [alone_record(records[0], plan), *records[1:]]
        records = self.b.on_b_clock(records)
        if shape is not None:
            self.planner.learn(records, shape[0], shape[1], plan.clips)
        if job.received is None and job.b_to_a is not None:  # A's actor received B's latents for this decode
            records = [job.b_to_a, *records]
        self.timings.add(records)
        return media, records, plan

    # ------------------------------------------------------------------------------------------------ whole
    async def generate(self, a, req: ValidRequest, on_step: Callable | None = None) -> GenerationResult:
        """One whole request, holding one slot from its encode to its decode."""
        check_trained_steps(self.health(), req.workflow, req.params.steps)
        async with self.slots:
            cond = a.encode(req.encode)
            job = Job(self, cond, req.params, cond.next_request_id())
            self.b.pending += 1
            job.future = asyncio.ensure_future(self._run(job, _Held(), on_step, None))
            try:
                await job.future
                if job.request_id in self.b.cancelled:
                    raise H3Cancelled(f"request {job.request_id} was cancelled after B finished; not decoded.")
                media, dec, _ = await self.decode(job, a, None, None)
            finally:
                self.b.cancelled.discard(job.request_id)
        received = [job.b_to_a] if job.received is not None else []  # else the decode's records carry it
        records = [job.encode_record, *job.denoised.records, *received, *dec]
        return GenerationResult(job.request_id, media, records)
