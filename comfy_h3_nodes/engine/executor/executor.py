"""The two-node executor: resident A and B actors, requests flowing between them by ObjectRef, every wait bounded.

A request is three remote calls: ``encode`` on A, ``denoise`` on B, ``decode`` on A. The payloads move actor to actor
(the caller passes ObjectRefs, never the tensors); the caller awaits only the small timing records and, at the end,
the decoded media. While B denoises, the caller polls B's ``progress`` (the step events) and notices a dead or stalled
B within its bounds. Several requests can be in flight (``max_in_flight``): A encodes k+1 while B denoises k and A
decodes k-1, because A's encode and decode run in separate concurrency groups and B serves its queue in order.

Split decode (:mod:`.split_decode`): when B holds the video VAE and has no denoise waiting, B decodes the last clips
of the request from the latents it already holds (its ``decode_share`` queues behind the denoise, on B's one compute
queue) while A receives the latents, decodes the first clips and blends B's in; the shares follow each side's
measured seconds per clip (``ClipClock``), ``decode_on`` (``auto``, ``A``, ``A+B``) chooses per request and every
decode record says what ran where and why. If B's share is lost, A decodes those clips itself and says so.

All scheduling runs on one private asyncio loop thread; the sync API (``generate``, ``run_many``) and the async API
(``agenerate``, usable from any event loop, ComfyUI's included) both hand work to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import ray

from .. import process as common
from ..model import catalog
from ...cluster import ray_cluster as cl
from . import pool as pl
from ..model import split_decode as sd
from ..contract import wire
from ..a_side.side import ASide, DecodedMedia
from ..a_side.actor import encoder_actor_class
from ..process import FORWARDED_ENV, unwrap_ray_error
from ..model.backends import BACKENDS
from ..contract.request import H3Request, validate_request
from ..contract.timing import StageRecord, TimingLog

log = logging.getLogger("comfy_h3.executor")

from ... import PACK_ROOT


#: what a caller sees when a worker's process or node is gone: died, unavailable (restarting, or its node not yet
#: judged), or unschedulable (a worker pinned to its node, and the node left the cluster)
WORKER_LOST = (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError,
               ray.exceptions.ActorUnschedulableError)

#: seconds to let the head judge B's node after B's actor became unavailable (node death shows ~1 s later)
NODE_SETTLE_S = 4.0


class H3Error(RuntimeError):
    """A failure of the distributed run; the message names the machine, the stage and the request."""


class H3Cancelled(H3Error):
    pass


class H3Timeout(H3Error):
    pass


@dataclass
class SideConfig:
    model_dir: str
    dtype: str = "bfloat16"
    attention_backend: str = "sdpa"
    device: str | None = None
    threads: int | None = None
    #: benchmark only: seconds each stage sleeps on top of its real work (``{"encode": 0.2}``; see ``bench``)
    synthetic_stages: dict = field(default_factory=dict)


@dataclass
class BConfig(SideConfig):
    partition: str = "transformer"
    #: storage precision of the transformer on B: "auto" (dtype; GGUF as stored), "bf16", "fp8", "gguf"
    precision: str = "auto"
    name: str = "h3_dit"
    namespace: str = cl.NAMESPACE
    allow_swap: bool = True
    max_restarts: int = -1
    #: B's video VAE decoder for split decode: "auto" (when B's memory plan fits it) or "off"
    decoder: str = "auto"


@dataclass(frozen=True)
class ActorClasses:
    """The Ray actor classes the executor places, as factories returning a ``ray.remote`` class: ``dit`` on each B
    node (the B side's), ``encoder`` on the A node (the engine's own). The engine never imports the B side: the
    code that decides which classes run where (:mod:`comfy_h3_nodes.placement`) sits above both and hands them in."""

    dit: Callable[[], object]
    encoder: Callable[[], object] = encoder_actor_class


#: what :func:`use_actor_classes` registered for executors built without ``actors=`` (set by ``placement``)
_DEFAULT_ACTORS: ActorClasses | None = None


def use_actor_classes(actors: ActorClasses) -> ActorClasses:
    """Register the actor classes of this process (the composition root calls it once)."""
    global _DEFAULT_ACTORS
    _DEFAULT_ACTORS = actors
    return actors


@dataclass
class Timeouts:
    start: float = 900.0       # loading a model (62 GB text encoder) on actor start
    health: float = 10.0       # a health or progress call
    encode: float = 900.0
    handoff: float = 300.0     # a receiver waiting for / fetching a payload
    stall: float = 900.0       # B making no step progress
    decode: float = 900.0
    poll: float = 0.1          # progress polling period


@dataclass
class StepEvent:
    request_id: str
    index: int
    total: int
    seconds: float


@dataclass
class Encoded:
    """A->B payload held in the object store on A (the ref), with its encode record."""

    request_id: str
    workflow: str
    payload_ref: object
    record: StageRecord
    num_inference_steps: int

    @property
    def shape(self) -> tuple | None:
        """(height, width, num_frames) of the request, from A's encode record."""
        i = self.record.info or {}
        return (i["height"], i["width"], i["num_frames"]) if "num_frames" in i else None


@dataclass
class Denoised:
    request_id: str
    workflow: str
    latents_ref: object
    records: list[StageRecord]
    shape: tuple | None = None  # (height, width, num_frames)


@dataclass
class DecodePlan:
    """How one request's video is decoded: by A alone, or split with B decoding clips ``[b_start, clips)``."""

    mode: str  # "A" | "A+B"
    clips: int
    b_start: int
    why: str
    decode_on: str = "auto"


@dataclass
class GenerationResult:
    request_id: str
    media: DecodedMedia
    records: list[StageRecord] = field(default_factory=list)

    def stage_seconds(self) -> dict[str, float]:
        from ..contract.timing import summarize

        return summarize(self.records)


class _LoopThread:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="h3-executor-loop", daemon=True)
        self.thread.start()

    def submit(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


async def _await_ref(ref, timeout: float):
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)


#: executors of this process, so a decode (ComfyUI's H3Decode) finds the one that holds its request's latents on B
_EXECUTORS: "weakref.WeakSet[H3Executor]" = weakref.WeakSet()


class H3Executor:
    def __init__(self, a: SideConfig, b: BConfig, *, max_in_flight: int = 2, timeouts: Timeouts | None = None,
                 env: dict | None = None, timing_log: TimingLog | None = None, a_name: str | None = None,
                 a_mode: str = "actor", local_a: ASide | None = None, decode_on: str = "auto",
                 min_split_s: float = 1.0, actors: ActorClasses | None = None):
        """``a_mode="actor"`` runs A in a Ray actor on the A node; ``"local"`` runs it in this process (ComfyUI),
        which must then be a driver on the A node. ``local_a`` reuses an already resident A side. ``decode_on`` is
        the default of every decode (``auto``: split when B is free and A alone would take ``min_split_s`` or more;
        ``A``; ``A+B``: split whenever B can). ``actors``: the actor classes to place (default: those the
        composition root, :mod:`comfy_h3_nodes.placement`, registered)."""
        if decode_on not in sd.DECODE_ON:
            raise ValueError(f"decode_on is {decode_on!r}; expected one of {sd.DECODE_ON}.")
        if a_mode not in ("actor", "local"):
            raise ValueError(f"a_mode is {a_mode!r}; expected 'actor' or 'local'.")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight is {max_in_flight}; it must be at least 1.")
        self.a_config, self.b_config = a, b
        self.actors = actors
        self.max_in_flight = max_in_flight
        self.timeouts = timeouts or Timeouts()
        self.env = dict(env or {})
        self.timings = timing_log or TimingLog()
        self.a_name = a_name
        self.a_mode = a_mode
        self.local_a = local_a
        self.clock_offset_s = 0.0  # B's clock minus this machine's, measured at every health check
        self.last_health: dict | None = None
        self.last_reconfigure = ""  # what the last reconcile_b_config changed on B ("" = nothing)
        self.a_max_restarts = -1  # a killed A actor comes back (reloading its models); requests in flight fail
        self._local_started = time.time()
        self.a = self.b = None
        self.topology: cl.Topology | None = None
        self._loop = _LoopThread()
        self._sem: asyncio.Semaphore | None = None
        self._cancelled: set[str] = set()
        self._in_flight = 0
        self.max_seen_in_flight = 0
        self.decode_on, self.min_split_s = decode_on, min_split_s
        self.clip_clock = sd.ClipClock()
        self._encoding = self._denoising = 0  # this executor's requests that are, or soon will be, B's work
        self._held: OrderedDict[str, object] = OrderedDict()  # local mode: latents refs on B, for a later decode
        self._shares: dict[str, list] = {}  # B's decode-share refs of running split decodes
        self.pool: pl.DiTPool | None = None  # the DiT workers b_config.name matches (one name, a list, a prefix*)
        self._worker_of: OrderedDict[str, pl.Worker] = OrderedDict()  # request -> the worker that denoises it
        self._reconciled: set[tuple] = set()  # (name, pid) of workers whose settings match this caller's
        self._pick_lock: asyncio.Lock | None = None  # one pick at a time (made on the executor loop)
        _EXECUTORS.add(self)

    # ------------------------------------------------------------------------------------------------ start
    def _runtime_env(self) -> dict:
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        env.update(self.env)
        pypath = os.environ.get("PYTHONPATH", "")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACK_ROOT), pypath) if p)
        return {"env_vars": env}

    def start(self) -> "H3Executor":
        """Validate topology, place (or find) both actors, verify where they run and that they match."""
        actors = self.actors or _DEFAULT_ACTORS
        if actors is None:
            raise H3Error("this executor was given no DiT actor class: build it with "
                          "actors=comfy_h3_nodes.placement.ACTORS (importing comfy_h3_nodes.placement registers them).")
        self.topology = cl.validate_topology()
        if self.a_mode == "local":
            here = ray.get_runtime_context().get_node_id()
            if here != self.topology.a.node_id:
                raise H3Error(
                    f"this process runs on Ray node {ray.util.get_node_ip_address()}, not on the A node "
                    f"{self.topology.a.ip}: start ComfyUI on machine A and join the cluster there."
                )
            if self.local_a is None and self.a_config.model_dir:
                c = self.a_config
                self.local_a = ASide(c.model_dir, dtype=c.dtype, attention_backend=c.attention_backend,
                                     device=c.device)
        else:
            a_opts = {"resources": {cl.ROLE_A: 1}, "runtime_env": self._runtime_env(),
                      "max_restarts": self.a_max_restarts, "max_task_retries": 0}
            if self.a_name:
                a_opts.update(name=self.a_name, namespace=self.b_config.namespace, get_if_exists=True)
            self.a = actors.encoder().options(**a_opts).remote(asdict(self.a_config))
        # the pool: every live worker the name spec matches; none yet (the embedded cluster): start one on B
        self.pool = pl.DiTPool(self.b_config.name, self.b_config.namespace,
                               status_timeout=min(self.timeouts.health, 5.0))
        found = self.pool.refresh()
        if found:
            self.b = found[0].handle
        else:
            name = pl.create_name(self.b_config.name)
            self.b = actors.dit().options(
                name=name, namespace=self.b_config.namespace, lifetime="detached", get_if_exists=True,
                resources={cl.ROLE_B: 1}, max_restarts=self.b_config.max_restarts, max_task_retries=0,
                runtime_env=self._runtime_env(),
            ).remote(asdict(dataclasses.replace(self.b_config, name=name)))
        self._verify_placement()
        health = self.check_health()
        self.reconcile_b_config(health["B"])
        for w in self.pool.refresh():
            self._reconcile_worker(w)
        return self

    def _reconcile_worker(self, w: "pl.Worker") -> None:
        """A worker of the pool serves this caller's settings (model, dtype, attention, precision) before it gets
        one of its requests; checked once per worker process."""
        key = (w.name, w.status.get("pid"))
        if key in self._reconciled:
            return
        health = ray.get(w.handle.health.remote(), timeout=self.timeouts.health)
        self.reconcile_b_config(health, w.handle)
        self._reconciled.add(key)

    def _measure_clock(self, bound: float, rounds: int = 3) -> tuple[float, float]:
        """B's clock minus this machine's, from the round trip with the smallest delay (NTP's estimate)."""
        best = None
        for _ in range(rounds):
            t0 = time.time()
            tb = ray.get(self.b.clock.remote(), timeout=bound)
            t1 = time.time()
            if best is None or t1 - t0 < best[1]:
                best = (tb - (t0 + t1) / 2, t1 - t0)
        return best

    def b_config_changes(self, b: dict) -> dict:
        """The load-time settings of this caller that the running B (its ``health``) does not serve: ``{key: new}``.

        The partition is not one of them: B swaps to the partition each workflow needs, per request, and every
        denoise record says which partition ran."""
        want, changes = self.b_config, {}
        if want.model_dir and not catalog.same_model(want.model_dir, b.get("model") or b["model_dir"]):
            changes["model_dir"] = want.model_dir
        if want.dtype != b["dtype"]:
            changes["dtype"] = want.dtype
        if BACKENDS.get(want.attention_backend, (want.attention_backend,))[0] != b["attention_backend"]:
            changes["attention_backend"] = want.attention_backend
        if want.precision != (b.get("precision") or "auto"):
            changes["precision"] = want.precision
        return changes

    def reconcile_b_config(self, b: dict, actor=None) -> dict:
        """One rule for every setting: a running B that serves other settings than this caller asked for is
        reconfigured to them (queued behind its running requests, then a reload) and the change is reported in
        ``last_reconfigure``; if B cannot apply them, one sentence names both values and the fix. Returns B's health.
        ``actor``: another worker of the pool than the primary ``b``."""
        changes = self.b_config_changes(b)
        primary = actor is None
        actor = self.b if actor is None else actor
        if primary:
            self.last_reconfigure = ""
        if not changes:
            return b
        names = {"model_dir": "model", "dtype": "dtype", "attention_backend": "attention backend",
                 "precision": "precision"}
        have = {"model_dir": b.get("model") or b["model_dir"], "dtype": b["dtype"],
                "attention_backend": b.get("attention_choice") or b["attention_backend"],
                "precision": b.get("precision") or "auto"}
        desc = ", ".join(f"{names[k]} {have[k]} -> {v}" for k, v in changes.items())
        log.info("B actor %r serves other settings; reconfiguring it: %s", self.b_config.name, desc)
        try:
            done = ray.get(actor.reconfigure.remote(changes), timeout=self.timeouts.start)
        except ray.exceptions.GetTimeoutError as exc:
            raise H3Timeout(f"B did not finish reconfiguring ({desc}) within {self.timeouts.start:.0f} s.") from exc
        except ray.exceptions.RayError as exc:
            raise H3Error(
                f"the B actor {self.b_config.name!r} serves {desc.replace(' -> ', ' and this node asks for ')}, and "
                f"could not switch: {_first_line(unwrap_ray_error(exc)).rstrip('.')}. Set the node to what B serves, "
                "or fix the cause above."
            ) from None
        if not primary:
            return ray.get(actor.health.remote(), timeout=self.timeouts.health)
        self.last_reconfigure = f"{desc} ({done['seconds']:.1f} s)"
        return self.check_health()["B"]

    def attach_b(self, name: str, namespace: str = cl.NAMESPACE):
        """Use an already running, named B actor (started by ``remote_worker setup`` or another driver)."""
        try:
            self.b = ray.get_actor(name, namespace=namespace)
        except ValueError as exc:
            raise H3Error(
                f"no DiT actor named {name!r} in namespace {namespace!r} on the cluster; start it on B with "
                "`python -m remote_worker setup`."
            ) from exc
        return self.b

    def _verify_placement(self) -> None:
        pairs = [("B", self.b, self.topology.b)]
        if self.a is not None:
            pairs.insert(0, ("A", self.a, self.topology.a))
        for role, actor, node in pairs:
            try:
                ip = ray.get(actor.ping.remote(), timeout=self.timeouts.start)
            except ray.exceptions.GetTimeoutError as exc:
                raise H3Timeout(
                    f"the {role} actor did not come up within {self.timeouts.start:.0f} s on {node.ip} "
                    "(loading its models); see the Ray logs on that machine."
                ) from exc
            except ray.exceptions.RayError as exc:
                inner = unwrap_ray_error(exc)
                raise H3Error(f"the {role} actor failed to start on {node.ip}: {_first_line(inner)}") from inner
            allowed = {n.ip for n in self.topology.b_nodes()} if role == "B" else {node.ip}
            if ip not in allowed:
                raise H3Error(f"the {role} actor runs on {ip}, expected the {role} node {node.ip}.")

    # ------------------------------------------------------------------------------------------------ health
    def check_health(self, timeout: float | None = None) -> dict:
        """Both actors answer within the health bound, and their versions agree (wire schema included)."""
        bound = timeout or self.timeouts.health
        out = {}
        if self.pool is not None:  # the primary worker left the pool: another one answers for B
            live = self.pool.refresh(min(bound, self.pool.status_timeout))
            ids = {w.handle._actor_id for w in live}
            if live and (self.b is None or self.b._actor_id not in ids):
                self.b = live[0].handle
            out["workers"] = self.pool.describe()
        if self.a_mode == "local" and self.local_a is not None:
            out["A"] = common.base_health("A", self.local_a, self._local_started)
        for role, actor in ([("A", self.a)] if self.a is not None else []) + [("B", self.b)]:
            try:
                out[role] = ray.get(actor.health.remote(), timeout=bound)
            except ray.exceptions.GetTimeoutError as exc:
                raise H3Timeout(f"machine {role} did not answer a health check within {bound:.0f} s.") from exc
            except ray.exceptions.RayError as exc:
                raise H3Error(f"machine {role} failed its health check: {_first_line(unwrap_ray_error(exc))}") from exc
        self.clock_offset_s, rtt = self._measure_clock(bound)
        out["clock"] = {"b_minus_a_s": self.clock_offset_s, "rtt_s": rtt}
        va, vb = (out["A"] if "A" in out else {"versions": common.versions()})["versions"], out["B"]["versions"]
        diff = {k: (va.get(k), vb.get(k)) for k in set(va) | set(vb) if va.get(k) != vb.get(k)}
        if diff:
            desc = ", ".join(f"{k} A={a} B={b}" for k, (a, b) in sorted(diff.items()))
            raise H3Error(f"A and B run different versions ({desc}); install the same versions on both machines.")
        out["topology"] = self.topology.to_dict() if self.topology else None
        self.last_health = out
        return out

    def load_records(self) -> dict[str, list]:
        a = (list(self.local_a.load_records) if self.a_mode == "local"
             else ray.get(self.a.load_records.remote(), timeout=self.timeouts.health))
        return {"A": a, "B": ray.get(self.b.load_records.remote(), timeout=self.timeouts.health)}

    # ------------------------------------------------------------------------------------------------ stages
    async def _encode(self, request: H3Request) -> Encoded:
        req = validate_request(request)  # clear errors before anything is sent
        rid = req.request_id
        self._encoding += 1
        try:
            return await self._encode_counted(req, rid)
        finally:
            self._encoding -= 1

    async def _encode_counted(self, req, rid) -> Encoded:
        if self.a_mode == "local":
            enc = await asyncio.to_thread(self.encode_local, req)
            self.timings.add([enc.record])
            return enc
        payload_ref, rec_ref = self.a.encode.remote(req)
        try:
            rec = await _await_ref(rec_ref, self.timeouts.encode)
        except asyncio.TimeoutError as exc:
            ray.cancel(payload_ref)
            raise H3Timeout(f"A did not finish encoding request {rid} within {self.timeouts.encode:.0f} s.") from exc
        except ray.exceptions.RayError as exc:
            raise _remote_error("A", "encode", rid, exc) from None
        self.timings.add([rec])
        return Encoded(rid, req.workflow, payload_ref, rec, req.steps)

    def encode_local(self, req) -> Encoded:
        """Encode in this process and put the payload into this node's object store (A's)."""
        w0, t0 = time.time(), time.perf_counter()
        payload = self.local_a.encode(req)
        t1 = time.perf_counter()
        return self.put_payload(payload, w0, t1 - t0)

    def put_payload(self, payload, started: float, compute_s: float) -> Encoded:
        t1 = time.perf_counter()
        ref = ray.put(payload)
        rec = StageRecord(payload.request_id, "encode", "A", ray.util.get_node_ip_address(), started, time.time(),
                          compute_s=compute_s, serialize_s=time.perf_counter() - t1, bytes=payload.field_bytes(),
                          info={"height": payload.height, "width": payload.width, "num_frames": payload.num_frames})
        return Encoded(payload.request_id, payload.workflow, ref, rec, payload.num_inference_steps)

    def receive_local(self, den: "Denoised"):
        """A (this process) receives B's latents: bounded wait, fetch, validate, materialise; timed here."""
        w0 = time.time()
        latents, wait_s, fetch_s = common.receive(den.latents_ref, self.timeouts.handoff, "A", "B->A",
                                                  den.request_id)
        t_v = time.perf_counter()
        latents.validate()
        validate_s = time.perf_counter() - t_v
        mat_s = common.materialize(latents)
        rec = StageRecord(den.request_id, "b_to_a", "A", ray.util.get_node_ip_address(), w0, time.time(),
                          producer_wait_s=wait_s, fetch_s=fetch_s, materialize_s=mat_s, validate_s=validate_s,
                          bytes=latents.field_bytes())
        return latents, rec

    def decode_local(self, latents, request_id: str):
        w0, t0 = time.time(), time.perf_counter()
        media = self.local_a.decode(latents, validated=True)  # receive_local validated it
        rec = StageRecord(request_id, "decode", "A", ray.util.get_node_ip_address(), w0, time.time(),
                          compute_s=time.perf_counter() - t0,
                          bytes={"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes)})
        return media, rec

    async def _denoise(self, enc: Encoded, on_step: Callable[[StepEvent], None] | None = None) -> Denoised:
        rid = enc.request_id
        if rid in self._cancelled:
            raise H3Cancelled(f"request {rid} was cancelled before B started it.")
        self._denoising += 1
        try:
            den = await self._denoise_counted(enc, rid, on_step)
        finally:
            self._denoising -= 1
        if self.a_mode == "local":  # a later decode (ComfyUI's H3Decode) may split it: B keeps the latents
            self._held[rid] = den.latents_ref
            while len(self._held) > 4:
                self._held.popitem(last=False)
        return den

    async def _denoise_counted(self, enc: Encoded, rid: str, on_step) -> Denoised:
        """Route the denoise to a worker of the pool (:func:`.pool.choose`); if that worker dies or leaves
        mid-request, run it once more on another one. B draws all noise from the seed, so the result is the same;
        the denoise record's note says it was re-run, and what was lost."""
        lost: list[tuple] = []  # (worker, exception, seconds lost)
        t0 = time.monotonic()
        while True:
            if lost and rid in self._cancelled:
                raise H3Cancelled(f"request {rid} was cancelled after its DiT worker was lost; not re-run.")
            w = await self._pick_worker(enc, rid, lost)
            rerun = ""
            if lost:
                old, exc, spent = lost[-1]
                rerun = (f"re-run on worker {w.name} ({w.node_ip}) after worker {old.name} ({old.node_ip}) was lost "
                         f"{spent:.1f} s into the request ({type(exc).__name__})")
            try:
                return await self._denoise_on(w, enc, rid, on_step, rerun)
            except _WorkerLost as gone:
                lost.append((w, gone.exc, time.monotonic() - t0))
                log.warning("[%s] DiT worker %s lost mid-request (%s)", rid, w.name, type(gone.exc).__name__)
                if len(lost) > 1:  # already re-run once
                    raise await self._lost_error(rid, lost, "it was already re-run once") from None

    async def _pick_worker(self, enc: Encoded, rid: str, lost: list) -> "pl.Worker":
        """The worker for this request, its settings reconciled and the request announced on its queue. The first
        pick waits (up to the start bound) for workers that exist but do not answer yet (restarting, loading); a
        re-run takes only workers that answer now, so a pool with none left is reported within seconds."""
        if self._pick_lock is None:
            self._pick_lock = asyncio.Lock()
        async with self._pick_lock:  # this client's next pick sees the request it just announced
            return await self._pick_locked(enc, rid, lost)

    async def _pick_locked(self, enc: Encoded, rid: str, lost: list) -> "pl.Worker":
        exclude = tuple(x[0].name for x in lost)
        bound = min(self.timeouts.health, 5.0)
        patience = 0.0 if lost else self.timeouts.start
        try:
            w = await asyncio.wait_for(asyncio.to_thread(self.pool.pick, enc.workflow, exclude, bound, patience),
                                       (patience or bound) + bound + 5)
        except (pl.PoolError, asyncio.TimeoutError) as exc:
            if lost:
                raise await self._lost_error(rid, lost, "no other DiT worker answers") from None
            raise H3Error(f"request {rid} cannot start on B: {exc}") from None
        if (w.name, w.status.get("pid")) not in self._reconciled:
            await asyncio.to_thread(self._reconcile_worker, w)
        self._worker_of[rid] = w
        while len(self._worker_of) > 64:
            self._worker_of.popitem(last=False)
        try:
            await _await_ref(w.handle.enqueue.remote(rid, enc.num_inference_steps, self.pool.client),
                             self.timeouts.health)
        except Exception:  # noqa: BLE001 - the denoise call itself reports a worker that is gone
            pass
        return w

    async def _lost_error(self, rid: str, lost: list, why: str) -> H3Error:
        """The one sentence for a request whose worker was lost and that no other worker could take over."""
        w, exc, _ = lost[-1]
        err = _remote_error("B", "denoise", rid, exc)
        # "unavailable" comes before the head has judged B's node (~1.5 s vs ~2.5 s): give it a moment
        settle = NODE_SETTLE_S if isinstance(exc, ray.exceptions.ActorUnavailableError) else 0.0
        if await self._b_node_gone(settle, w.status.get("node_id")):
            err = _node_lost_error("B", w.node_ip, "denoise", rid)
        names = ", ".join(x[0].name for x in lost)
        out = type(err)(f"{str(err).rstrip('.')} (DiT worker {names}; {why}, so it was not re-run).")
        return out

    async def _denoise_on(self, w: "pl.Worker", enc: Encoded, rid: str, on_step, rerun: str = "") -> Denoised:
        b = w.handle
        latents_ref, recs_ref = b.denoise.remote([enc.payload_ref], rid, self.timeouts.handoff)
        fut = asyncio.wrap_future(recs_ref.future())
        seen, last_progress, cancel_sent = 0, time.monotonic(), False
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=self.timeouts.poll)
                if done:
                    break
                if rid in self._cancelled and not cancel_sent:
                    b.cancel.remote(rid)
                    cancel_sent = True
                try:
                    prog = await _await_ref(b.progress.remote(rid), self.timeouts.health)
                except asyncio.TimeoutError:
                    prog = None  # B busy answering; the stall bound below still applies
                steps = prog["steps"] if prog else []
                if len(steps) > seen:
                    last_progress = time.monotonic()
                    for i, total, sec in steps[seen:]:
                        if on_step is not None:
                            on_step(StepEvent(rid, i, total, sec))
                    seen = len(steps)
                elif prog and prog["state"] in ("waiting", "queued"):
                    last_progress = time.monotonic()
                if time.monotonic() - last_progress > self.timeouts.stall:
                    b.cancel.remote(rid)
                    ray.cancel(recs_ref)
                    raise H3Timeout(
                        f"B made no denoise progress on request {rid} for {self.timeouts.stall:.0f} s; it was "
                        "asked to stop. Check B with `python -m remote_worker status`."
                    )
            records = list(fut.result())
            # the A->B record is B's (receiver's clock); the put into A's object store happened on A
            records[0] = dataclasses.replace(records[0], serialize_s=enc.record.serialize_s)
            records = [dataclasses.replace(r, clock_offset_s=self.clock_offset_s) for r in records]
            den_rec = records[1]
            records[1] = dataclasses.replace(
                den_rec, note="; ".join(x for x in (den_rec.note, rerun) if x),
                info={**(den_rec.info or {}), "worker": w.name, **({"rerun": rerun} if rerun else {})})
        except ray.exceptions.RayError as exc:
            err = _remote_error("B", "denoise", rid, exc)
            if rid in self._cancelled:
                raise H3Cancelled(f"request {rid} was cancelled; B stopped it between two steps.") from None
            if isinstance(exc, WORKER_LOST):
                raise _WorkerLost(exc) from None  # the caller re-runs it on another worker, or says why not
            raise err from None
        except BaseException:
            # the latents ref carries the same error; read it when it lands so Ray does not log it as unhandled
            latents_ref.future().add_done_callback(lambda f: f.cancelled() or f.exception())
            raise
        finally:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # mark a failure we reported another way as retrieved
        # steps that finished after the last poll
        if on_step is not None:
            for i, sec in enumerate(records[1].steps[seen:], start=seen):
                on_step(StepEvent(rid, i, len(records[1].steps), sec))
        self.timings.add(records)
        return Denoised(rid, enc.workflow, latents_ref, records, enc.shape)

    async def _b_node_gone(self, settle: float = 0.0, node_id: str | None = None) -> bool:
        """No alive Ray node offers role B any more (with ``node_id``: that B node is no longer alive): the head's
        health checks lost machine B (down, its raylet killed, or the link cut), as opposed to only B's actor
        process dying. Asks the GCS on A, for up to ``settle`` seconds while B's node still counts as alive; every
        call bounded."""
        deadline = time.monotonic() + settle
        while True:
            try:
                nodes = await asyncio.wait_for(asyncio.to_thread(cl.list_nodes), self.timeouts.health)
            except Exception:  # the GCS did not answer either: keep the actor's own error
                return False
            if not any(n.alive and cl.ROLE_B in n.roles and (node_id is None or n.node_id == node_id)
                       for n in nodes):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.25)

    # ------------------------------------------------------------------------------------------------ decode
    def _a_decoder(self, side: ASide | None = None) -> dict:
        """A's video VAE facts (dtype, weights fingerprint, clip geometry): from ``side`` or the local A, else from
        A's actor (asked once)."""
        side = side or self.local_a
        if side is not None:
            return side.decoder_info()
        known = ((self.last_health or {}).get("A") or {}).get("video_vae")
        if known is not None:  # A's actor said so at its last health check
            return known
        return ray.get(self.a.health.remote(), timeout=self.timeouts.health)["video_vae"]

    def _b_queue(self) -> int:
        """This executor's requests that are being encoded for B or denoised on B (B's queued work)."""
        return self._encoding + self._denoising

    def plan_decode(self, height: int, width: int, num_frames: int, decode_on: str | None = None,
                    b_clips: int | None = None, side: ASide | None = None) -> DecodePlan:
        """The decode of one request: by A alone, or split (B decodes the last clips). ``b_clips`` forces B's share
        (tests, benchmarks); otherwise it follows the measured seconds per clip of each side."""
        choice = decode_on or self.decode_on
        if choice not in sd.DECODE_ON:
            raise ValueError(f"decode_on is {choice!r}; expected one of {sd.DECODE_ON}.")
        a = self._a_decoder(side)
        n = sd.clips_for(a, wire.video_latent_frames(num_frames))

        def alone(why: str) -> DecodePlan:
            return DecodePlan("A", n, n, why, choice)

        if choice == "A":
            return alone("decode_on 'A'")
        b = ((self.last_health or {}).get("B") or {}).get("video_vae") or {}
        if not b.get("resident"):
            return alone(f"B holds no video VAE ({b.get('note') or 'this B does not say'})")
        if b.get("dtype") != a["dtype"] or b.get("fingerprint") != a["fingerprint"]:
            return alone(f"B's video VAE ({b.get('dtype')}, weights {b.get('fingerprint')}) is not A's "
                         f"({a['dtype']}, weights {a['fingerprint']}): the frames would differ")
        alone_s = self.clip_clock.clip_s("A alone", height, width) or self.clip_clock.clip_s("A", height, width)
        if choice == "auto":
            if self._b_queue():
                return alone(f"B has {self._b_queue()} more request(s) waiting: A decodes alone")
            if alone_s is None:
                return alone("A's seconds per clip are not measured yet (this decode measures them)")
            if n * alone_s < self.min_split_s:
                return alone(f"A alone takes about {n * alone_s:.2f} s, under the {self.min_split_s:g} s worth "
                             "splitting")
        a_s = self.clip_clock.clip_s("A", height, width) or 1.0
        b_s = self.clip_clock.clip_s("B", height, width) or a_s  # unmeasured: as fast as A (two equal machines)
        fetch = self.clip_clock.fetch_clip_s(height, width)
        k = sd.choose_b_clips(n, a_s, b_s, 0.0, fetch) if b_clips is None else max(0, min(int(b_clips), n))
        if k == 0:
            return alone(f"the measured clip times give B no clip (A {a_s:.3f} s, B {b_s:.3f} s, "
                         f"fetch {fetch:.3f} s per clip)")
        why = (f"B decodes clips {n - k}-{n - 1} of {n}" + (" (forced)" if b_clips is not None else
               f": A {a_s:.3f} s, B {b_s:.3f} s, fetch {fetch:.3f} s per clip, predicted "
               f"{sd.predicted_s(n, k, a_s, b_s, 0.0, fetch):.2f} s vs {n * (alone_s or a_s):.2f} s on A alone"))
        return DecodePlan("A+B", n, n - k, why, choice)

    def _learn(self, records: list[StageRecord], height: int, width: int, clips: int) -> None:
        """Feed each side's measured seconds per clip (and B's frames' fetch per clip) to the clock."""
        for r in records:
            if r.stage != "decode":
                continue
            info = r.info or {}
            if r.machine == "B":
                self.clip_clock.add("B", len(info.get("clip_s", ())), sum(info.get("clip_s", ())), height, width)
            elif info.get("decode_on") == "A+B":
                own = [s for i, s in zip(info["a_decoded"], info["a_clip_s"]) if i < info["a_clips"][1]]
                self.clip_clock.add("A", len(own), sum(own), height, width)
                got = len(info.get("b_received", ()))
                if got:
                    self.clip_clock.add_fetch(got, r.fetch_s + r.materialize_s, height, width)
            else:
                self.clip_clock.add("A alone", clips, r.compute_s, height, width)

    def _start_b_share(self, latents_ref, rid: str, plan: DecodePlan) -> list:
        """B's share of a split decode, queued on B's compute queue; its refs (clips, then B's record)."""
        refs = self._b_of(rid).decode_share.options(num_returns=plan.clips - plan.b_start + 1).remote(
            [latents_ref], rid, plan.b_start, plan.clips, self.timeouts.handoff)
        refs = list(refs)
        self._shares[rid] = refs

        def failed(f):  # a failed share A never read (cancel, A failed) must not be logged as an unhandled error
            if not f.cancelled() and f.exception() is not None:
                for r in refs[:-1]:  # the clips carry the same (small) error; never fetch frames here
                    r.future().add_done_callback(lambda g: g.cancelled() or g.exception())

        refs[-1].future().add_done_callback(failed)
        return refs

    def _alone_record(self, rec: StageRecord, plan: DecodePlan) -> StageRecord:
        note = "; ".join(x for x in (rec.note, "" if plan.decode_on == "A" else f"A decoded alone: {plan.why}") if x)
        return dataclasses.replace(rec, note=note, info={**(rec.info or {}), "decode_on": "A", "clips": plan.clips,
                                                         "why": plan.why})

    def decode_split_local(self, side: ASide, latents: wire.DenoisedLatents, latents_ref, plan: DecodePlan,
                           should_cancel: Callable[[], bool] | None = None) -> tuple[DecodedMedia, list[StageRecord]]:
        """A split decode with A in this process: B's share from ``latents_ref`` (in B's store), A's clips and the
        blend here. Returns the media and ``[decode on A, decode on B?]``."""
        from ..a_side.actor import split_decode_records

        rid = latents.request_id
        cancelled = (lambda: rid in self._cancelled or bool(should_cancel and should_cancel()))  # noqa: E731
        refs = self._start_b_share(latents_ref, rid, plan)
        try:
            share = common.ShareReceiver(refs, plan.b_start, latents.height, latents.width, self.timeouts.handoff,
                                         rid, cancelled)
            w1 = time.time()
            try:
                media, served = side.decode_split(latents, share, cancelled, validated=True)
            except sd.DecodeCancelled:
                self.cancel(rid)
                raise H3Cancelled(f"request {rid} was cancelled during its decode; A and B stopped.") from None
        finally:
            self._shares.pop(rid, None)
        recs = split_decode_records(rid, ray.util.get_node_ip_address(), w1, media, served, share)
        return media, self._b_clock(recs)

    def _b_clock(self, records: list[StageRecord]) -> list[StageRecord]:
        return [dataclasses.replace(r, clock_offset_s=self.clock_offset_s) if r.machine == "B" else r
                for r in records]

    async def _decode(self, den: Denoised, decode_on: str | None = None,
                      b_clips: int | None = None) -> tuple[DecodedMedia, list[StageRecord]]:
        rid = den.request_id
        self._held.pop(rid, None)
        if self.a_mode == "local":
            latents, b_to_a = await asyncio.to_thread(self.receive_local, den)
            shape = (latents.height, latents.width, latents.num_frames)
            plan = self.plan_decode(*shape, decode_on, b_clips)
            if plan.mode == "A+B":
                media, recs = await asyncio.to_thread(self.decode_split_local, self.local_a, latents,
                                                      den.latents_ref, plan)
            else:
                media, dec = await asyncio.to_thread(self.decode_local, latents, rid)
                recs = [self._alone_record(dec, plan)]
            self._learn(recs, shape[0], shape[1], plan.clips)
            self.timings.add([b_to_a, *recs])
            return media, [b_to_a, *recs]
        plan = (self.plan_decode(*den.shape, decode_on, b_clips) if den.shape is not None
                else DecodePlan("A", 0, 0, "the request's canvas is unknown", decode_on or self.decode_on))
        if plan.mode == "A+B":
            refs = self._start_b_share(den.latents_ref, rid, plan)
            media_ref, recs_ref = self.a.decode_split.remote([den.latents_ref], rid, refs, plan.b_start,
                                                             self.timeouts.handoff)
        else:
            media_ref, recs_ref = self.a.decode.remote([den.latents_ref], rid, self.timeouts.handoff)
        try:
            records = await _await_ref(recs_ref, self.timeouts.decode)
            media = await _await_ref(media_ref, self.timeouts.decode)
        except asyncio.TimeoutError as exc:
            self.cancel(rid)
            raise H3Timeout(f"A did not finish decoding request {rid} within {self.timeouts.decode:.0f} s.") from exc
        except ray.exceptions.RayError as exc:
            if rid in self._cancelled or type(unwrap_ray_error(exc)).__name__ == "DecodeCancelled":
                raise H3Cancelled(f"request {rid} was cancelled during its decode; A and B stopped.") from None
            raise _remote_error("A", "decode", rid, exc) from None
        finally:
            self._shares.pop(rid, None)
        if plan.mode == "A":
            records = [records[0], self._alone_record(records[1], plan)]
        records = self._b_clock(list(records))
        if den.shape is not None:
            self._learn(records, den.shape[0], den.shape[1], plan.clips)
        self.timings.add(records)
        return media, records

    def decode_received(self, side: ASide, latents: wire.DenoisedLatents, decode_on: str | None = None,
                        should_cancel: Callable[[], bool] | None = None,
                        b_clips: int | None = None) -> tuple[DecodedMedia, list[StageRecord], DecodePlan]:
        """Decode latents A already received (ComfyUI's H3Decode): split with B when the plan says so and B still
        holds them, else on ``side`` alone. Returns the media, the decode records and the plan."""
        rid = latents.request_id
        ref = self._held.pop(rid, None)
        plan = self.plan_decode(latents.height, latents.width, latents.num_frames, decode_on, b_clips, side)
        if plan.mode == "A+B" and ref is None:
            plan = DecodePlan("A", plan.clips, plan.clips, "B no longer holds this request's latents",
                              plan.decode_on)
        if plan.mode == "A+B":
            try:
                media, recs = self.decode_split_local(side, latents, ref, plan, should_cancel)
            finally:
                self._cancelled.discard(rid)
        else:
            w0, t0 = time.time(), time.perf_counter()
            media = side.decode(latents)
            recs = [self._alone_record(
                StageRecord(rid, "decode", "A", ray.util.get_node_ip_address(), w0, time.time(),
                            compute_s=time.perf_counter() - t0,
                            bytes={"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes)}), plan)]
        self._learn(recs, latents.height, latents.width, plan.clips)
        self.timings.add(recs)
        return media, recs, plan

    async def _generate(self, request: H3Request, on_step=None) -> GenerationResult:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.max_in_flight)
        async with self._sem:
            self._in_flight += 1
            self.max_seen_in_flight = max(self.max_seen_in_flight, self._in_flight)
            try:
                enc = await self._encode(request)
                enc_record = enc.record
                den = await self._denoise(enc, on_step)
                del enc  # drop the A->B payload ref as soon as B has it: the object store frees it
                if request.request_id in self._cancelled:
                    raise H3Cancelled(f"request {request.request_id} was cancelled after B finished; not decoded.")
                media, dec_records = await self._decode(den)
                return GenerationResult(den.request_id, media, [enc_record, *den.records, *dec_records])
            finally:
                self._in_flight -= 1
                self._cancelled.discard(request.request_id)

    # ------------------------------------------------------------------------------------------------ public
    def set_max_in_flight(self, n: int) -> None:
        """Change the bound for requests submitted from now on (those in flight keep theirs)."""
        if n < 1:
            raise ValueError(f"max_in_flight is {n}; it must be at least 1.")
        self.max_in_flight = n
        self._sem = None  # created lazily on the executor loop with the new bound

    def submit(self, request: H3Request, on_step=None) -> Future:
        """Start a request; returns a Future of :class:`GenerationResult` (bounded by ``max_in_flight``)."""
        return self._loop.submit(self._generate(request, on_step))

    def generate(self, request: H3Request, on_step=None) -> GenerationResult:
        return self.submit(request, on_step).result()

    async def agenerate(self, request: H3Request, on_step=None) -> GenerationResult:
        return await asyncio.wrap_future(self.submit(request, on_step))

    def run_many(self, requests: Iterable[H3Request], on_step=None) -> list[GenerationResult]:
        futures = [self.submit(r, on_step) for r in requests]
        return [f.result() for f in futures]

    def run_stage(self, coro):
        """Run one stage coroutine (``encode``/``denoise``/``decode``) on the executor loop from any thread."""
        return self._loop.submit(coro)

    async def adenoise(self, enc: Encoded, on_step=None) -> Denoised:
        """B's denoise of an encoded request, awaited on the executor's loop (batches compose stages with it)."""
        return await self._denoise(enc, on_step)

    def cancelled_ids(self) -> frozenset:
        return frozenset(self._cancelled)

    def clear_cancel(self, request_id: str) -> None:
        """Forget a cancel flag once its request has ended (a batch's requests end outside ``_generate``)."""
        self._cancelled.discard(request_id)

    def submit_denoise(self, enc: Encoded, on_step=None) -> Future:
        """Start B's denoise of an already encoded request; a Future of :class:`Denoised`."""
        return self.run_stage(self._denoise(enc, on_step))

    def encode(self, request: H3Request) -> Encoded:
        return self.run_stage(self._encode(request)).result()

    def denoise(self, enc: Encoded, on_step=None) -> Denoised:
        return self.run_stage(self._denoise(enc, on_step)).result()

    def decode(self, den: Denoised, decode_on: str | None = None,
               b_clips: int | None = None) -> tuple[DecodedMedia, list[StageRecord]]:
        return self.run_stage(self._decode(den, decode_on, b_clips)).result()

    def cancel(self, request_id: str) -> None:
        """Cancel a request: B stops before its next step; a request not yet on B never starts there; a split
        decode stops on both machines before their next clip."""
        self._cancelled.add(request_id)
        b = self._b_of(request_id)
        if b is not None:
            b.cancel.remote(request_id)
            if request_id in self._worker_of:
                b.dequeue.remote(request_id)  # announced but not started: off the worker's queue now
        if self.a is not None:
            self.a.cancel.remote(request_id)
        for ref in self._shares.get(request_id, ())[:1]:
            try:
                ray.cancel(ref)  # still queued on B: never starts (a running share stops at its next clip)
            except Exception:  # noqa: BLE001 - already finished or not cancellable
                pass

    def _b_of(self, request_id: str):
        """The worker that denoises (or denoised, and holds the latents of) ``request_id``; else the primary B."""
        w = self._worker_of.get(request_id)
        return w.handle if w is not None else self.b

    def shutdown(self, kill_b: bool = False) -> None:
        if ray.is_initialized():
            if self.a is not None:
                ray.kill(self.a)
            if kill_b and self.b is not None:
                ray.kill(self.b)
        self.a = None
        if kill_b:
            self.b = None
        self._loop.stop()


class _WorkerLost(Exception):
    """The worker denoising a request died or left the cluster (the request may run again on another)."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.exc = exc


def release_held(request_id: str) -> None:
    """A decoded ``request_id`` no longer needs B's copy of its latents: let the object store free it."""
    ex = holder_of(request_id)
    if ex is not None:
        ex._held.pop(request_id, None)


def holder_of(request_id: str) -> "H3Executor | None":
    """The executor of this process whose B still holds ``request_id``'s latents (denoised, not yet decoded)."""
    for ex in list(_EXECUTORS):
        if request_id in ex._held:
            return ex
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _node_lost_error(machine: str, ip: str, stage: str, rid: str) -> H3Error:
    return H3Error(
        f"machine {machine} ({ip}) left the Ray cluster during {stage} of request {rid}: its node stopped answering "
        f"the head's health checks (machine {machine} down, its Ray node stopped, or the network link between A and "
        f"{machine} lost). Once {machine}'s node is back (`python -m remote_worker setup` on {machine}, or its "
        "service) the DiT actor is recreated there: run the request again."
    )


def _remote_error(machine: str, stage: str, rid: str, exc: BaseException) -> H3Error:
    inner = unwrap_ray_error(exc)
    if type(inner).__name__ in ("DenoiseCancelled", "DecodeCancelled"):
        return H3Cancelled(str(inner))
    if isinstance(exc, WORKER_LOST):
        return H3Error(
            f"machine {machine}'s actor died during {stage} of request {rid} ({type(exc).__name__}); it is "
            "restarted automatically where its restart policy allows: run the request again."
        )
    if isinstance(inner, ValueError):  # validation errors keep their own clear sentence
        err = H3Error(f"{machine} refused request {rid} at {stage}: {inner}")
        err.__cause__ = inner
        return err
    return H3Error(f"{machine} failed during {stage} of request {rid}: {_first_line(inner)}")
