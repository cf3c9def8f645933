"""Following one denoise on a DiT worker from A: its step events (with the newest live preview) to the caller as
they end, a cancel passed on, the stall bound kept; the steps that ended after the last answer reported at the end.

B answers A's progress call as a long poll (``DiTActorImpl.progress`` with ``after`` and ``wait``): when a step
ends, or after ``WATCH_S``. So A hears of each step at once with about one remote call per step, instead of polling
ten times a second through a denoise whose steps last 30-40 s (and, in a DiT group, stealing time from rank 0's
compute). A wakes every ``timeouts.poll`` on its own, without a remote call, to pass an interrupt on.
"""

from __future__ import annotations

import asyncio
import logging
import time

import ray

from ..contract import wire
from ..contract.configs import Timeouts
from ..contract.errors import H3Timeout
from ..contract.timing import StepRecord

log = logging.getLogger("comfy_h3.executor")

#: how long B holds A's progress call open waiting for the next step (B bounds it too)
WATCH_S = 2.0
#: states in which B answers a progress call at once
ENDED = ("done", "failed", "cancelled")


async def await_ref(ref, timeout: float):
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)


async def report_rest(b, rid: str, steps: tuple, seen: int, on_step, preview: bool, timeouts: Timeouts) -> None:
    """The steps that finished after the last poll, the last one with B's final preview (asked once, bounded:
    a B too busy to answer costs the preview, never the result)."""
    if on_step is None or seen >= len(steps):
        return
    pv = None
    if preview:
        try:
            pv = received_preview(await await_ref(b.progress.remote(rid), timeouts.health), rid, -1)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            pv = None
    for i, sec in enumerate(steps[seen:], start=seen):
        on_step(StepRecord(i, len(steps), sec, rid, preview=pv if i == len(steps) - 1 else None))


async def follow(b, rid: str, fut, recs_ref, on_step, timeouts: Timeouts, cancelled, probe=None) -> int:
    """Until B's denoise ends: B's step events to ``on_step``, a cancel passed on once, the stall bound kept.
    B is asked with a long poll (it answers when a step ends, or after ``WATCH_S``), so A hears of each step
    at once with about one call per step; A wakes every ``timeouts.poll`` on its own to pass a cancel on.
    With ``probe`` (a :class:`~.link.LinkProbe`), a B silent for a few seconds has its node probed: a link that
    carries nothing or a host that is gone ends the request in one sentence. Returns how many steps were reported."""
    seen, last_progress, cancel_sent, shown = 0, time.monotonic(), False, -1
    last_answer = time.monotonic()

    def ask():
        return asyncio.ensure_future(await_ref(b.progress.remote(rid, seen, WATCH_S),
                                               timeouts.health + WATCH_S))
    watch = ask()
    try:
        while True:
            done, _ = await asyncio.wait({fut, watch}, timeout=timeouts.poll,
                                         return_when=asyncio.FIRST_COMPLETED)
            if fut in done:
                return seen
            if rid in cancelled and not cancel_sent:
                b.cancel.remote(rid)
                cancel_sent = True
            if watch in done:
                try:
                    prog = watch.result()
                    last_answer = time.monotonic()
                except asyncio.TimeoutError:
                    prog = None  # B busy answering; the stall bound below still applies
                steps = prog["steps"] if prog else []
                if len(steps) > seen:
                    last_progress = time.monotonic()
                    pv = received_preview(prog, rid, shown)
                    for k, (i, total, sec) in enumerate(steps[seen:], start=seen):
                        if on_step is not None:  # the newest preview rides with the newest step of this answer
                            on_step(StepRecord(i, total, sec, rid, preview=pv if k == len(steps) - 1 else None))
                    seen, shown = len(steps), pv.step if pv is not None else shown
                elif prog and prog["state"] in ("waiting", "queued"):
                    last_progress = time.monotonic()
                # for the step after the ones seen; once B says the request ended it would answer at once, so
                # only the result is awaited from then on (no burst of calls while it travels)
                ended = bool(prog) and prog["state"] in ENDED
                watch = asyncio.ensure_future(asyncio.sleep(WATCH_S)) if ended else ask()
            silent = time.monotonic() - last_answer
            if probe is not None and probe.due(silent):
                try:
                    await asyncio.to_thread(probe.check, rid, silent)
                except Exception:
                    b.cancel.remote(rid)  # delivered when the link is back; B stops between two steps
                    raise
            if time.monotonic() - last_progress > timeouts.stall:
                b.cancel.remote(rid)
                ray.cancel(recs_ref)
                raise H3Timeout(
                    f"B made no denoise progress on request {rid} for {timeouts.stall:.0f} s; it was "
                    "asked to stop. Check B with `python -m remote_worker status`."
                )
    finally:
        if not watch.done():
            watch.cancel()  # B's answer, when it comes, is dropped (B's watcher waits at most WATCH_S)
        elif not watch.cancelled():
            watch.exception()  # retrieved: an error of the last poll is not this request's


def received_preview(prog: dict, rid: str, shown: int) -> wire.Preview | None:
    """The preview in B's progress answer when it is new and valid; one that fails the contract is logged and
    dropped (a preview never stops a denoise)."""
    pv = prog.get("preview")
    if pv is None or getattr(pv, "step", -1) <= shown:
        return None
    try:
        return pv.validate() if isinstance(pv, wire.Preview) and pv.request_id == rid else None
    except wire.WireError as exc:
        log.warning("dropped B's preview of request %s: %s", rid, exc)
        return None
