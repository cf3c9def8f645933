"""A's client of the DiT workers on B: which worker takes a request, that it serves this caller's settings, the
denoise call with its step progress, a re-run when its worker is lost, cancel, and B's share of a split decode.

Data contract. In: an ObjectRef of the conditioning (``wire.EncodedRequest`` in A's object store) and its
``wire.DenoiseCall``. Out: :class:`Denoised` (the ref of B's ``wire.DenoisedLatents``, still in B's object store,
and the request's ``a_to_b`` and ``denoise`` records on A's time axis). Every remote wait is bounded by
``Timeouts``; a B that makes no step progress for ``stall`` seconds is stopped.

Routing is :mod:`.pool`'s (the worker that holds the workflow's partition, then the fewest queued steps). A worker
lost mid-request (process killed, node gone, its link or host cut off) hands the request to another worker once,
with the same seed: B draws all noise from it, so the result is the same, and the denoise record says it was re-run
and what was lost. The re-run gets a new copy of the payload that only A's store holds (:func:`sole_copy`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Callable

import ray

from ...cluster import ray_cluster as cl
from ..contract import wire
from ..contract.configs import PARALLEL, BConfig, Timeouts
from ..contract.request import NEW_WORKER
from ..contract.errors import H3Cancelled, H3Error, H3Timeout, ModelFolderError
from ..contract.timing import StageRecord, StepRecord
from ..model import catalog
from ..model.backends import BACKENDS
from . import pool as pl
from . import progress
from .progress import await_ref
from .group import A_RANK_NAME, Groups
from .failures import NODE_SETTLE_S, WORKER_LOST, WorkerLost, clean, first_line, node_lost_error, remote_error
from .handoff import sole_copy, unwrap_ray_error
from .link import LinkDown, LinkProbe

log = logging.getLogger("comfy_h3.executor")

#: the cancelled request ids a client remembers (a re-run checks them); the oldest go first beyond this
CANCELLED_KEPT = 256
SETTING_NAMES = {"model_dir": "model", "dtype": "dtype", "attention_backend": "attention backend",
                 "precision": "precision", "partition": "partition"}


@dataclass
class Denoised:
    """B's result of one request: its latents' ref (in B's object store) and its records (``a_to_b``, ``denoise``)."""

    request_id: str
    workflow: str
    latents_ref: object
    records: list[StageRecord]
    worker: pl.Worker | None = None


class BClient:
    """The DiT workers a ``BConfig.name`` spec matches, seen from one caller."""

    def __init__(self, config: BConfig, timeouts: Timeouts, start_dit: Callable | None = None,
                 parallel: str = "off"):
        if parallel not in PARALLEL:
            raise ValueError(f"parallel is {parallel!r}; expected one of {PARALLEL}.")
        self.config, self.timeouts, self.start_dit, self.parallel = config, timeouts, start_dit, parallel
        self.groups: Groups | None = None  # parallel denoise: A's rank and the DiT groups (set by the executor)
        self.pool = pl.DiTPool(config.name, config.namespace, status_timeout=min(timeouts.health, 5.0))
        self.primary = None  # the worker health checks, pickers and reconfiguration talk to first
        self.primary_name = ""  # its actor name (the config's name may be a pattern: h3_dit*)
        self.worker_of: OrderedDict[str, pl.Worker] = OrderedDict()  # request -> the worker that denoises it
        self.reconciled: set[tuple] = set()  # (name, pid) of workers whose settings match this caller's
        self.last_reconfigure = ""  # what the last reconcile changed on the primary ("" = nothing)
        self.cancelled: set[str] = set()
        self.clock_offset_s = 0.0  # B's clock minus this machine's (the health check measures it)
        self.pending = 0  # this caller's requests that are, or soon will be, B's work
        self._pick_lock: asyncio.Lock | None = None  # one pick at a time (made on the executor loop)

    #: a name that matches no worker while B holds others is refused (a machine B of its own; see start)
    refuse_unknown = False
    #: the caller asked for a new worker in so many words (actor_name "new:<name>")
    allow_new = False

    def held_workers(self) -> list[str]:
        """The DiT workers of this namespace (A's DiT rank of parallel denoise is not one of them)."""
        return [n for n in pl.DiTPool("*", self.config.namespace).names() if n != A_RANK_NAME]

    # ------------------------------------------------------------------------------------------------ start
    def start(self) -> None:
        """Find the pool's workers; with none (the embedded cluster), start one on a B node through the factory."""
        found = self.pool.refresh()
        if found:
            self.primary, self.primary_name = found[0].handle, found[0].name
            return
        if self.start_dit is None:
            raise H3Error(f"no DiT worker matching {self.config.name!r} in namespace {self.config.namespace!r}; "
                          "start one with `python -m remote_worker setup` on machine B.")
        name = pl.create_name(self.config.name)
        held = self.held_workers() if self.refuse_unknown and not self.allow_new else []
        # a typo of a name would load a second copy of the DiT on B: only when asked in so many words. A worker the
        # spec names that did not answer its status in time (busy, its link just back) is not a typo: the factory
        # below finds it by name (get_if_exists)
        if held and not self.pool.names():
            raise H3Error(
                f"actor_name {self.config.name!r} names no DiT worker in namespace {self.config.namespace!r}, and B "
                f"already holds {', '.join(held)}: another worker would load a second copy of the DiT there (out of "
                f"memory on a Spark). Set actor_name to {held[0]!r} (or h3_dit* for any of them), or to "
                f"{NEW_WORKER + name!r} to start another worker on purpose.")
        self.primary = self.start_dit(asdict(dataclasses.replace(self.config, name=name)))
        self.primary_name = name

    def reconcile_all(self) -> None:
        for w in self.pool.refresh():
            self._reconcile_worker(w)

    # ------------------------------------------------------------------------------------------------ settings
    def changes(self, b: dict) -> dict:
        """The load-time settings of this caller that a running worker (its ``health``) does not serve:
        ``{key: new}``. The partition is not one of them (B swaps per request, and every record says which ran),
        except with a new model: a transformer file is the partition it is loaded as."""
        want, changes = self.config, {}
        # a name as B's picker lists it (relative to B's model roots) is the model B serves under that name
        if (want.model_dir and not catalog.same_model(want.model_dir, b.get("model") or b["model_dir"])
                and catalog.comfy_dit_name(want.model_dir.strip()) != catalog.comfy_dit_name(b.get("model_name") or "")):
            changes["model_dir"] = want.model_dir
            if want.partition != b.get("partition"):
                changes["partition"] = want.partition
        if want.dtype != b["dtype"]:
            changes["dtype"] = want.dtype
        if BACKENDS.get(want.attention_backend, (want.attention_backend,))[0] != b["attention_backend"]:
            changes["attention_backend"] = want.attention_backend
        if want.precision != (b.get("precision") or "auto"):
            changes["precision"] = want.precision
        return changes

    def reconcile(self, b: dict, actor=None) -> bool:
        """One rule for every setting: a worker that serves other settings than this caller asked for is
        reconfigured to them (queued behind its running requests, then a reload), and the change is reported in
        ``last_reconfigure``; if it cannot apply them, one sentence names both values and the fix. Returns whether
        anything changed."""
        primary = actor is None
        actor = self.primary if actor is None else actor
        if primary:
            self.last_reconfigure = ""
        changes = self.changes(b)
        if not changes:
            return False
        have = {"model_dir": b.get("model") or b["model_dir"], "dtype": b["dtype"],
                "attention_backend": b.get("attention_choice") or b["attention_backend"],
                "precision": b.get("precision") or "auto", "partition": b.get("partition")}
        desc = ", ".join(f"{SETTING_NAMES[k]} {have[k]} -> {v}" for k, v in changes.items())
        log.info("B actor %r serves other settings; reconfiguring it: %s", self.config.name, desc)
        try:
            # where a worker without model roots of its own looks the name up (A's model roots: the embedded B)
            ask = ({**changes, "search_roots": list(self.config.search_roots),
                    **({"asked_by": self.config.asked_by} if self.config.asked_by else {})}
                   if "model_dir" in changes else changes)
            done = ray.get(actor.reconfigure.remote(ask), timeout=self.timeouts.start)
        except ray.exceptions.GetTimeoutError as exc:
            raise H3Timeout(f"B did not finish reconfiguring ({desc}) within {self.timeouts.start:.0f} s.") from exc
        except ray.exceptions.RayError as exc:
            inner = unwrap_ray_error(exc)
            if isinstance(inner, ModelFolderError):  # B checked the path: its sentence already names the way out
                raise ModelFolderError(f"{clean(str(inner)).rstrip('.')} (B serves {have['model_dir']} now and "
                                       "keeps serving it).") from None
            raise H3Error(
                f"the B actor {self.config.name!r} serves {desc.replace(' -> ', ' and this node asks for ')}, and "
                f"could not switch: {first_line(inner).rstrip('.')}. Set the node to what B serves, "
                "or fix the cause above."
            ) from None
        if primary and done.get("changed", True):  # B found nothing to change (a name for what it serves): no news
            self.last_reconfigure = f"{desc} ({done['seconds']:.1f} s)"
        return True

    def _reconcile_worker(self, w: pl.Worker) -> None:
        """A worker of the pool serves this caller's settings before it gets one of its requests; checked once per
        worker process."""
        key = (w.name, w.status.get("pid"))
        if key in self.reconciled:
            return
        health = ray.get(w.handle.health.remote(), timeout=self.timeouts.health)
        self.reconcile(health, w.handle)
        self.reconciled.add(key)

    # ------------------------------------------------------------------------------------------------ denoise
    async def denoise(self, payload_ref, call: wire.DenoiseCall, workflow: str, put: StageRecord | None = None,
                      on_step: Callable[[StepRecord], None] | None = None) -> Denoised:
        """Route the denoise to a worker of the pool; if that worker dies or leaves mid-request, run it once more on
        another one. ``put`` is A's record of the payload's put (its serialisation joins B's ``a_to_b``)."""
        rid = call.request_id
        if rid in self.cancelled:
            raise H3Cancelled(f"request {rid} was cancelled before B started it.")
        why = ""
        info = (put.info or {}) if put is not None else {}
        shape = (info["height"], info["width"], info["num_frames"]) if "num_frames" in info else None
        if self.parallel != "off" and self.groups is not None:
            ran, why = await self.groups.run(self, self.parallel, payload_ref, call, workflow, put, on_step, shape)
            if ran is not None:
                return Denoised(rid, workflow, ran[0], ran[1], self.worker_of.get(rid))
        lost: list[tuple] = []  # (worker, exception, seconds lost)
        t0 = time.monotonic()
        while True:
            if lost and rid in self.cancelled:
                raise H3Cancelled(f"request {rid} was cancelled after its DiT worker was lost; not re-run.")
            w = await self._pick(workflow, call, lost)
            rerun = why  # parallel auto's reason for one worker, when it chose one
            if lost:
                old, exc, spent = lost[-1]
                cause = exc.short if isinstance(exc, LinkDown) else type(exc).__name__
                rerun = (f"{why + '; ' if why else ''}re-run on worker {w.name} ({w.node_ip}) after worker {old.name} "
                         f"({old.node_ip}) was lost {spent:.1f} s into the request ({cause})")
                if len(lost) == 1:
                    payload_ref = await asyncio.to_thread(sole_copy, payload_ref, self.timeouts.handoff)
            try:
                den = await self._denoise_on(w, payload_ref, call, workflow, put, on_step, rerun)
                if self.groups is not None:  # one rank's step time: what parallel auto compares a group with
                    self.groups.clock.add(shape, 1, list(den.records[1].steps))
                return den
            except WorkerLost as gone:
                lost.append((w, gone.exc, time.monotonic() - t0))
                log.warning("[%s] DiT worker %s lost mid-request (%s)", rid, w.name, type(gone.exc).__name__)
                if len(lost) > 1:  # already re-run once
                    raise await self._lost_error(rid, lost, "it was already re-run once") from None

    async def _pick(self, workflow: str, call: wire.DenoiseCall, lost: list) -> pl.Worker:
        """The worker for this request, its settings reconciled and the request announced on its queue. The first
        pick waits (up to the start bound) for workers that exist but do not answer yet (restarting, loading); a
        re-run takes only workers that answer now, so a pool with none left is reported within seconds."""
        if self._pick_lock is None:
            self._pick_lock = asyncio.Lock()
        async with self._pick_lock:  # this client's next pick sees the request it just announced
            exclude = tuple(x[0].name for x in lost)
            bound = min(self.timeouts.health, 5.0)
            patience = 0.0 if lost else self.timeouts.start
            try:
                w = await asyncio.wait_for(asyncio.to_thread(self.pool.pick, workflow, exclude, bound, patience),
                                           (patience or bound) + bound + 5)
            except (pl.PoolError, asyncio.TimeoutError) as exc:
                if lost:
                    raise await self._lost_error(call.request_id, lost, "no other DiT worker answers") from None
                raise H3Error(f"request {call.request_id} cannot start on B: {exc}") from None
            if (w.name, w.status.get("pid")) not in self.reconciled:
                await asyncio.to_thread(self._reconcile_worker, w)
            self.worker_of[call.request_id] = w
            while len(self.worker_of) > 64:
                self.worker_of.popitem(last=False)
            try:
                await await_ref(w.handle.enqueue.remote(call.request_id, call.num_inference_steps, self.pool.client),
                                self.timeouts.health)
            except Exception:  # noqa: BLE001 - the denoise call itself reports a worker that is gone
                pass
            return w

    async def _lost_error(self, rid: str, lost: list, why: str) -> H3Error:
        """The one sentence for a request whose worker was lost and that no other worker could take over."""
        w, exc, _ = lost[-1]
        if isinstance(exc, LinkDown) and len(lost) == 1:
            return exc  # A's own sentence: which link, and what to do
        err = exc if isinstance(exc, LinkDown) else remote_error("B", "denoise", rid, exc)
        # "unavailable" comes before the head has judged B's node (~1.5 s vs ~2.5 s): give it a moment
        settle = NODE_SETTLE_S if isinstance(exc, ray.exceptions.ActorUnavailableError) else 0.0
        if await self.node_gone(settle, w.status.get("node_id")):
            err = node_lost_error("B", w.node_ip, "denoise", rid)
        else:  # the head counts a lost host alive for up to 150 s (its partition tolerance): B's node is asked
            lp = LinkProbe(w.status.get("node_id"), w.node_ip)
            if await asyncio.to_thread(lp.refused):
                err = lp.lost_error(rid)
        names = ", ".join(x[0].name for x in lost)
        return type(err)(f"{str(err).rstrip('.')} (DiT worker {names}; {why}, so it was not re-run).")

    async def _denoise_on(self, w: pl.Worker, payload_ref, call: wire.DenoiseCall, workflow: str,
                          put: StageRecord | None, on_step, rerun: str) -> Denoised:
        b, rid = w.handle, call.request_id
        latents_ref, recs_ref = b.denoise.remote([payload_ref], call, self.timeouts.handoff)
        fut = asyncio.wrap_future(recs_ref.future())
        seen = 0
        try:
            seen = await self.follow(b, rid, fut, recs_ref, on_step,
                                     probe=LinkProbe(w.status.get("node_id"), w.node_ip))
            records = list(fut.result())
            # the A->B record is B's (receiver's clock); the put into A's object store happened on A
            records[0] = dataclasses.replace(records[0], serialize_s=put.serialize_s if put else 0.0)
            records = [dataclasses.replace(r, clock_offset_s=self.clock_offset_s) for r in records]
            den = records[1]
            records[1] = dataclasses.replace(
                den, note="; ".join(x for x in (den.note, rerun) if x),
                info={**(den.info or {}), "worker": w.name, **({"rerun": rerun} if "re-run" in rerun else {})})
        except ray.exceptions.RayError as exc:
            err = remote_error("B", "denoise", rid, exc)
            if rid in self.cancelled:
                raise H3Cancelled(f"request {rid} was cancelled; B stopped it between two steps.") from None
            if isinstance(exc, WORKER_LOST):
                raise WorkerLost(exc) from None  # the caller re-runs it on another worker, or says why not
            raise err from None
        except LinkDown as cut:  # B's link or host is gone, though Ray still counts its node alive
            latents_ref.future().add_done_callback(lambda f: f.cancelled() or f.exception())
            raise WorkerLost(cut) from None
        except BaseException:
            # the latents ref carries the same error; read it when it lands so Ray does not log it as unhandled
            latents_ref.future().add_done_callback(lambda f: f.cancelled() or f.exception())
            raise
        finally:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # mark a failure we reported another way as retrieved
        await self.report_rest(b, rid, records[1].steps, seen, on_step, call.preview is not None)
        return Denoised(rid, workflow, latents_ref, records, w)

    async def report_rest(self, b, rid: str, steps: tuple, seen: int, on_step, preview: bool) -> None:
        await progress.report_rest(b, rid, steps, seen, on_step, preview, self.timeouts)

    async def follow(self, b, rid: str, fut, recs_ref, on_step, probe=None) -> int:
        return await progress.follow(b, rid, fut, recs_ref, on_step, self.timeouts, self.cancelled, probe)

    async def node_gone(self, settle: float = 0.0, node_id: str | None = None) -> bool:
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

    # ------------------------------------------------------------------------------------------------ groups
    async def pick_for_group(self, workflow: str, call: wire.DenoiseCall) -> pl.Worker:
        """The B worker of an ``A+B`` group: the one the pool would give the request (its settings reconciled)."""
        return await self._pick(workflow, call, [])

    async def all_workers(self, workflow: str) -> list[pl.Worker]:
        """Every live worker of the pool, settings reconciled (an ``all`` group)."""
        workers = await asyncio.to_thread(self.pool.refresh, min(self.timeouts.health, 5.0))
        if not workers:
            raise H3Error(self.pool.none_left())
        for w in workers:
            if (w.name, w.status.get("pid")) not in self.reconciled:
                await asyncio.to_thread(self._reconcile_worker, w)
        return sorted(workers, key=lambda w: w.name)

    async def denoise_on_rank(self, rank, payload_ref, call: wire.DenoiseCall, workflow: str, put, on_step,
                              note: str) -> tuple:
        """A request re-run on the one rank a group has left (A's rank, or one B worker)."""
        w = pl.Worker(rank.name, rank.handle, {"node_ip": rank.node_ip, "pid": rank.pid})
        den = await self._denoise_on(w, payload_ref, call, workflow, put, on_step, note)
        return den.latents_ref, den.records

    # ------------------------------------------------------------------------------------------------ the rest
    def handle_of(self, request_id: str):
        """The worker that denoises (or denoised, and holds the latents of) ``request_id``; else the primary."""
        w = self.worker_of.get(request_id)
        return w.handle if w is not None else self.primary

    def cancel(self, request_id: str) -> None:
        """B stops the request before its next step; one announced but not started leaves the worker's queue."""
        self.cancelled.add(request_id)
        while len(self.cancelled) > CANCELLED_KEPT:  # bounded: a day of cancels (ids are unique per request)
            self.cancelled.pop()
        b = self.handle_of(request_id)
        if b is not None:
            b.cancel.remote(request_id)
            if request_id in self.worker_of:
                b.dequeue.remote(request_id)

    def start_share(self, latents_ref, request_id: str, b_start: int, clips: int, b_tile: int = 0) -> list:
        """B's share of a split decode (from tile ``b_tile`` of clip ``b_start`` on), queued on B's compute queue;
        its refs (clips, then B's record)."""
        refs = list(self.handle_of(request_id).decode_share.options(num_returns=clips - b_start + 1).remote(
            [latents_ref], request_id, b_start, clips, self.timeouts.handoff, b_tile))

        def failed(f):  # a failed share A never read (cancel, A failed) must not be logged as an unhandled error
            if not f.cancelled() and f.exception() is not None:
                for r in refs[:-1]:  # the clips carry the same (small) error; never fetch frames here
                    r.future().add_done_callback(lambda g: g.cancelled() or g.exception())

        refs[-1].future().add_done_callback(failed)
        return refs

    def on_b_clock(self, records: list[StageRecord]) -> list[StageRecord]:
        return [dataclasses.replace(r, clock_offset_s=self.clock_offset_s) if r.machine == "B" else r
                for r in records]
