"""What a DiT group's run reads as (parallel denoise: :mod:`.group`): each rank's record in the denoise readout,
the group's wall time and what of it was the group's start, what ``auto`` would have done, the sentence of a
re-run after a lost rank, and A's rank as ``/h3/status`` lists a worker. Pure functions of the records and ranks."""

from __future__ import annotations

from ..contract.timing import StageRecord


def rank_records(records: list[StageRecord], ranks: list) -> dict:
    """The readout of a group's run: ranks, their machines, each one's step time and communication share."""
    out = []
    for i, rec in enumerate(records[1:]):
        steps = sorted(rec.steps)
        step = steps[len(steps) // 2] if steps else None
        comm = float((rec.info or {}).get("comm_s") or 0.0)
        out.append({"rank": i, "machine": ranks[i].machine, "node": ranks[i].node_ip, "step_s": step,
                    "compute_s": round(rec.compute_s, 4), "comm_s": round(comm, 4),
                    "comm_share": round(comm / rec.compute_s, 3) if rec.compute_s else None})
    return {"ranks": out}


def rerun_text(lost, left: list, spent_s: float, exc: BaseException) -> str:
    """The record's note of a request run again after ``lost`` was lost ``spent_s`` into it."""
    return (f"re-run on {' + '.join(f'{r.machine} {r.node_ip}' for r in left)} with the same seed after "
            f"{lost.machine}'s rank {lost.name} ({lost.node_ip}) was lost {spent_s:.1f} s into the request "
            f"({type(exc).__name__})")


def restart_text(lost, at: int, left: list, ranks: list) -> str:
    """``rank A lost at step 6: re-running on B`` (a B rank named when the group had several)."""
    several_b = sum(r.machine == "B" for r in ranks) > 1

    def who(r) -> str:
        return f"{r.machine} ({r.name})" if r.machine == "B" and several_b else r.machine

    return f"rank {who(lost)} lost at step {at}: re-running on {' + '.join(who(r) for r in left)}"


def group_timing(wall_s: float, a_start_s: float, formed_s: float, auto, world: int) -> dict:
    """The rest of a group's readout: the wall time of the whole denoise (from choosing its ranks to rank 0's
    latents: each rank's own ``compute_s`` overlaps the others', so they do not add up), what of it was the group's
    start (A's rank starting and loading its model, the group forming), and, for ``A+B`` or ``all``, what ``auto``
    would have done with this request (``auto``: its :class:`~.parallel_plan.Choice`, None under auto itself)."""
    out = {"wall_s": round(wall_s, 4), "start_s": {"a_rank": round(a_start_s, 4), "group": round(formed_s, 4)}}
    if auto is not None:
        if not auto.join:
            out["auto_view"] = "auto would have used one worker" + auto.why.removeprefix("parallel auto: one worker")
        elif world > 2:
            out["auto_view"] = "auto would have grouped A with one B worker only (it never groups more)"
    return out



def status_row(entry: dict, s: dict) -> dict:
    """A's rank as a worker row of ``/h3/status`` (the pool's own fields), from its ``pool_status`` answer ``s``."""
    cur = s.get("current")
    return {**entry, "ok": bool(s.get("ok")), "node": s.get("node_ip") or entry["node"],
            "pid": s.get("pid") or entry["pid"], "partitions": s.get("resident_partitions"),
            "precision": s.get("precision"), "dtype": s.get("dtype"), "queue": s.get("queue", []),
            "queued_steps": s.get("queued_steps", 0), "current_request": cur and cur.get("request_id"),
            "client": cur and cur.get("client"), "current": cur, "step_s": s.get("step_s"),
            "resident_bytes": s.get("resident_bytes") or {}, "released": s.get("released")}
