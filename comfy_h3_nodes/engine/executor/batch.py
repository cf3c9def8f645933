"""Batches: N requests of one graph run, pipelined across A and B with handles to work in flight.

A ComfyUI graph run that carries N prompts runs each H3 node once over the whole list. The nodes do not wait for
each other's finished results: they pass handles (futures) to work in flight, so that

* A encodes request k+1 (one encode at a time: A's text encoder is one model) while B denoises request k;
* B receives request k+1 while it denoises k (it serves its queue in order), at most ``max_in_flight`` requests
  being between A's put and A's receipt of their latents (each holds a payload in the object store);
* A decodes request k-1 while B denoises k.

Contract of the pieces (all engine, no ComfyUI):

``encode_all(side, requests) -> [Future[EncodedRequest]]``
    encodes in order on one background thread per A side; a cancelled batch skips what has not started.
``denoise_all(executor, jobs, max_in_flight, on_step) -> [Future[Denoised]]``
    ``jobs`` are ``(request_id, Future[EncodedRequest], make_payload)``; each job waits for its encode, puts the
    payload into A's object store, has B denoise it (bounded waits, cancellable between steps) and receives the
    latents on A. Futures resolve to :class:`Denoised` (latents on A, the request's records).
``BatchProgress``
    one counter for the whole batch (B's steps and A's decodes), read by whichever node shows the progress bar.
``cancel(executor, request_ids)``
    stops every request of the batch: queued encodes are dropped, B stops before its next step, jobs not yet on B
    never start there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

_encode_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


@dataclasses.dataclass
class Denoised:
    """One request's result on A: the received latents and the request's records (a_to_b, denoise, b_to_a)."""

    index: int
    request_id: str
    latents: object  # wire.DenoisedLatents, materialised on A
    records: list


class BatchProgress:
    """Steps of the whole batch: ``steps_per_request`` forwards of each of ``n`` requests, plus one decode each."""

    def __init__(self, n: int, steps_per_request: int):
        self.n = n
        self.total = n * max(1, steps_per_request) + n
        self._done: dict[str, int] = {}
        self._decoded = 0
        self._lock = threading.Lock()

    def step(self, request_id: str, index: int) -> None:
        with self._lock:
            self._done[request_id] = max(self._done.get(request_id, 0), index + 1)

    def decoded(self) -> None:
        with self._lock:
            self._decoded += 1

    @property
    def value(self) -> int:
        with self._lock:
            return min(self.total, sum(self._done.values()) + self._decoded)


def _encode_pool(side) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _encode_pools.get(id(side))
        if pool is None:
            pool = _encode_pools[id(side)] = ThreadPoolExecutor(1, thread_name_prefix="h3-encode")
        return pool


def encode_all(side, requests: list, on_done: Callable | None = None) -> list[Future]:
    """Encode ``requests`` (validated :class:`~.request.ValidRequest`) one after another off the caller's thread.
    ``on_done(index, payload, seconds, started)`` runs after each successful encode (timing reports)."""
    pool = _encode_pool(side)

    def run(i, req):
        w0, t0 = time.time(), time.perf_counter()
        payload = side.encode(req)
        if on_done is not None:
            on_done(i, payload, time.perf_counter() - t0, w0)
        return payload

    return [pool.submit(run, i, r) for i, r in enumerate(requests)]


def denoise_all(ex, jobs: list[tuple[str, Future, Callable]], max_in_flight: int = 2,
                on_step: Callable | None = None, on_done: Callable | None = None) -> list[Future]:
    """Pipeline ``jobs`` through B (see the module docstring); returns one Future of :class:`Denoised` per job, in
    order. ``on_done(Denoised)`` runs when a request's latents are on A."""
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight is {max_in_flight}; it must be at least 1.")
    sem_box: list[asyncio.Semaphore] = []

    def semaphore() -> asyncio.Semaphore:  # created on the executor's loop, where it is used
        if not sem_box:
            sem_box.append(asyncio.Semaphore(max_in_flight))
        return sem_box[0]

    async def one(index: int, rid: str, encoded: Future, make_payload: Callable) -> Denoised:
        from .executor import H3Cancelled

        try:
            async with semaphore():
                if rid in ex.cancelled_ids():
                    raise H3Cancelled(f"request {rid} was cancelled before B started it.")
                payload = make_payload(await asyncio.wrap_future(encoded))
                enc = await asyncio.to_thread(ex.put_payload, payload, time.time(), 0.0)
                den = await ex.adenoise(enc, on_step)
                del enc  # B has the payload: the object store frees it
                latents, b_to_a = await asyncio.to_thread(ex.receive_local, den)
        finally:
            ex.clear_cancel(rid)
        out = Denoised(index, rid, latents, [*den.records, b_to_a])
        if on_done is not None:
            on_done(out)
        return out

    return [ex.run_stage(one(i, rid, fut, make)) for i, (rid, fut, make) in enumerate(jobs)]


def cancel(ex, request_ids, encodes: list[Future] = ()) -> None:
    """Stop a batch: encodes not started are dropped, B stops each request before its next step."""
    for fut in encodes:
        fut.cancel()
    for rid in request_ids:
        ex.cancel(rid)
