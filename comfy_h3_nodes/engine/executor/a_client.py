"""A's side of a request, behind one interface whether A runs in this process (ComfyUI) or in A's Ray actor.

Both clients offer the same steps, so the pipeline never asks which A it has:

``encode(ValidEncode) -> Conditioning``
    starts the encode; the conditioning resolves to the payload (in this process, or in A's object store);
``await put(conditioning) -> (ref, encode record)``
    the ObjectRef B receives (in-process A puts the payload into this node's store; the record gets ``serialize_s``);
``await receive(denoised) -> (DenoisedLatents | None, b_to_a record | None)``
    in-process A receives B's latents as soon as B is done (the nodes decode them later, here); A's actor receives
    them at its decode (so this returns ``None``);
``await decode(job, plan, share_refs, should_cancel) -> (media, records)``
    A alone, or split with B's share (``share_refs``: the returns of B's ``decode_share``);
``decoder_info()``, ``health()``, ``cancel(request_id)``, ``load_records()``, ``verify(topology)``, ``shutdown()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable

import ray

from ...cluster import ray_cluster as cl
from ..contract import wire
from ..contract.configs import SideConfig, Timeouts
from ..contract.errors import H3Cancelled, H3Error, H3Timeout
from ..contract.request import ValidEncode
from ..contract.timing import StageRecord
from ..process import base_health, runtime_env
from .b_client import Denoised, await_ref
from .failures import creation_cause, remote_error
from .handoff import ShareReceiver, receive_payload, unwrap_ray_error


@dataclass(eq=False)
class Conditioning:
    """One encoded request, on A: ``payload`` (a Future of the ``wire.EncodedRequest``, in-process A) or ``ref``
    and ``record_ref`` (A's actor's object store). Several denoise runs may use it: the first keeps its request id
    (so a timeline joins encode and denoise), later ones are ``<id>.2``, ``<id>.3``, ..."""

    request_id: str
    workflow: str
    a: object  # the A client that holds it
    payload: Future | None = None
    ref: object = None
    record_ref: object = None
    uses: int = 0

    def next_request_id(self) -> str:
        self.uses += 1
        return self.request_id if self.uses == 1 else f"{self.request_id}.{self.uses}"

    def done(self) -> bool:
        return self.payload.done() if self.payload is not None else bool(ray.wait([self.record_ref], timeout=0)[0])

    def cancel(self) -> None:
        """An encode that has not started yet never starts (in-process A)."""
        if self.payload is not None:
            self.payload.cancel()


class LocalA:
    """A in this process: the resident side of ComfyUI's ``H3LoadEncoders``; encodes run one at a time on a thread
    of their own (A's text encoder is one model), so B can start on the first while A encodes the next."""

    _encode_threads: dict[int, ThreadPoolExecutor] = {}
    _lock = threading.Lock()

    def __init__(self, side, timeouts: Timeouts | None = None):
        self.side, self.timeouts = side, timeouts or Timeouts()
        self.started = time.time()
        self.cancelled: set[str] = set()

    @property
    def node(self) -> str:
        return ray.util.get_node_ip_address() if ray.is_initialized() else "local"

    def _thread(self) -> ThreadPoolExecutor:
        with self._lock:
            pool = self._encode_threads.get(id(self.side))
            if pool is None:
                pool = self._encode_threads[id(self.side)] = ThreadPoolExecutor(1, thread_name_prefix="h3-encode")
            return pool

    def encode(self, req: ValidEncode, on_done: Callable | None = None) -> Conditioning:
        """Start encoding ``req``; ``on_done(payload, record)`` runs after it (the node's timing report)."""
        def run():
            payload, rec = self.side.encode_recorded(req, self.node)
            if on_done is not None:
                on_done(payload, rec)
            return payload, rec

        return Conditioning(req.request_id, req.workflow, self, payload=self._thread().submit(run))

    async def put(self, cond: Conditioning) -> tuple[object, StageRecord]:
        payload, rec = await asyncio.wrap_future(cond.payload)
        t0 = time.perf_counter()
        ref = await asyncio.to_thread(ray.put, payload)
        return ref, StageRecord(rec.request_id, "encode", "A", rec.node, rec.start, rec.end, compute_s=rec.compute_s,
                                serialize_s=time.perf_counter() - t0, bytes=rec.bytes, info=rec.info)

    async def receive(self, den: Denoised) -> tuple[wire.DenoisedLatents, StageRecord]:
        return await asyncio.to_thread(receive_payload, den.latents_ref, self.timeouts.handoff, "A", "b_to_a",
                                       den.request_id, lambda p: p.validate(), self.node)

    async def decode(self, job, plan, share_refs: list | None, should_cancel: Callable[[], bool] | None = None):
        latents = job.received
        rid = latents.request_id
        if share_refs is None:
            media, rec = await asyncio.to_thread(self.side.decode_recorded, latents, self.node, True)
            return media, [rec]
        cancelled = (lambda: rid in self.cancelled or bool(should_cancel and should_cancel()))  # noqa: E731
        share = ShareReceiver(share_refs, plan.b_start, latents.height, latents.width, self.timeouts.handoff, rid,
                              cancelled, first_tile=plan.b_tile)
        try:
            return await asyncio.to_thread(self.side.decode_split_recorded, latents, share, cancelled, self.node,
                                           True)
        finally:
            share.close()
            self.cancelled.discard(rid)

    def decoder_info(self) -> dict:
        return self.side.decoder_info()

    def health(self, timeout: float | None = None) -> dict:
        return {**base_health("A", self.side, self.started), "video_vae": self.side.decoder_info()}

    def cancel(self, request_id: str) -> None:
        self.cancelled.add(request_id)
        while len(self.cancelled) > 256:  # bounded: a cancel of a request never decoded is not kept
            self.cancelled.pop()

    def load_records(self) -> list:
        return list(self.side.load_records)

    def verify(self, topology: cl.Topology) -> None:
        verify_driver_on_a(topology)

    def shutdown(self) -> None:
        pass


class ActorA:
    """A in its own Ray actor on the A node (tests, benchmarks, a second client): payloads stay in A's store."""

    def __init__(self, config: SideConfig, actor_class: Callable, timeouts: Timeouts, name: str | None = None,
                 namespace: str = "comfy_h3", env: dict | None = None, max_restarts: int = -1):
        opts = {"resources": {cl.ROLE_A: 1}, "num_cpus": cl.ACTOR_CPUS, "runtime_env": runtime_env(env), "max_restarts": max_restarts,
                "max_task_retries": 0}
        if name:
            opts.update(name=name, namespace=namespace, get_if_exists=True)
        self.timeouts = timeouts
        self.handle = actor_class().options(**opts).remote(asdict(config))
        self.last_health: dict | None = None

    def encode(self, req: ValidEncode, on_done: Callable | None = None) -> Conditioning:
        payload_ref, rec_ref = self.handle.encode.remote(req)
        return Conditioning(req.request_id, req.workflow, self, ref=payload_ref, record_ref=rec_ref)

    async def put(self, cond: Conditioning) -> tuple[object, StageRecord]:
        try:
            rec = await await_ref(cond.record_ref, self.timeouts.encode)
        except asyncio.TimeoutError as exc:
            ray.cancel(cond.ref)
            raise H3Timeout(f"A did not finish encoding request {cond.request_id} within "
                            f"{self.timeouts.encode:.0f} s.") from exc
        except ray.exceptions.RayError as exc:
            raise remote_error("A", "encode", cond.request_id, exc) from None
        return cond.ref, rec

    async def receive(self, den: Denoised) -> tuple[None, None]:
        return None, None  # A's actor receives B's latents at its decode

    async def decode(self, job, plan, share_refs: list | None, should_cancel: Callable[[], bool] | None = None):
        rid, ref = job.request_id, job.denoised.latents_ref
        if share_refs is None:
            media_ref, recs_ref = self.handle.decode.remote([ref], rid, self.timeouts.handoff)
        else:
            media_ref, recs_ref = self.handle.decode_split.remote([ref], rid, share_refs, plan.b_start,
                                                                  self.timeouts.handoff, plan.b_tile)
        try:
            records = await await_ref(recs_ref, self.timeouts.decode)
            media = await await_ref(media_ref, self.timeouts.decode)
        except asyncio.TimeoutError as exc:
            raise H3Timeout(f"A did not finish decoding request {rid} within {self.timeouts.decode:.0f} s.") from exc
        except ray.exceptions.RayError as exc:
            if type(unwrap_ray_error(exc)).__name__ == "DecodeCancelled":
                raise H3Cancelled(f"request {rid} was cancelled during its decode; A and B stopped.") from None
            raise remote_error("A", "decode", rid, exc) from None
        job.b_to_a = records[0]
        return media, list(records[1:])

    def decoder_info(self) -> dict:
        known = (self.last_health or {}).get("video_vae")
        return known if known is not None else self.health()["video_vae"]

    def health(self, timeout: float | None = None) -> dict:
        bound = timeout or self.timeouts.health
        try:
            self.last_health = ray.get(self.handle.health.remote(), timeout=bound)
        except ray.exceptions.GetTimeoutError as exc:
            raise H3Timeout(f"machine A did not answer a health check within {bound:.0f} s.") from exc
        except ray.exceptions.RayError as exc:
            raise H3Error(f"machine A failed its health check: {creation_cause(exc)}") from exc
        return self.last_health

    def cancel(self, request_id: str) -> None:
        self.handle.cancel.remote(request_id)

    def load_records(self) -> list:
        return ray.get(self.handle.load_records.remote(), timeout=self.timeouts.health)

    def verify(self, topology: cl.Topology) -> None:
        verify_placement("A", self.handle, topology.a.ip, {topology.a.ip}, self.timeouts.start)

    def shutdown(self) -> None:
        if ray.is_initialized():
            ray.kill(self.handle)


def verify_placement(role: str, actor, where: str, allowed: set, timeout: float) -> None:
    """The actor came up (its models loaded, bounded) on one of the ``allowed`` node IPs; else one sentence with the
    cause its creation task raised. An actor Ray is restarting (its process was lost a moment ago) is waited for,
    within the same bound."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ip = ray.get(actor.ping.remote(), timeout=max(deadline - time.monotonic(), 0.1))
            break
        except ray.exceptions.ActorUnavailableError:  # restarting: it answers once its process is back
            if time.monotonic() >= deadline:
                raise H3Timeout(f"the {role} actor on {where} was still restarting after {timeout:.0f} s; see the "
                                "Ray logs on that machine.") from None
            time.sleep(0.5)
        except ray.exceptions.GetTimeoutError as exc:
            raise H3Timeout(
                f"the {role} actor did not come up within {timeout:.0f} s on {where} (loading its models); see the "
                "Ray logs on that machine."
            ) from exc
        except ray.exceptions.RayError as exc:
            raise H3Error(f"the {role} actor failed to start on {where}: {creation_cause(exc)}") from None
    if ip not in allowed:
        raise H3Error(f"the {role} actor runs on {ip}, expected the {role} node {where}.")


def verify_driver_on_a(topology: cl.Topology) -> None:
    """In-process A must be a driver on the A node (its payloads go into A's object store)."""
    here = ray.get_runtime_context().get_node_id()
    if here != topology.a.node_id:
        raise H3Error(
            f"this process runs on Ray node {ray.util.get_node_ip_address()}, not on the A node "
            f"{topology.a.ip}: start ComfyUI on machine A and join the cluster there."
        )
