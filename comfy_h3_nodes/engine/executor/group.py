"""Parallel denoise: one request's transformer split across a DiT group, A's DiT rank and one or more B workers.

Data contract. A group is an ordered list of :class:`Rank` (A's rank first when it takes part: the A machine's
object store holds the payload, and rank 0 returns the latents). Every rank is a DiT actor of the B side's class
holding the same model, partition and precision; A's rank is one more such actor, on A's node and in its own process
(never ComfyUI's), started through the composition root's factory. Forming a group: rank 0 names a rendezvous on its
node (``ip:port``), every rank joins at once (bounded), and the group is kept for the next requests until a rank is
lost or another set of ranks is needed. A request on a group: every rank gets the same payload ref and a
``wire.DenoiseCall`` that differs only in its ``ParallelCall`` (rank, world, method); rank 0's latents are the
request's; every rank's ``denoise`` record carries its step times and its seconds inside collectives.

Failure: a rank that dies breaks its peers' next collective at once (its sockets close); a rank that hangs breaks it
after the group's timeout, which is set from the measured step time and never beyond :data:`MAX_TIMEOUT_S`. The
ranks left drop the group; the caller re-runs the request on them, or says which machine was lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass, field

import ray

from ..contract import wire
from ..contract.errors import H3Cancelled, H3Error
from ..contract.timing import StageRecord, StepRecord
from ..model.parallel import ParallelError, method_for
from .failures import WORKER_LOST, collective_failure, creation_cause, first_line
from .handoff import unwrap_ray_error
from .group_readout import group_timing, rank_records, rerun_text, restart_text, status_row
from .parallel_plan import StepClock, choose as plan_parallel

log = logging.getLogger("comfy_h3.group")

#: a collective waits at most this long for a peer (a frozen or unplugged machine), at least the floor: a busy peer
#: (A's rank shares A with ComfyUI's encode and decode; CI's 2 cores run 3 suites) is not a lost one
MAX_TIMEOUT_S = 15.0
MIN_TIMEOUT_S = 6.0
#: the name of A's DiT rank (not a pool name: no ``h3_dit*`` spec matches it)
A_RANK_NAME = "h3_rank_a"


@dataclass(frozen=True)
class Rank:
    machine: str  # "A" | "B"
    name: str
    handle: object
    node_ip: str
    pid: int = 0

    def describe(self) -> dict:
        return {"machine": self.machine, "name": self.name, "node": self.node_ip}


@dataclass
class DiTGroup:
    group_id: str
    ranks: list[Rank]
    method: str
    timeout_s: float
    formed_s: float = 0.0
    reloaded_s: dict = field(default_factory=dict)  # machine -> seconds a released rank took to load again on joining

    @property
    def key(self) -> tuple:
        return tuple((r.name, r.pid) for r in self.ranks)

    def describe(self) -> dict:
        return {"group": self.group_id, "method": self.method, "timeout_s": self.timeout_s,
                "ranks": [dict(r.describe(), rank=i) for i, r in enumerate(self.ranks)]}


class RankLost(Exception):
    """A rank of the group died or left mid-request: the survivors dropped the group. ``probe``: ``rank`` only
    reported a broken collective; the one lost is the peer that answers no more."""

    def __init__(self, rank: Rank, exc: BaseException, probe: bool = False):
        super().__init__(f"{rank.machine} {rank.name} ({rank.node_ip}): {type(exc).__name__}")
        self.rank, self.exc, self.probe = rank, exc, probe


def collective_timeout(step_s: float | None, layers: int) -> float:
    """How long a collective waits for a peer: a few layers' worth of the measured step time (a collective waits
    at most for the slower rank's part of one layer), within [MIN_TIMEOUT_S, MAX_TIMEOUT_S]."""
    if not step_s:
        return MAX_TIMEOUT_S
    return max(MIN_TIMEOUT_S, min(MAX_TIMEOUT_S, 4.0 * step_s / max(layers, 1)))


class Groups:
    """The DiT groups of one caller: A's rank (started on first use), the current group, forming and running."""

    def __init__(self, start_a_rank, timeouts, backend: str = "native", reconcile=None, a_work_s=lambda: None):
        """``start_a_rank()`` starts (or finds: one per machine) A's rank; ``reconcile(health, handle)`` brings a
        found one to this caller's settings (model, dtype, attention, precision), as for a B worker."""
        self.start_a_rank, self.timeouts, self.backend, self.reconcile = start_a_rank, timeouts, backend, reconcile
        self.a_work_s = a_work_s  # A's measured seconds of encode + decode per request (auto's model)
        self.clock = StepClock()
        self.a_rank: Rank | None = None
        self.a_refused = ""  # why A cannot hold a rank (its memory plan), once known
        self.current: DiTGroup | None = None
        self.step_s: float | None = None  # the last group's median step (the next group's timeout)
        self.layers = 1

    # ------------------------------------------------------------------------------------------------ A's rank
    async def a(self, timed: dict | None = None) -> Rank:
        """A's DiT rank, started (and its model loaded) on first use; a plan that does not fit is one sentence.
        ``timed["a_start_s"]`` gets the seconds a start took (the request that waited for it says so)."""
        if self.a_rank is not None:
            try:
                await _call(self.a_rank.handle.ping.remote(), self.timeouts.health)
                return self.a_rank
            except Exception:  # noqa: BLE001 - gone (killed, node restarted): start it again below
                self.a_rank = None
        if self.a_refused:
            raise ParallelError(self.a_refused)
        t0 = time.monotonic()
        handle = self.start_a_rank()
        try:
            health = await _call(handle.health.remote(), self.timeouts.start)
        except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
            cause = creation_cause(exc) if isinstance(exc, ray.exceptions.RayError) else "it did not start in time"
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
            if "memory plan refused" in cause or "does not fit" in cause:
                self.a_refused = (f"machine A cannot hold a DiT rank for parallel denoise: {cause.rstrip('.')}; "
                                  "set parallel to off, or give the rank fp8 storage (precision fp8).")
                raise ParallelError(self.a_refused) from None
            raise ParallelError(f"A's DiT rank failed to start: {cause}") from None
        if self.reconcile is not None and await asyncio.to_thread(self.reconcile, health, handle):
            health = await _call(handle.health.remote(), self.timeouts.health)
        self.a_rank = Rank("A", A_RANK_NAME, handle, health["node_ip"], health["pid"])
        if timed is not None:
            timed["a_start_s"] = timed.get("a_start_s", 0.0) + time.monotonic() - t0
        return self.a_rank

    # ------------------------------------------------------------------------------------------------ forming
    async def form(self, ranks: list[Rank]) -> DiTGroup:
        """The group of exactly these ranks: the current one when it is the same and every rank is still in it
        (a rank may serve several callers, and another caller may have grouped it since), else a new one."""
        if self.current is not None and self.current.key == tuple((r.name, r.pid) for r in ranks):
            try:
                held = await asyncio.gather(*(_call(r.handle.group_of.remote(), self.timeouts.health)
                                              for r in ranks))
            except Exception:  # noqa: BLE001 - a rank that does not answer: form the group again below
                held = []
            if held and all(g == self.current.group_id for g in held):
                return self.current
        await self.dissolve()
        t0 = time.perf_counter()
        address = await _call(ranks[0].handle.rendezvous.remote(), self.timeouts.health)
        group_id = uuid.uuid4().hex[:8]
        timeout_s = collective_timeout(self.step_s, self.layers)
        refs = [r.handle.join_group.remote(group_id, address, i, len(ranks), timeout_s, self.timeouts.start)
                for i, r in enumerate(ranks)]
        try:
            joined = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(x.future()) for x in refs)),
                                            self.timeouts.start + 10)
        except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
            for r in ranks:
                r.handle.leave_group.remote(group_id)
            names = ", ".join(f"{r.machine} {r.name}" for r in ranks)
            why = first_line(unwrap_ray_error(exc)) if isinstance(exc, ray.exceptions.RayError) else "timed out"
            raise ParallelError(f"the DiT group of {names} could not form: {why}") from None
        heads = joined[0]["heads"]
        self.current = DiTGroup(group_id, list(ranks), method_for(heads, len(ranks), self.backend), timeout_s,
                                time.perf_counter() - t0,
                                {r.machine: j["reloaded_s"] for r, j in zip(ranks, joined) if j.get("reloaded_s")})
        log.info("formed DiT group %s: %s (%s, collective timeout %.1f s) in %.2f s", group_id,
                 [r.describe() for r in ranks], self.current.method, timeout_s, self.current.formed_s)
        return self.current

    async def dissolve(self) -> None:
        group, self.current = self.current, None
        if group is None:
            return
        for r in group.ranks:
            try:
                await _call(r.handle.leave_group.remote(group.group_id), self.timeouts.health)
            except Exception:  # noqa: BLE001 - a lost rank is gone already
                pass

    # ------------------------------------------------------------------------------------------------ running
    async def denoise(self, group: DiTGroup, payload_ref, call: wire.DenoiseCall, follow, put: StageRecord | None):
        """Every rank denoises the request at once; returns rank 0's latents ref and the records (rank 0's
        ``a_to_b``, then every rank's ``denoise``, rank 0's first). ``follow(handle, records_ref)`` follows rank 0's
        steps (progress, cancel, stall); a rank lost mid-request raises :class:`RankLost` once all calls ended."""
        world, calls = len(group.ranks), []
        for i, r in enumerate(group.ranks):
            part = wire.ParallelCall(group.group_id, i, world, group.method)
            calls.append(r.handle.denoise.remote([payload_ref], dataclasses.replace(call, parallel=part),
                                                 self.timeouts.handoff))
        futures = [asyncio.wrap_future(recs.future()) for _, recs in calls]
        following = asyncio.ensure_future(follow(group.ranks[0].handle, calls[0][1], futures[0]))
        try:  # until rank 0 is done (its steps followed), or any rank fails
            await asyncio.wait({following, *futures}, return_when=asyncio.FIRST_EXCEPTION)
            if following.done() and not following.cancelled() and following.exception() is not None:
                exc = following.exception()
                # rank 0 itself lost: its progress call can fail before its denoise call does; that call's
                # error (below) names the rank and the request runs again on the ranks left. A rank 0 still
                # running after a short wait means the follower's own failure: it ends the request, as any other
                if not isinstance(exc, ray.exceptions.RayError):
                    raise exc
                await asyncio.wait([futures[0]], timeout=self.timeouts.health)
                if not futures[0].done():
                    raise exc
        except BaseException:
            for r in group.ranks:  # a stalled or cancelled run: every rank stops, so none stays in a collective
                r.handle.cancel.remote(call.request_id)
            raise
        finally:
            following.cancel()
            # once one rank failed, the others' calls end within the group's timeout: wait that long, no more
            _, hung = await asyncio.wait(futures, timeout=group.timeout_s + 10)
        done = [(f.exception() or f.result()) if f.done() and not f.cancelled() else None for f in futures]
        errors = [(r, e) for r, e in zip(group.ranks, done) if isinstance(e, BaseException)]
        for r, f in zip(group.ranks, futures):
            if f in hung:  # alive but silent (frozen, or its machine unplugged): the rank that was lost
                self.current = None
                raise RankLost(r, TimeoutError(f"no answer within {group.timeout_s + 10:.0f} s"))
        if errors:
            return self._failed(group, call, errors, calls)
        # the A->B hand-off that crossed machines is a B rank's receipt (A's rank reads its own store)
        a_to_b = next((list(d)[0] for r, d in zip(group.ranks, done) if d is not None and r.machine == "B"),
                      list(done[0])[0])
        records = [a_to_b, *(list(d)[1] for d in done if d is not None)]
        if put is not None:
            records[0] = dataclasses.replace(records[0], serialize_s=put.serialize_s)
        steps = sorted(s for s in records[1].steps)
        self.step_s = steps[len(steps) // 2] if steps else self.step_s
        return calls[0][0], records

    def _failed(self, group: DiTGroup, call, errors, calls):
        """Why the group's run failed: a cancel (every rank stopped before the same step, the group is fine), a rank
        lost (the group is dropped), or another error (one sentence)."""
        for latents_ref, _ in calls:  # the latents refs carry the same errors: mark them read
            latents_ref.future().add_done_callback(lambda f: f.cancelled() or f.exception())
        inner = [(r, unwrap_ray_error(e)) for r, e in errors]
        if all(type(x).__name__ == "DenoiseCancelled" for _, x in inner):
            raise H3Cancelled(f"request {call.request_id} was cancelled; every rank of its DiT group stopped "
                              "before the same step.")
        self.current = None  # a broken group is never used again; its ranks left it (or died)
        lost = next(((r, e) for r, e in errors if isinstance(e, WORKER_LOST)), None)
        if lost is not None:
            raise RankLost(*lost)
        r, x = inner[0]
        if collective_failure(x):  # a peer vanished or froze: the caller finds which one answers no more
            raise RankLost(r, x, probe=True)
        raise H3Error(f"{r.machine}'s DiT rank {r.name} failed during the parallel denoise of request "
                      f"{call.request_id}: {first_line(x)}")

    def describe(self) -> dict | None:
        return self.current.describe() if self.current else None

    def a_rank_status(self, bound: float) -> dict | None:
        """A's DiT rank as ``/h3/status`` lists a DiT worker (node, pid, partitions, queue; ``machine`` A), asked
        within ``bound``; None when this caller has not started one. A rank that does not answer is listed with the
        pid it had and the reason."""
        r = self.a_rank
        if r is None:
            return None
        entry = {"name": r.name, "machine": "A", "role": "DiT rank (parallel denoise)", "node": r.node_ip,
                 "pid": r.pid, "group": self.current.group_id if self.current else None}
        try:
            s = ray.get(r.handle.pool_status.remote(), timeout=bound)
        except Exception as exc:  # noqa: BLE001 - listed as not answering, with why
            return {**entry, "ok": False, "error": f"A's DiT rank did not answer: {first_line(exc)}"}
        return status_row(entry, s)

    # ------------------------------------------------------------------------------------------------ a request
    async def run(self, b, mode: str, payload_ref, call: wire.DenoiseCall, workflow: str, put, on_step,
                  shape: tuple | None = None):
        """One request of ``mode`` (``A+B``, ``all``, ``auto``) through ``b`` (the :class:`~.b_client.BClient`):
        its ranks chosen, the group formed, the request run; a rank lost mid-request makes it run again on the
        ranks left (the note says so, and the node as it happens). ``auto`` uses one worker when A cannot hold a rank or this caller's queue
        is better served by pipelining (:meth:`choose`). Returns ``Denoised``, or None for the one-worker path."""
        # what auto would have done with this request (before it is measured): said when it would not group
        auto = None if mode == "auto" else plan_parallel(self.clock, shape, call.num_inference_steps, 2, b.pending,
                                                         self.a_work_s())
        timed = {"t0": time.monotonic(), "auto": auto, "a_start_s": 0.0}
        ranks, why = await self.choose(b, mode, workflow, call, shape, timed)
        if ranks is None:
            return None, why
        t0, note, first = time.monotonic(), why, True
        while True:  # each lost rank drops out and the request runs again on the ranks left, same seed
            try:
                if len(ranks) == 1 and not first:
                    return await b.denoise_on_rank(ranks[0], payload_ref, call, workflow, put, on_step, note), note
                return await self._on(b, ranks, payload_ref, call, workflow, put, on_step, note, shape, timed), note
            except RankLost as lost:
                gone, left = await self._culprit(lost, ranks)
                rerun = rerun_text(gone, left or [], time.monotonic() - t0, lost.exc)
                log.warning("[%s] %s", call.request_id, rerun)
                if gone.machine == "A":
                    self.a_rank = None
                if call.request_id in b.cancelled:
                    raise H3Cancelled(f"request {call.request_id} was cancelled after a rank was lost; not re-run.") \
                        from None
                if not left:
                    raise H3Error(f"machine {gone.machine} ({gone.node_ip}) was lost during the parallel denoise of "
                                  f"request {call.request_id} and no other rank answers: run it again once the "
                                  "machine is back.") from None
                if on_step is not None:  # the node says so as it happens, and its bar starts over
                    said = restart_text(gone, timed.get("steps_seen", 0), left, ranks)
                    on_step(StepRecord(-1, timed.get("total") or max(call.num_inference_steps - 1, 1), 0.0,
                                       call.request_id, restart=said))
                ranks, first = left, False
                note = rerun if note == why else f"{note}; {rerun}"

    async def _culprit(self, lost: RankLost, ranks: list[Rank]) -> tuple[Rank, list[Rank] | None]:
        """The rank lost and the ranks left (None when one of those is silent too). A broken collective is reported
        by the ranks that stayed (``lost.probe``): the lost one is the first silent rank, else the one named."""
        asked = ranks if lost.probe else [r for r in ranks if r.name != lost.rank.name]
        answers = await asyncio.gather(*(_call(r.handle.ping.remote(), self.timeouts.health) for r in asked),
                                       return_exceptions=True)
        silent = [r for r, a in zip(asked, answers) if isinstance(a, BaseException)]
        gone = silent[0] if lost.probe and silent else lost.rank
        return gone, [r for r in ranks if r.name != gone.name] if all(r is gone for r in silent) else None

    async def _on(self, b, ranks, payload_ref, call, workflow, put, on_step, note, shape=None, timed=None):
        before = self.current
        group = await self.form(ranks)
        if timed is not None and group is not before:  # formed for this request: part of its time
            timed["formed_s"] = timed.get("formed_s", 0.0) + group.formed_s
        seen = [0]
        if timed is not None and on_step is not None:  # the steps rank 0 reported: where a lost rank stopped it
            timed["steps_seen"], told = 0, on_step

            def on_step(ev):
                timed["steps_seen"], timed["total"] = max(timed["steps_seen"], ev.index + 1), ev.total
                told(ev)

        async def follow(handle, recs_ref, fut):
            seen[0] = await b.follow(handle, call.request_id, fut, recs_ref, on_step)

        latents_ref, records = await self.denoise(group, payload_ref, call, follow, put)
        records = b.on_b_clock(records)
        den = records[1]
        self.clock.add(shape, len(group.ranks), list(den.steps))
        readout = rank_records(records, group.ranks)
        if timed is not None:
            readout.update(group_timing(time.monotonic() - timed["t0"], timed.get("a_start_s", 0.0),
                                        timed.get("formed_s", 0.0), timed["auto"], len(group.ranks)))
        records[1] = dataclasses.replace(den, note="; ".join(x for x in (den.note, f"{group.method} over "
                                         f"{len(group.ranks)} ranks", note) if x),
                                         info={**(den.info or {}), **readout, "parallel": True,
                                               "group": group.group_id, "method": group.method,
                                               **({"rerun": note} if "re-run" in (note or "") else {})})
        await b.report_rest(group.ranks[0].handle, call.request_id, den.steps, seen[0], on_step,
                            call.preview is not None)  # rank 0's steps that finished after the last poll
        return latents_ref, records

    async def choose(self, b, mode: str, workflow: str, call: wire.DenoiseCall,
                     shape: tuple | None = None, timed: dict | None = None) -> tuple[list[Rank] | None, str]:
        """The ranks of a request: A's rank first, then the B worker the pool picks (``A+B``) or every live worker
        (``all``); ``auto`` joins A to B when A can hold a rank, B's worker has nothing else queued and the measured
        times say it finishes this caller's queue sooner (:mod:`.parallel_plan`), else one worker. Returns
        ``(ranks or None, why)``."""
        if mode == "auto":
            choice = plan_parallel(self.clock, shape, call.num_inference_steps, 2, b.pending, self.a_work_s())
            if not choice.join:
                return None, choice.why
            try:
                a = await self.a(timed)
            except ParallelError as exc:
                return None, f"parallel auto: one worker ({exc})"
            worker = await b.pick_for_group(workflow, call)
            if worker.queued_steps() > call.num_inference_steps:
                return None, f"parallel auto: B worker {worker.name} has other requests queued: one worker"
            return [a, _rank_of(worker)], choice.why
        a = await self.a(timed)
        if mode == "A+B":
            return [a, _rank_of(await b.pick_for_group(workflow, call))], f"parallel {mode}"
        workers = await b.all_workers(workflow)
        return [a, *(_rank_of(w) for w in workers)], f"parallel {mode}: A and {len(workers)} B worker(s)"

    async def for_sampling(self, b, mode: str, workflow: str, timed: dict | None = None) -> DiTGroup:
        """The group of one run of ComfyUI's sampler (``A+B``: A's rank and B's primary worker; ``all``: A's rank and
        every live worker), formed or kept from the last sampling; its forwards go to every rank. ``timed["a_start_s"]``
        gets what starting A's rank took, when this sampling started it."""
        a = await self.a(timed)
        workers = await b.all_workers(workflow)
        if mode == "A+B":
            workers = [next((w for w in workers if w.name == b.config.name), workers[0])]
        return await self.form([a, *(_rank_of(w) for w in workers)])


def _rank_of(worker) -> Rank:
    return Rank("B", worker.name, worker.handle, worker.node_ip, worker.status.get("pid", 0))


async def _call(ref, timeout: float):
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
