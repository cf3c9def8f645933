"""The two-machine executor, composed of its parts: an A client (:mod:`.a_client`: A in this process, or A's actor),
the B client (:mod:`.b_client`: the DiT workers, routing, denoise, re-run, cancel), the decode planner
(:mod:`.decode_plan`), health (:mod:`.health`) and the one pipeline (:mod:`.pipeline`) that makes a :class:`Job` of
every request.

A request is three steps: ``encode`` on A, ``denoise`` on B, ``decode`` on A (or split with B). The payloads move
actor to actor by ObjectRef; the caller awaits only the small timing records and, at the end, the decoded media.
Several requests can be in flight (``max_in_flight``): A encodes k+1 while B denoises k and A decodes k-1.

All scheduling runs on one private asyncio loop thread; the sync API (``generate``, ``run_many``) and the async API
(``agenerate``, usable from any event loop, ComfyUI's included) both hand work to it.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable

import ray

from ...cluster import ray_cluster as cl
from ..contract.configs import BConfig, SideConfig, Timeouts
from ..contract.errors import H3Error
from ..contract.request import DenoiseParams, EncodeRequest, H3Request, validate_encode, validate_request
from ..contract.timing import StageRecord, TimingLog
from . import health as hl
from .a_client import ActorA, Conditioning, LocalA, verify_driver_on_a, verify_placement
from .b_client import BClient
from ..model.backends import BACKENDS
from .decode_plan import DecodePlan, DecodePlanner
from .group import A_RANK_NAME, Groups
from .pipeline import GenerationResult, Job, Pipeline, Slots
from .failures import remote_error
from .remote_forward import RemoteSampling


@dataclass(frozen=True)
class ActorClasses:
    """What the executor places, handed in from above (:mod:`comfy_h3_nodes.placement`), so the engine never imports
    the B side: ``dit(config: dict) -> handle`` starts a detached DiT worker on a B node (the B side's one factory),
    ``encoder()`` is the Ray class of A's actor."""

    dit: Callable[..., object]
    encoder: Callable[[], object]


#: what :func:`use_actor_classes` registered for executors built without ``actors=`` (set by ``placement``)
_DEFAULT_ACTORS: ActorClasses | None = None


def use_actor_classes(actors: ActorClasses) -> ActorClasses:
    """Register the actor classes of this process (the composition root calls it once)."""
    global _DEFAULT_ACTORS
    _DEFAULT_ACTORS = actors
    return actors


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


class H3Executor:
    def __init__(self, a, b: BConfig, *, max_in_flight: int = 2, timeouts: Timeouts | None = None,
                 env: dict | None = None, timing_log: TimingLog | None = None, a_name: str | None = None,
                 decode_on: str = "auto", min_split_s: float = 1.0, actors: ActorClasses | None = None,
                 parallel: str = "off", a_rank: dict | None = None):
        """``a``: a :class:`SideConfig` (A's actor on the A node), a resident A side (A in this process, as in
        ComfyUI, which must then be a driver on the A node), or None (A is given per decode: ComfyUI's nodes).
        ``decode_on`` is the default of every decode (``auto``: split when B is free and A alone would take
        ``min_split_s`` or more; ``A``; ``A+B``: split whenever B can). ``actors``: what to place (default: what
        the composition root, :mod:`comfy_h3_nodes.placement`, registered). ``parallel``: which machines denoise a
        request together (``off``, ``A+B``, ``all``, ``auto``; :mod:`.group`); ``a_rank``: settings of A's DiT rank
        that differ from B's (``precision``, ``memory_limit_bytes``)."""
        self.a_config, self.b_config = (a if isinstance(a, SideConfig) else None), b
        self.actors = actors
        self.timeouts = timeouts or Timeouts()
        self.env = dict(env or {})
        self.timings = timing_log or TimingLog()
        self.a_name = a_name
        self.a = None if a is None or isinstance(a, SideConfig) else LocalA(a, self.timeouts)
        self.last_health: dict | None = None
        self.topology: cl.Topology | None = None
        self.planner = DecodePlanner(decode_on, min_split_s)
        self._loop = _LoopThread()
        self.bclient = BClient(b, self.timeouts, parallel=parallel)
        self.a_rank_settings = dict(a_rank or {})
        self.pipeline = Pipeline(self.bclient, self.planner, self._loop.submit, self.timings, max_in_flight,
                                 lambda: self.last_health)

    # ------------------------------------------------------------------------------------------------ start
    def start(self) -> "H3Executor":
        """Validate topology, place (or find) A's actor and the DiT workers, verify where they run and that they
        match this caller's settings."""
        actors = self.actors or _DEFAULT_ACTORS
        if actors is None:
            raise H3Error("this executor was given no DiT actor class: build it with "
                          "actors=comfy_h3_nodes.placement.ACTORS (importing comfy_h3_nodes.placement registers them).")
        self.topology = cl.validate_topology()
        if self.a_config is not None:
            self.a = ActorA(self.a_config, actors.encoder, self.timeouts, self.a_name, self.b_config.namespace,
                            self.env)
        if self.a is not None:
            self.a.verify(self.topology)
        else:  # A is given per call (ComfyUI's nodes): in this process, which must be on the A node
            verify_driver_on_a(self.topology)
        self.bclient.start_dit = lambda cfg: actors.dit(cfg, env=self.env)
        self.bclient.groups = Groups(lambda: self._start_a_rank(actors), self.timeouts,
                                     BACKENDS.get(self.b_config.attention_backend, ("native",))[0],
                                     reconcile=self.bclient.reconcile, a_work_s=self._a_work_s)
        self.bclient.start()
        verify_placement("B", self.bclient.primary, self.topology.b.ip, {n.ip for n in self.topology.b_nodes()},
                         self.timeouts.start)
        self.reconcile_b_config(self.check_health()["B"])
        self.bclient.reconcile_all()
        return self

    def _start_a_rank(self, actors: ActorClasses):
        """A's DiT rank for parallel denoise: B's settings (same model, partition, precision), on A's node, in its
        own process, without a video VAE (A decodes with its own)."""
        cfg = {**asdict(replace(self.b_config, name=A_RANK_NAME, max_restarts=0, decoder="off")),
               **self.a_rank_settings}
        return actors.dit(cfg, node_id=self.topology.a.node_id, role="A", env=self.env)

    def a_rank(self):
        """A's DiT rank (parallel denoise) when this executor started one: its ``Rank`` (name, handle), else None."""
        groups = getattr(self.bclient, "groups", None)
        return groups.a_rank if groups is not None else None

    def _a_work_s(self, last: int = 8) -> float | None:
        """A's measured seconds of work per request (encode + decode), the median of its last requests' records."""
        per: dict[str, dict] = {}
        for r in self.timings.records()[-400:]:
            if r.stage in ("encode", "decode") and r.machine == "A":
                per.setdefault(r.request_id.split(".")[0], {})[r.stage] = r.compute_s
        both = sorted(v["encode"] + v["decode"] for v in list(per.values())[-last:] if len(v) == 2)
        return both[len(both) // 2] if both else None

    # ------------------------------------------------------------------------------------------------ health
    def check_health(self, timeout: float | None = None) -> dict:
        """Both machines answer within the health bound, and their versions agree (wire schema included)."""
        self.last_health = hl.check(self.a, self.bclient, timeout or self.timeouts.health, self.topology)
        groups = self.bclient.groups
        self.last_health["group"] = groups.describe() if groups is not None else None
        return self.last_health

    def b_config_changes(self, b: dict) -> dict:
        return self.bclient.changes(b)

    def reconcile_b_config(self, b: dict) -> dict:
        """A running B that serves other settings than this caller's is reconfigured to them (see
        :meth:`.b_client.BClient.reconcile`); returns B's health afterwards."""
        return self.check_health()["B"] if self.bclient.reconcile(b) else b

    @property
    def last_reconfigure(self) -> str:
        return self.bclient.last_reconfigure

    @property
    def b(self):
        """The primary DiT worker's handle."""
        return self.bclient.primary

    @property
    def pool(self):
        """The DiT workers ``b_config.name`` matches (:class:`.pool.DiTPool`)."""
        return self.bclient.pool

    @property
    def clock_offset_s(self) -> float:
        return self.bclient.clock_offset_s

    @property
    def clip_clock(self):
        return self.planner.clock

    @property
    def max_seen_in_flight(self) -> int:
        return self.pipeline.slots.max_seen

    @max_seen_in_flight.setter
    def max_seen_in_flight(self, value: int) -> None:
        self.pipeline.slots.max_seen = value

    def load_records(self) -> dict[str, list]:
        return {"A": self.a.load_records() if self.a is not None else [],
                "B": ray.get(self.b.load_records.remote(), timeout=self.timeouts.health)}

    def check_adapter(self, path: str) -> str:
        """The LoRA ``path`` checked on every DiT worker (bounded): its resolved path on B, or an
        :class:`H3Error` with B's sentence."""
        handles = [w.handle for w in self.pool.workers.values()] or [self.b]
        answers = ray.get([h.check_adapter.remote(path) for h in handles], timeout=self.timeouts.health)
        bad = next((a for a in answers if not a["ok"]), None)
        if bad is not None:
            raise H3Error(bad["error"])
        return answers[0]["path"]

    # ------------------------------------------------------------------------------------------------ ComfyUI's samplers
    def transformer_file(self, partition: str = "transformer") -> dict:
        """The t2va transformer file B serves, as A's ComfyUI builds its model from it (names, shapes, dtypes,
        metadata; bounded). A folder or a failure comes back as :class:`H3Error` with B's sentence."""
        try:
            return ray.get(self.b.transformer_file.remote(partition), timeout=self.timeouts.health)
        except ray.exceptions.RayError as exc:
            raise remote_error("B", "the transformer file's description", "-", exc) from None

    def open_sampling(self) -> RemoteSampling:
        """The forwards of one sampler run, on B's primary worker (the one this executor's health checks), or with
        ``parallel`` on the DiT group of A's rank and B's worker(s) (formed once, kept for the next samplings)."""
        sampling = RemoteSampling(self.b, self.bclient.primary_name or self.bclient.config.name,
                                  clock_offset_s=self.clock_offset_s, forward_timeout=self.timeouts.stall, poll=self.timeouts.poll)
        w = self.pool.workers.get(sampling.worker)
        if w is not None:  # B's node, probed when a forward goes unanswered (a cut link, a lost host)
            sampling.node_id, sampling.node_ip = w.status.get("node_id"), w.node_ip
        groups, mode = self.bclient.groups, self.bclient.parallel
        if mode == "off" or groups is None:
            return sampling
        if mode not in ("A+B", "all"):
            raise H3Error(f"parallel {mode!r} is not for ComfyUI's own samplers: choose off, A+B or all.")
        workflow = "ref2va" if self.b_config.partition == "transformer_ref" else "t2va"
        before, timed = groups.current, {}
        bound = 2 * self.timeouts.start + 30  # A's rank may start (and load) first: bounded all the same
        try:
            group = self._loop.submit(groups.for_sampling(self.bclient, mode, workflow, timed)).result(timeout=bound)
        except FutureTimeout:
            raise H3Error(f"the DiT group of parallel {mode} did not form within {bound:.0f} s (A's rank starting, "
                          "or a B worker busy): set parallel to off, or check python -m remote_worker status.") from None
        sampling.group, sampling.on_lost = group, self._ranks_lost
        sampling.ran_on = {"group": group.group_id, "method": group.method,
                           "ranks": [f"{r.machine} {r.name}" for r in group.ranks],
                           "formed_s": round(group.formed_s, 4) if group is not before else 0.0,
                           "a_start_s": round(timed.get("a_start_s", 0.0), 4),
                           "reloaded_s": dict(group.reloaded_s) if group is not before else {}}
        return sampling

    def _ranks_lost(self, lost: list) -> None:
        """A sampling lost ``lost`` ranks: the group is dropped (the next sampling forms one again), and a lost A
        rank is started again on the next use."""
        groups = self.bclient.groups
        groups.current = None
        if any(r.machine == "A" for r in lost):
            groups.a_rank = None

    # ------------------------------------------------------------------------------------------------ requests
    def encode(self, request: EncodeRequest, a=None) -> Conditioning:
        """Start encoding ``request`` on ``a`` (default: this executor's A); checked first, in one sentence."""
        return self._a(a).encode(validate_encode(request))

    def denoise(self, cond: Conditioning, params: DenoiseParams | None = None, on_step=None) -> Job:
        """B's denoise of an encoded request, waited for; the job holds its latents (on B, and on an in-process
        A)."""
        job = self.submit_denoise(cond, params, on_step)
        job.result()
        return job

    def submit_denoise(self, cond: Conditioning, params: DenoiseParams | None = None, on_step=None,
                       slots: Slots | None = None, on_done: Callable | None = None) -> Job:
        return self.pipeline.denoise(cond, params or DenoiseParams(), on_step, slots, on_done)

    def decode(self, job: Job, decode_on: str | None = None, b_clips: int | None = None,
               a=None) -> tuple[object, list[StageRecord]]:
        media, records, _ = job.decode(self._a(a) if a is not None else None, decode_on, b_clips)
        return media, records

    def plan_decode(self, height: int, width: int, num_frames: int, decode_on: str | None = None,
                    b_clips: int | None = None, a=None) -> DecodePlan:
        b = ((self.last_health or {}).get("B") or {}).get("video_vae")
        return self.planner.plan(height, width, num_frames, self._a(a).decoder_info(), b, self.bclient.pending,
                                 decode_on, b_clips)

    def submit(self, request: H3Request, on_step=None) -> Future:
        """Start a whole request; a Future of :class:`GenerationResult` (bounded by ``max_in_flight``)."""
        req = validate_request(request)  # clear errors before anything is sent
        return self._loop.submit(self.pipeline.generate(self._a(), req, on_step))

    def generate(self, request: H3Request, on_step=None) -> GenerationResult:
        return self.submit(request, on_step).result()

    async def agenerate(self, request: H3Request, on_step=None) -> GenerationResult:
        return await asyncio.wrap_future(self.submit(request, on_step))

    def run_many(self, requests: Iterable[H3Request], on_step=None) -> list[GenerationResult]:
        futures = [self.submit(r, on_step) for r in requests]
        return [f.result() for f in futures]

    def set_max_in_flight(self, n: int) -> None:
        """Change the bound for requests submitted from now on (those in flight keep theirs)."""
        self.pipeline.slots = Slots(n)

    def cancel(self, request_id: str) -> None:
        """Cancel a request: B stops before its next step; a request not yet on B never starts there; a split
        decode stops on both machines before their next clip."""
        self.bclient.cancel(request_id)
        if self.a is not None:
            self.a.cancel(request_id)

    def _a(self, a=None):
        """An A client: ``a`` (a client, or a resident A side: wrapped), else this executor's own."""
        if a is not None:
            return a if isinstance(a, (LocalA, ActorA)) else LocalA(a, self.timeouts)
        if self.a is None:
            raise H3Error("this executor has no A side of its own: give the A side to encode or decode with.")
        return self.a

    def shutdown(self, kill_b: bool = False) -> None:
        if ray.is_initialized():
            if isinstance(self.a, ActorA):
                self.a.shutdown()
            if kill_b and self.b is not None:
                ray.kill(self.b)
        if isinstance(self.a, ActorA):
            self.a = None
        groups = self.bclient.groups
        if groups is not None and groups.a_rank is not None and ray.is_initialized():
            try:
                ray.kill(groups.a_rank.handle, no_restart=True)  # A's DiT rank is this caller's own
            except Exception:  # noqa: BLE001 - gone already
                pass
        if kill_b:
            self.bclient.primary = None
        self.pipeline.closed = True
        self._loop.stop()
