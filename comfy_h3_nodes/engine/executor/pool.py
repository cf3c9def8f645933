"""The pool of DiT workers: every named B actor of the namespace that matches a name spec, and routing among them.

Data contract. A worker is a named DiT actor (``remote_worker setup --name NAME`` on any machine with role B). On its
``control`` concurrency group (answered while it denoises) it offers:

* ``enqueue(request_id, steps, client)``: a caller announces a denoise it is about to submit (its steps and the
  client that sends it), so every client of the pool sees the queue; ``denoise`` removes the entry when it ends;
* ``pool_status()``: ``{"name", "node_ip", "node_id", "pid", "partition", "resident_partitions", "precision",
  "dtype", "model", "memory_plan", "current": {"request_id", "client", "step", "total"} | None,
  "queue": [{"request_id", "steps", "client", "state"}], "queued_steps", "step_s"}``.

A name spec is one name (``h3_dit``), a comma-separated list (``b1,b2``) or prefixes with ``*`` (``h3_dit*``),
mixed freely. Discovery lists the namespace's named actors (``ray.util.list_named_actors``) and keeps those whose
``pool_status`` answers within a bound: a worker that left or died simply stops answering, one that joins is found
by the next request's discovery; nothing is restarted. A worker that missed its bound (its host or link cut off) is
*quiet* for ``QUIET_S``: while another worker answers, discovery gives it only ``QUIET_WAIT_S`` more, so every
request of a pool with one worker cut off does not pay the whole bound again; alone, it gets the whole bound.

Routing (:func:`choose`): a request goes to the worker that can start it soonest. A worker that already holds the
partition the workflow needs (``resident_partitions``) wins over one that must swap (a swap loads 31-62 GiB);
after that the shortest queue wins, counted in queued steps (the steps left of the running request plus every
queued request's steps), not requests; then the name, so the choice is stable. Each worker serves its denoise
group in arrival order (one slot), so several clients share it first come, first served.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import socket
import time
from dataclasses import dataclass, field

import ray

from ..contract.configs import PARTITION_OF
from ..contract.request import parse_actor_spec as parse_spec

log = logging.getLogger("comfy_h3.pool")

QUIET_S = 60.0  # how long a worker that missed its status bound stays quiet
QUIET_WAIT_S = 0.5  # what a quiet worker is waited for beyond the others, while another one answers


class PoolError(RuntimeError):
    """No worker of the pool can take a request; the message says which spec, namespace and what was seen."""


def matches(spec: str | tuple, name: str) -> bool:
    parts = parse_spec(spec) if isinstance(spec, str) else spec
    return any(fnmatch.fnmatchcase(name, p) if p.endswith("*") else name == p for p in parts)


def create_name(spec: str) -> str:
    """The name of the worker a caller starts itself when none matches (the embedded cluster): the first exact
    name of the spec, else the first prefix without its ``*`` (``h3_dit*`` -> ``h3_dit``)."""
    parts = parse_spec(spec)
    exact = [p for p in parts if not p.endswith("*")]
    return exact[0] if exact else parts[0].rstrip("*").rstrip("_-") or "h3_dit"


def client_id() -> str:
    """Who this A client is, as workers show it: host, process, Ray job."""
    try:
        job = ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - not connected yet
        job = "?"
    return f"{socket.gethostname()}:{os.getpid()} (job {job})"


@dataclass
class Worker:
    name: str
    handle: object
    status: dict = field(default_factory=dict)
    seen: float = 0.0

    @property
    def node_ip(self) -> str:
        return self.status.get("node_ip", "?")

    def holds(self, partition: str) -> bool:
        held = self.status.get("resident_partitions") or [self.status.get("partition")]
        return partition in held

    def queued_steps(self) -> int:
        return int(self.status.get("queued_steps") or 0)

    def describe(self) -> dict:
        s = self.status
        cur = s.get("current")
        return {"name": self.name, "node": s.get("node_ip"), "partitions": s.get("resident_partitions"),
                "precision": s.get("precision"), "dtype": s.get("dtype"), "queue": s.get("queue", []),
                "queued_steps": s.get("queued_steps", 0), "current_request": cur and cur.get("request_id"),
                "client": cur and cur.get("client"), "current": cur,
                "memory_plan": (s.get("memory_plan") or {}).get("summary"), "step_s": s.get("step_s"),
                "pid": s.get("pid"), "resident_bytes": s.get("resident_bytes") or {}, "released": s.get("released")}


def choose(workers: list[Worker], partition: str, exclude: tuple[str, ...] = ()) -> Worker | None:
    """The worker that can start a request of ``partition`` soonest (see the module docstring), or None."""
    candidates = [w for w in workers if w.name not in exclude]
    if not candidates:
        return None
    return min(candidates, key=lambda w: (not w.holds(partition), w.queued_steps(), w.name))


def partition_of(workflow: str) -> str:
    return PARTITION_OF.get(workflow, "transformer")


class DiTPool:
    """The workers of one name spec in one namespace, discovered on demand (every call bounded)."""

    def __init__(self, spec: str, namespace: str, status_timeout: float = 3.0):
        self.spec, self.parts = spec, parse_spec(spec)
        self.namespace = namespace
        self.status_timeout = status_timeout
        self.workers: dict[str, Worker] = {}
        self.client = client_id()
        self.last_refresh = 0.0
        self.missing: dict[str, str] = {}  # name -> why it was left out at the last refresh
        self.quiet: dict[str, float] = {}  # name -> when it last missed its status bound (time.monotonic)

    def names(self) -> list[str]:
        """Live named actors of the namespace that match the spec (Ray's registry of named actors)."""
        found = ray.util.list_named_actors(all_namespaces=True)
        return sorted({a["name"] for a in found if a.get("namespace") == self.namespace
                       and matches(self.parts, a["name"])})

    def refresh(self, timeout: float | None = None, exclude: tuple[str, ...] = ()) -> list[Worker]:
        """Find the matching workers and ask each for its status at once; keep those that answer within
        ``timeout``. Returns them (also in ``workers``)."""
        bound = self.status_timeout if timeout is None else timeout
        names = [n for n in self.names() if n not in exclude]
        pending, missing = {}, {}
        for name in names:
            w = self.workers.get(name)
            if w is None:
                try:
                    w = Worker(name, ray.get_actor(name, namespace=self.namespace))
                except ValueError:
                    continue  # gone between the listing and now
            try:
                pending[w.handle.pool_status.remote()] = w
            except Exception as exc:  # noqa: BLE001 - a handle Ray no longer serves
                missing[name] = f"{type(exc).__name__}"
        ready, short = self._wait(pending, bound)
        live, self.missing = {}, missing
        for ref, w in pending.items():
            if ref not in ready:
                if ref in short:  # quiet: its last miss of the whole bound stays the one that counts
                    ago = time.monotonic() - self.quiet[w.name]
                    missing[w.name] = f"no status within {bound:g} s {ago:.0f} s ago, nor within {QUIET_WAIT_S:g} s now"
                else:
                    missing[w.name] = f"no status within {bound:g} s"
                    self.quiet[w.name] = time.monotonic()
                continue
            self.quiet.pop(w.name, None)
            try:
                w.status, w.seen = ray.get(ref, timeout=bound), time.time()
            except Exception as exc:  # noqa: BLE001 - died, or not a DiT worker of this version
                missing[w.name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
                continue
            live[w.name] = w
        self.workers = live
        self.last_refresh = time.time()
        return list(live.values())

    def _wait(self, pending: dict, bound: float) -> tuple[set, set]:
        """The status refs answered, and those given less than ``bound``: quiet workers while another answers."""
        now = time.monotonic()
        quiet = {r for r, w in pending.items() if now - self.quiet.get(w.name, -QUIET_S) < QUIET_S}
        rest = [r for r in pending if r not in quiet]
        ready = set(ray.wait(rest, num_returns=len(rest), timeout=bound)[0]) if rest else set()
        if not quiet:
            return ready, set()
        short = quiet if ready else set()
        left = QUIET_WAIT_S if ready else max(0.0, bound - (time.monotonic() - now))
        ready |= set(ray.wait(list(quiet), num_returns=len(quiet), timeout=left)[0])
        return ready, short

    def pick(self, workflow: str, exclude: tuple[str, ...] = (), timeout: float | None = None,
             patience: float = 0.0) -> Worker:
        """Refresh, then choose the worker for a request of ``workflow``; :class:`PoolError` if none is left. With
        ``patience``, keep looking that long while matching workers exist but do not answer yet (restarting after
        their node came back, loading their model)."""
        deadline = time.monotonic() + patience
        while True:
            workers = self.refresh(timeout, exclude)
            w = choose(workers, partition_of(workflow), exclude)
            if w is not None:
                return w
            if not self.missing or time.monotonic() >= deadline:
                raise PoolError(self.none_left(exclude))
            time.sleep(0.5)

    def none_left(self, exclude: tuple[str, ...] = ()) -> str:
        seen = "; ".join(f"{n}: {why}" for n, why in sorted(self.missing.items()))
        gone = f" ({', '.join(exclude)} lost)" if exclude else ""
        return (f"no DiT worker matching {self.spec!r} in namespace {self.namespace!r} answers{gone}"
                f"{': ' + seen if seen else ''}; start one with `python -m remote_worker setup --name NAME` on a "
                "machine with role B.")

    def describe(self) -> list[dict]:
        return [w.describe() for w in sorted(self.workers.values(), key=lambda w: w.name)]


def release(spec: str, namespace: str, timeout: float, cause: str = "a release on request") -> dict:
    """Every worker of ``spec`` drops its model's weights and keeps its actor (each after its running requests):
    ``{"released": [{"name", "partitions", "bytes", "total_bytes", ...}], "missing": {name: why}}``. Bounded by
    ``timeout`` for the whole call; a worker that does not answer in time is named in ``missing`` (its release may
    still happen when its running request ends)."""
    pool = DiTPool(spec, namespace, status_timeout=min(timeout, 5.0))
    workers = pool.refresh()
    if not workers:
        raise PoolError(pool.none_left())
    refs = {w.handle.release.remote(cause): w for w in workers}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    out, missing = [], dict(pool.missing)
    for ref, w in refs.items():
        if ref not in ready:
            missing[w.name] = f"did not answer within {timeout:g} s (busy: it releases after its running requests)"
            continue
        try:
            out.append(ray.get(ref, timeout=timeout))
        except Exception as exc:  # noqa: BLE001 - reported per worker
            missing[w.name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc) else ''}"
    return {"released": sorted(out, key=lambda r: r.get("name") or ""), "missing": missing}
