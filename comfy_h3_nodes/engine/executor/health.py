"""Health of the pair, checked before requests and on demand: both machines answer within a bound, speak the same
versions (wire schema included), and B's clock offset is known so B's records land on A's time axis.

Output of :func:`check`: ``{"A": health | absent, "B": health, "workers": [...], "clock": {"b_minus_a_s",
"rtt_s"}, "topology": {...}}``; every call bounded, a failure is one sentence naming the machine.
"""

from __future__ import annotations

import time

import ray

from ..contract.errors import H3Error, H3Timeout
from ..contract.versions import versions
from .failures import creation_cause


def measure_clock(actor, bound: float, rounds: int = 3) -> tuple[float, float]:
    """The actor's clock minus this machine's, from the round trip with the smallest delay (NTP's estimate)."""
    best = None
    for _ in range(rounds):
        t0 = time.time()
        tb = ray.get(actor.clock.remote(), timeout=bound)
        t1 = time.time()
        if best is None or t1 - t0 < best[1]:
            best = (tb - (t0 + t1) / 2, t1 - t0)
    return best


def ask(role: str, actor, bound: float) -> dict:
    try:
        return ray.get(actor.health.remote(), timeout=bound)
    except ray.exceptions.GetTimeoutError as exc:
        raise H3Timeout(f"machine {role} did not answer a health check within {bound:.0f} s.") from exc
    except ray.exceptions.RayError as exc:
        raise H3Error(f"machine {role} failed its health check: {creation_cause(exc)}") from exc


def check(a, b, bound: float, topology=None) -> dict:
    """Both machines' health: ``a`` is the A client (or None: A given per call, as in ComfyUI), ``b`` the
    :class:`~.b_client.BClient` (its primary is replaced when it left the pool)."""
    out = {}
    pool = b.pool
    live = pool.refresh(min(bound, pool.status_timeout))
    ids = {w.handle._actor_id for w in live}
    if live and (b.primary is None or b.primary._actor_id not in ids):
        b.primary, b.primary_name = live[0].handle, live[0].name
    out["workers"] = pool.describe()
    if a is not None:
        out["A"] = a.health(bound)
    out["B"] = ask("B", b.primary, bound)
    b.clock_offset_s, rtt = measure_clock(b.primary, bound)
    out["clock"] = {"b_minus_a_s": b.clock_offset_s, "rtt_s": rtt}
    va, vb = out["A"]["versions"] if "A" in out else versions(), out["B"]["versions"]
    diff = {k: (va.get(k), vb.get(k)) for k in set(va) | set(vb) if va.get(k) != vb.get(k)}
    if diff:
        desc = ", ".join(f"{k} A={x} B={y}" for k, (x, y) in sorted(diff.items()))
        raise H3Error(f"A and B run different versions ({desc}); install the same versions on both machines.")
    out["topology"] = topology.to_dict() if topology else None
    return out
