"""The one hand-off receive: a bounded wait for the producer, the fetch, validation and materialisation of a payload,
timed apart on the receiver's clock. A's actor, in-process A and B's actor all receive through it.

* :func:`receive_payload` is the whole receipt of one wire payload (``EncodedRequest`` on B, ``DenoisedLatents`` on
  A) with its :class:`~..contract.timing.StageRecord` (``a_to_b`` or ``b_to_a``);
* :class:`ShareReceiver` is A's receipt of B's split-decode share, one clip at a time, each bounded;
* :func:`sole_copy` gives a re-run a payload that no lost worker's node holds a copy of.

Every wait is bounded by the caller's timeout; a producer that failed is named with its stage and request.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Callable

import ray
from ray.experimental import get_object_locations

from ..contract.errors import HandoffError
from ..contract.timing import StageRecord
from ..model.split_decode import Tiles

log = logging.getLogger("comfy_h3")


def unwrap_ray_error(exc: BaseException) -> BaseException:
    """The user's exception inside a RayTaskError, when there is one."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def sole_copy(ref, timeout: float):
    """``ref``'s value in a new object that only this process's node (A) holds, for a re-run on another worker.
    The lost worker's node may hold a copy of the payload, and Ray fetches an object from a holder picked at random,
    asking a silent one again only after 10, 20, 40, ... s: a worker cut off but not yet declared dead (the health
    check's partition tolerance) would hold the re-run's fetch past its bound about one time in thirty. Where this
    node holds no copy (a client off A), ``ref`` is returned as it is: copying it would be the same fetch."""
    here = ray.get_runtime_context().get_node_id()
    where = get_object_locations([ref], timeout_ms=int(timeout * 1000)).get(ref) or {}
    if here not in (where.get("node_ids") or []):
        return ref
    return ray.put(ray.get(ref, timeout=timeout))


def receive(ref, timeout: float, machine: str, stage: str, request_id: str):
    """Wait for the producer, then fetch; returns ``(payload, producer_wait_s, fetch_s)``.

    Both waits are bounded by ``timeout``; a failure of the producer is re-raised with the stage named.
    """
    t0 = time.perf_counter()
    ready, _ = ray.wait([ref], timeout=timeout, fetch_local=False)
    t1 = time.perf_counter()
    if not ready:
        raise HandoffError(
            f"{machine} waited {timeout:.0f} s for the {stage} payload of request {request_id} and the producer "
            "never finished; check the other machine's health."
        )
    try:
        payload = ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError as exc:
        raise HandoffError(
            f"{machine} could not fetch the {stage} payload of request {request_id} within {timeout:.0f} s; "
            "the link between the machines is down or saturated."
        ) from exc
    except ray.exceptions.RayTaskError as exc:
        inner = unwrap_ray_error(exc)
        raise HandoffError(f"the producer of the {stage} payload of request {request_id} failed: {inner}") from inner
    except ray.exceptions.RayError as exc:
        raise HandoffError(
            f"{machine} lost the {stage} payload of request {request_id}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    return payload, t1 - t0, time.perf_counter() - t1


class ShareReceiver:
    """A's side of B's split-decode share: ``refs`` are the share call's returns (one ``wire.DecodedClip`` per clip
    ``start``, ``start + 1``, ..., then B's decode record; with ``first_tile`` > 0 clip ``start`` is only its tiles from
    that one on, handed to the blend as a ``split_decode.Tiles``). Called with a clip index
    (``split_decode.serve_clips`` asks for every clip in order), it returns B's clip as a tensor, or ``None`` for A to
    decode that clip itself: for clips before ``start`` (A's share) and, once B's share failed (B's actor died, B was
    cancelled, a bounded wait ran out), for every clip of it; ``failure`` then says why. B's record lands in ``record``.

    B's frames are pulled in the background from the moment B's share is done, so they cross the link while A still
    decodes its own clips (the blend asks for B's first clip only after A's last). Timed apart on A's clock:
    ``producer_wait_s`` (the blend waited for B to finish), ``fetch_s`` (the frames' transfer, wherever it fell),
    ``fetch_wait_s`` (the part of the transfer the blend waited for; the rest was hidden behind A's clips) and
    ``materialize_s``. Every wait is polled (``poll``) against the bound, the cancel and :meth:`close`."""

    def __init__(self, refs: list, start: int, height: int, width: int, timeout: float, request_id: str,
                 should_cancel=None, poll: float = 0.05, first_tile: int = 0):
        self.clip_refs, self.record_ref = list(refs[:-1]), refs[-1]
        self.start, self.height, self.width, self.first_tile = start, height, width, first_tile
        self.timeout, self.request_id, self.should_cancel, self.poll = timeout, request_id, should_cancel, poll
        self.record = None
        self.failure = ""
        self.producer_wait_s = self.fetch_s = self.fetch_wait_s = self.materialize_s = 0.0
        self.bytes = 0
        self.received: list[int] = []
        self._clips: dict[int, object] = {}
        self._done = threading.Event()  # B's share is over for A: every clip fetched, or the share failed
        self._b_ready = threading.Event()  # B finished its share (its record is ready)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._prefetch, name=f"h3-share-{request_id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ the background pull
    def _fail(self, why: str) -> None:
        with self._cond:
            if not self.failure:
                self.failure = why
                log.warning("[%s] B's decode share is lost (%s); A decodes clips %d-%d itself", self.request_id,
                            why, self.start, self.start + len(self.clip_refs) - 1)
            self._cond.notify_all()

    def _stopped(self) -> bool:
        return self._stop.is_set() or (self.should_cancel is not None and self.should_cancel())

    def _wait_ready(self, ref, fetch_local: bool, what: str) -> bool:
        """Poll ``ref`` until it is ready (``fetch_local``: in A's store); False on stop, cancel or the bound."""
        deadline = time.monotonic() + self.timeout
        while True:
            ready, _ = ray.wait([ref], timeout=self.poll, fetch_local=fetch_local)
            if ready:
                return True
            if self._stopped():
                return False
            if time.monotonic() > deadline:
                self._fail(f"{what} within {self.timeout:.0f} s")
                return False

    def _prefetch(self) -> None:
        try:
            if not self._wait_ready(self.record_ref, False, "B did not finish its share"):
                return
            self.record = ray.get(self.record_ref, timeout=self.timeout)
            self._b_ready.set()
            for j, ref in enumerate(self.clip_refs):
                t0 = time.perf_counter()
                got = self._wait_ready(ref, True, f"B's clip {self.start + j} did not reach A")
                clip = ray.get(ref, timeout=self.timeout) if got else None  # in A's store now: no wait left
                self.fetch_s += time.perf_counter() - t0
                if clip is None:
                    return
                with self._cond:
                    self._clips[self.start + j] = clip
                    self.clip_refs[j] = None  # A holds the frames now; B's copy can go
                    self._cond.notify_all()
        except ray.exceptions.RayError as exc:  # B's actor died, its share failed, the object was lost with B
            inner = unwrap_ray_error(exc)
            self._fail(f"{type(exc).__name__}: {str(inner).strip().splitlines()[0] if str(inner).strip() else ''}")
        finally:
            self._b_ready.set()
            self._done.set()
            with self._cond:
                self._cond.notify_all()

    @property
    def prefetched(self) -> list[int]:
        """B's clips on A already, not yet handed to the blend."""
        with self._cond:
            return sorted(self._clips)

    def close(self) -> None:
        """Stop the background pull (the decode ended, failed or was cancelled) and wait for it, bounded."""
        self._stop.set()
        self._thread.join(timeout=max(5.0, 4 * self.poll))

    # ------------------------------------------------------------------------------------------ the blend's provider
    def __call__(self, index: int):
        if index < self.start:
            return None
        if index == self.start and self.first_tile:  # taken once A decoded its own tiles of the clip
            return Tiles(self.first_tile, functools.partial(self._take, index))
        return self._take(index)

    def _take(self, index: int):
        """B's clip ``index`` once it is on A (each wait bounded, a cancel or a lost share ends it: ``None``)."""
        t0 = time.perf_counter()
        b_done_at = None
        with self._cond:
            while index not in self._clips and not self.failure and not self._done.is_set():
                if self._stopped():
                    break  # the blend raises the cancel at its next clip
                if b_done_at is None and self._b_ready.is_set():
                    b_done_at = time.perf_counter()
                self._cond.wait(self.poll)
            clip = self._clips.pop(index, None)
        t1 = time.perf_counter()
        if b_done_at is None:
            b_done_at = t1
        self.producer_wait_s += b_done_at - t0  # the blend waited for B to finish its share
        self.fetch_wait_s += t1 - b_done_at  # ... then for its frames to cross
        if clip is None:
            if not self.failure and not self._stopped():
                self._fail(f"clip {index} never came from B's share")
            return None
        clip.validate(self.height, self.width)
        if clip.index != index or clip.request_id != self.request_id:
            raise HandoffError(f"A asked B's share for clip {index} of request {self.request_id} and received clip "
                               f"{clip.index} of request {clip.request_id}.")
        want = self.first_tile if index == self.start else 0
        if clip.first_tile != want:
            raise HandoffError(f"A asked B's share for clip {index} of request {self.request_id} from tile {want} and "
                               f"received it from tile {clip.first_tile}.")
        t2 = time.perf_counter()
        tensor = clip.frames.to_torch()
        self.materialize_s += time.perf_counter() - t2
        self.bytes += clip.nbytes
        self.received.append(index)
        return tensor


def materialize(payload) -> float:
    """Turn every wire tensor into a torch view (what the blocks will read); returns the seconds it took."""
    t0 = time.perf_counter()
    for t in payload.tensors().values():
        t.to_torch()
    return time.perf_counter() - t0


def receive_payload(ref, timeout: float, machine: str, stage: str, request_id: str,
                    validate: Callable[[object], object], node: str | None = None) -> tuple[object, StageRecord]:
    """Receive one wire payload and its record: wait (bounded), fetch, ``validate(payload)`` (the contract's own
    check, timed apart), materialise its tensors. ``stage`` is the record's (``a_to_b``, ``b_to_a``)."""
    w0 = time.time()
    label = {"a_to_b": "A->B", "b_to_a": "B->A"}.get(stage, stage)
    payload, wait_s, fetch_s = receive(ref, timeout, machine, label, request_id)
    t_v = time.perf_counter()
    validate(payload)
    validate_s = time.perf_counter() - t_v
    mat_s = materialize(payload)
    return payload, StageRecord(request_id, stage, machine, node or ray.util.get_node_ip_address(), w0, time.time(),
                                producer_wait_s=wait_s, fetch_s=fetch_s, materialize_s=mat_s, validate_s=validate_s,
                                bytes=payload.field_bytes())
