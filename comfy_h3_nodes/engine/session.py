"""Process-wide resident state: the A side, the cluster connection, DiT handles and the timing log.

ComfyUI re-executes nodes whenever their inputs change; the heavy things must not be rebuilt then. This module keeps
one resident :class:`~.a_side.ASide` per (model folder, dtype, attention backend), one cluster connection per process
(the embedded two-node default, or an address) and one executor per B actor. It knows nothing of ComfyUI.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from dataclasses import dataclass

from ..cluster import ray_cluster as cl
from .contract.configs import NAMESPACE, BConfig
from .contract.request import NEW_WORKER
from .contract.timing import TimingLog
from .model import catalog

_lock = threading.RLock()
TIMINGS = TimingLog()
_encoders: dict[tuple, object] = {}
_executors: dict[tuple, object] = {}
#: what machine B has (its model picker's choices, named relative to its model roots): B's last answer, or what the
#: embedded B would find under A's roots (:func:`b_model_list`)
B_MODELS: list[str] = []
#: the longest ComfyUI's node list (``INPUT_TYPES``) waits for B's answer; a later answer is taken the next time
PICKER_BOUND_S = 2.0
#: how long a fresh list serves again (ComfyUI asks ``INPUT_TYPES`` once per node when it validates a prompt)
PICKER_REUSE_S = 3.0
_models_lock = threading.Lock()  # B's list only: never held while B is asked or an executor starts
_asked: dict = {"pending": None, "at": 0.0}  # the call to B not answered yet (handle, ref); when a list was fresh
#: A's model roots, which B searches too when it has none (the embedded cluster: B is this machine); set by the nodes
A_MODEL_ROOTS: list[str] = []


@dataclass
class ClusterState:
    mode: str = ""           # "local" (embedded) or "address"
    address: str = ""
    embedded: cl.EmbeddedCluster | None = None
    started: float = 0.0


CLUSTER = ClusterState()


def _a_side(model_path: str, dtype: str, attention_backend: str, device: str | None, **parts):
    from .a_side.side import ASide  # noqa: PLC0415 - torch and diffusers load when a node first runs, not at import

    return ASide(model_path, dtype=dtype, attention_backend=attention_backend, device=device, **parts)


#: how a resident A side is built: ``(model_path, dtype, attention_backend, device) -> side`` (a benchmark may
#: substitute a wrapper, :func:`use_a_side`)
A_SIDE_FACTORY = _a_side


def use_a_side(factory=None) -> None:
    """Build resident A sides with ``factory`` from now on (None: the real one); forgets the resident ones."""
    global A_SIDE_FACTORY
    with _lock:
        A_SIDE_FACTORY = factory or _a_side
        _encoders.clear()


def encoders(model_path: str, dtype: str = "bfloat16", attention_backend: str = "sdpa", device: str | None = None,
             parts: dict | None = None, tokenizer_dirs: tuple = (), held_elsewhere: dict | None = None):
    """``(side, loaded_now)``: the resident A side for this configuration (loaded on first use, then reused);
    ``parts``: the text encoder / VAEs that come from single files (component -> path); ``held_elsewhere``: what
    other holders on A have (the host's figure: ComfyUI's own loaded models), which A's memory plan counts."""
    parts = {k: v for k, v in (parts or {}).items() if v}
    key = (str(model_path), dtype, attention_backend, device, tuple(sorted(parts.items())))
    with _lock:
        if key in _encoders:
            return _encoders[key], False
        extra = {"parts": parts, "tokenizer_dirs": tuple(tokenizer_dirs)} if parts else {}
        if held_elsewhere:
            extra["held_elsewhere"] = dict(held_elsewhere)
        side = A_SIDE_FACTORY(model_path, dtype, attention_backend, device, **extra)
        _encoders[key] = side
        return side, True


def ensure_cluster(address: str = "local", token_file: str | None = None) -> ClusterState:
    """Join (or start, for ``local``) the cluster once per process; a different address afterwards is an error."""
    import ray  # noqa: PLC0415 - Ray loads when a node first runs, not at ComfyUI's load

    address = (address or "local").strip()
    with _lock:
        if CLUSTER.mode:
            wanted = "local" if address == "local" else address
            have = "local" if CLUSTER.mode == "local" else CLUSTER.address
            if wanted != have:
                raise cl.ClusterError(
                    f"this process is already joined to the Ray cluster {have!r}; it cannot also join {wanted!r}. "
                    "Restart ComfyUI to switch clusters."
                )
            if ray.is_initialized():
                return CLUSTER
            CLUSTER.mode = ""  # Ray was shut down underneath us: join again
        if address == "local":
            CLUSTER.embedded = cl.EmbeddedCluster().start()
            CLUSTER.mode, CLUSTER.address = "local", CLUSTER.embedded.address
        else:
            # ComfyUI runs on machine A, which hosts the head: join A's own raylet (the head's address is A's).
            cl.connect(address, token_file=token_file, node_ip=address.rsplit(":", 1)[0].strip("[]"))
            CLUSTER.mode, CLUSTER.address = "address", address
        CLUSTER.started = time.time()
        return CLUSTER


def adopt_cluster(address: str) -> None:
    """Treat an already joined cluster (started by this process's caller, e.g. a test session) as ``local``."""
    with _lock:
        CLUSTER.mode, CLUSTER.address, CLUSTER.embedded, CLUSTER.started = "local", address, None, time.time()


def b_model_choices() -> list[str]:
    """The choices of H3RemoteDiT's model picker as last known (no call to B): B's models, and the tiny ones."""
    with _models_lock:
        return list(dict.fromkeys([*B_MODELS, *catalog.TINY_CHOICES]))


def _keep(models: list[str]) -> None:
    with _models_lock:
        B_MODELS[:] = models


def refresh_b_models(ex, timeout: float | None = None) -> list[str]:
    """Ask B which models it has, waiting at most ``timeout`` (else the health bound); keeps the last answer when B
    does not give one in time. A call B has not answered yet is waited for again next time, not repeated."""
    import ray  # noqa: PLC0415 - Ray loads when a node first runs, not at ComfyUI's load

    bound = ex.timeouts.health if timeout is None else min(timeout, ex.timeouts.health)
    try:
        with _models_lock:
            pending = _asked["pending"]
        if pending is None or pending[0] is not ex.b:
            pending = (ex.b, ex.b.models.remote(list(A_MODEL_ROOTS) if CLUSTER.mode == "local" else None))
            with _models_lock:
                _asked["pending"] = pending
        answer = ray.get(pending[1], timeout=bound)
    except ray.exceptions.GetTimeoutError:  # B is slow to answer: the picker keeps its list, the call stays asked
        return b_model_choices()
    except Exception:  # noqa: BLE001 - the picker keeps its last list; health errors are reported elsewhere
        with _models_lock:
            _asked["pending"] = None
        return b_model_choices()
    with _models_lock:
        if _asked["pending"] is pending:
            _asked["pending"] = None
        _asked["at"] = time.monotonic()
    ex._b_roots = answer.get("roots")  # B's own roots (None: it searches A's, as the embedded cluster's B does)
    _keep(answer["models"])
    return b_model_choices()


def b_model_list(bound: float = PICKER_BOUND_S) -> list[str]:
    """H3RemoteDiT's choices when ComfyUI builds or refreshes its node list (``INPUT_TYPES``), fresh where that is
    cheap and bounded: the embedded cluster's B (``local``, and before this process joined any cluster, the node's
    default) searches A's model roots, so they are listed here without Ray; a B of another machine (or one with
    roots of its own) is asked through the connection this process has, waiting at most ``bound`` seconds (on
    time-out the last list stays). Without a connection: the last list. Never raises."""
    try:
        try:
            executors = list(_executors.values())
        except RuntimeError:  # changed while copied (an executor starting): the last list
            executors = []
        if CLUSTER.mode in ("", "local"):
            executors = [e for e in executors if getattr(e, "_b_roots", None)]  # B with roots of its own
            if not executors:
                _keep(catalog.named_models(A_MODEL_ROOTS))
                return b_model_choices()
        if executors:
            with _models_lock:
                recent = time.monotonic() - _asked["at"] < PICKER_REUSE_S
            return b_model_choices() if recent else refresh_b_models(executors[-1], timeout=bound)
    except Exception:  # noqa: BLE001 - ComfyUI's node list must build: the last list
        pass
    return b_model_choices()


def dit(address: str, name: str, namespace: str, model_path: str, partition: str = "transformer",
        dtype: str = "bfloat16", attention_backend: str = "sdpa", timeouts=None, threads: int | None = None,
        precision: str = "auto", actors=None, parallel: str = "off", asked_by: str = ""):
    """An executor (A in this process) bound to the named B actor; started, topology and health checked, B's
    settings reconciled with these (see ``H3Executor.reconcile_b_config``) and B's model list refreshed.
    ``actors``: the :class:`~.executor.ActorClasses` to place (the caller's composition root decides them)."""
    from .executor import H3Executor  # noqa: PLC0415 - Ray loads when a node first runs, not at import

    ensure_cluster(address)
    allow_new = name.startswith(NEW_WORKER)  # another worker on B, asked for in so many words
    name = name.removeprefix(NEW_WORKER).strip()
    key = (address, name, namespace, str(model_path), partition, dtype, attention_backend, precision, parallel)
    with _lock:
        ex, seen = _executors.get(key), None
        if ex is not None and getattr(ex, "_cluster_started", None) != CLUSTER.started:
            seen = _seen(ex)
            _drop(key)  # joined a new cluster since: its actor handles are gone
            ex = None
        if ex is not None:
            ex.bclient.config.search_roots = tuple(A_MODEL_ROOTS)  # where B looks a model name up (A's, may change)
            ex.bclient.config.asked_by = asked_by  # the node input a refused name came from
            seen = _seen(ex)
            try:
                health = ex.check_health()
            except Exception:  # noqa: BLE001 - the B actor or its node went away: rebuild once, below
                _drop(key)
            else:
                ex.b_reload_note = new_worker_note(seen, health["B"], ex.bclient.primary_name)  # restarted since
                ex.reconcile_b_config(health["B"])  # another caller may have reconfigured B since
                refresh_b_models(ex)
                return ex
        ex = H3Executor(None, BConfig(str(model_path), partition=partition, dtype=dtype,
                                      attention_backend=attention_backend, precision=precision, name=name,
                                      namespace=namespace, threads=threads, search_roots=tuple(A_MODEL_ROOTS),
                                      asked_by=asked_by),
                        timeouts=timeouts, actors=actors,
                        parallel=parallel)
        # a name that matches none of B's workers is refused, not a second DiT loaded there: on a machine B of its own
        # and in the embedded cluster, where this process would start the worker itself (#37, item 5)
        ex.bclient.refuse_unknown, ex.bclient.allow_new = True, allow_new
        ex.start()
        ex._cluster_started = CLUSTER.started
        ex._session_key, ex._session_opts = key, {"timeouts": timeouts, "threads": threads, "actors": actors}
        ex.b_reload_note = new_worker_note(seen, ex.last_health["B"], ex.bclient.primary_name)  # the readout says it
        _executors[key] = ex
        refresh_b_models(ex)
        return ex


def live(ex) -> tuple[object, str]:
    """B's health where B is used (the start of a denoise or of a sampling), for an executor a loader made earlier
    (ComfyUI's cache hands the loader's output on without running it): ``(executor, note)``. The executor is this
    process's executor for ``ex``'s settings (``ex`` itself, or the one that replaced it), checked now: its worker
    found again by name when it restarted; rebuilt by :func:`dit` when B does not answer or the cluster was joined
    again (``ex``'s actor handles are gone then). ``note`` says what changed ("" = nothing): the worker restarted,
    B's model is released (this request reloads it), a new connection. An executor not made by :func:`dit` (a
    caller's own, whose routing picks a live worker per request) is returned as it is."""
    key = getattr(ex, "_session_key", None)
    if key is None:
        return ex, ""
    with _lock:
        current = _executors.get(key)
    if current is not None and getattr(current, "_cluster_started", None) == CLUSTER.started:
        # what the last request (or the loader) saw of B: the panel's status checks do not move it
        before = _seen(current)
        try:
            b = current.check_health()["B"]
        except Exception:  # noqa: BLE001 - B's worker or its node went away for good: rebuilt below, once
            pass
        else:
            current.reconcile_b_config(b)
            current._b_seen = {"pid": b.get("pid"), "name": current.bclient.primary_name}
            return current, _changed_note(before, b, current)
    seen = _seen(current if current is not None else ex)
    address, name, namespace, model_path, partition, dtype, attention_backend, precision, parallel = key
    opts = getattr(ex, "_session_opts", {})
    new = dit(address, name, namespace, model_path, partition, dtype, attention_backend, precision=precision,
              parallel=parallel, timeouts=opts.get("timeouts"), threads=opts.get("threads"),
              actors=opts.get("actors") or ex.actors)
    b = new.last_health["B"]
    new._b_seen = {"pid": b.get("pid"), "name": new.bclient.primary_name}
    reload = new_worker_note(seen, b, new.bclient.primary_name)
    return new, (f"B's DiT worker {new.bclient.primary_name or name} found again by name (pid {b.get('pid')}): the "
                 "connection the cached loader made had gone" + (f"; {reload}" if reload else "") + _released_note(b))


def _seen(ex) -> dict:
    """B's worker as ``ex`` last saw it, ``{"pid", "name"}`` (the last request's check, else its connection's)."""
    seen = getattr(ex, "_b_seen", None)
    if seen:
        return dict(seen)
    return {"pid": ((getattr(ex, "last_health", None) or {}).get("B") or {}).get("pid"),
            "name": getattr(getattr(ex, "bclient", None), "primary_name", None)}


def new_worker_note(seen: dict | None, b: dict, name: str | None) -> str:
    """The worker ``name`` is a new process since ``seen`` (B restarted: its service, its setup run again) and loaded
    its model anew: said with its load time; "" when it is the same process, another worker of a pool, or unseen."""
    before_pid = (seen or {}).get("pid")
    if not before_pid or b.get("pid") == before_pid or (seen.get("name") and name and seen["name"] != name):
        return ""
    took = f", {b['load_s']:.1f} s" if b.get("load_s") else ""
    return f"B's model was loaded again by its new worker process (pid {before_pid} -> {b.get('pid')}{took})"


def _released_note(b: dict) -> str:
    rel = b.get("released")
    return f"; B's model is released ({rel.get('cause')}): this request reloads it" if rel else ""


def _changed_note(before: dict, b: dict, ex) -> str:
    """What a denoise or sampling finds changed on B since the last check (the loader's, or the last request's)."""
    note, name = "", ex.bclient.primary_name
    if before.get("name") and name and before["name"] != name:  # a pool's worker left or stopped answering
        note = (f"B's DiT worker {before['name']} did not answer the health check, so {name} (pid {b.get('pid')}) is "
                "the pool's worker asked first now")
    elif before.get("pid") and b.get("pid") != before.get("pid"):
        took = f" ({b['load_s']:.1f} s)" if b.get("load_s") else ""
        note = (f"B's DiT worker {ex.bclient.primary_name} restarted since the last check (pid {before.get('pid')} "
                f"-> {b.get('pid')}): found again by name, its model loaded again{took}")
    return (note + _released_note(b)).removeprefix("; ")


def forget(name: str) -> int:
    """Drop this process's connections to the B actor ``name`` (B itself is left alone); returns how many."""
    with _lock:
        keys = [k for k in _executors if k[1] == name]
        for k in keys:
            _drop(k)
    return len(keys)


def _drop(key) -> None:
    ex = _executors.pop(key, None)
    if ex is not None:
        try:
            ex.shutdown(kill_b=False)
        except Exception:  # noqa: BLE001 - a stale executor may fail to stop cleanly; it is discarded anyway
            pass


def a_sides() -> list:
    """The resident A sides of this process (what a host accounts for as loaded models)."""
    with _lock:
        return list(_encoders.values())


def _worker_specs() -> list[tuple[str, str]]:
    with _lock:
        specs = list(dict.fromkeys((k[1], k[2]) for k in _executors))
    return specs or [("h3_dit*", NAMESPACE)]


def release_b(spec: str | None = None, namespace: str | None = None, timeout: float = 120.0) -> dict:
    """"Release B's model": every DiT worker this process uses (or ``spec`` in ``namespace``) drops its weights and
    keeps its actor; the next request reloads there. Needs this process joined to the cluster (a graph with
    ``H3RemoteDiT`` ran); ``python -m remote_worker release`` does the same from B's shell."""
    from .executor import pool  # noqa: PLC0415 - Ray loads when a node first runs, not at ComfyUI's load

    if "ray" not in sys.modules or not sys.modules["ray"].is_initialized():
        raise cl.ClusterError("not connected to the Ray cluster: run a graph with an H3RemoteDiT node first, or run "
                              "`python -m remote_worker release` on B.")
    specs = [(spec, namespace or NAMESPACE)] if spec else _worker_specs()
    out = {"released": [], "missing": {}}
    seen: set = set()
    for name, ns in specs:  # two specs may match one worker (h3_dit and h3_dit*): it is released, and listed, once
        got = pool.release(name, ns, timeout, cause="a release on request (Release B's model)")
        for r in got["released"]:
            if (ns, r["name"]) not in seen:
                seen.add((ns, r["name"]))
                out["released"].append(r)
        out["missing"].update(got["missing"])
    return out


def status(timeout: float = 5.0) -> dict:
    """What ``GET /h3/status`` answers: cluster, nodes, actors, health, and ``workers``: every DiT worker of the
    pools this process uses (node, pid, partitions, queue, current request and the client it serves), A's DiT rank
    among them once ``parallel`` started it (``machine`` A); never raises, never hangs."""
    out = {"connected": False, "cluster": {"mode": CLUSTER.mode or None, "address": CLUSTER.address or None},
           "nodes": [], "actors": [], "workers": [], "error": None, "time": time.time(),
           "models": {"A": catalog.choices(A_MODEL_ROOTS), "B": b_model_choices()}}
    if "ray" not in sys.modules:
        out["error"] = "not connected: run a graph with an H3RemoteDiT node to join the cluster"
        return out
    import ray  # noqa: PLC0415 - Ray loads when a node first runs, not at ComfyUI's load

    if not ray.is_initialized():
        out["error"] = "not connected: run a graph with an H3RemoteDiT node to join the cluster"
        return out
    out["connected"] = True
    try:
        out["nodes"] = [n.describe() for n in cl.list_nodes()]
        out["topology"] = cl.validate_topology().to_dict()
    except Exception as exc:  # noqa: BLE001 - reported to the UI
        out["error"] = str(exc)
    with _lock:
        executors = list(_executors.items())
    for key, ex in executors:
        entry = {"name": key[1], "namespace": key[2], "partition": key[4]}
        try:
            entry["health"] = ex.check_health(timeout=min(ex.timeouts.health, timeout))
            entry["workers"] = entry["health"].get("workers", [])
            groups = getattr(ex.bclient, "groups", None)
            a_rank = groups.a_rank_status(min(ex.timeouts.health, timeout)) if groups is not None else None
            if a_rank is not None:  # parallel denoise: A's DiT rank (its own process on A) is a worker too
                entry["a_rank"] = a_rank
            for w in [*entry["workers"], *([a_rank] if a_rank else [])]:  # every worker this process uses, once
                if all(x["name"] != w["name"] for x in out["workers"]):
                    out["workers"].append(w)
        except Exception as exc:  # noqa: BLE001 - reported to the UI
            entry["error"] = str(exc)
            out["error"] = out["error"] or f"B actor {key[1]!r} is unreachable: {exc}"
        out["actors"].append(entry)
    out["encoders"] = encoders_status()
    # A's DiT rank (parallel denoise), when this process started one: its worker row (what it holds, what was released)
    out["a_rank"] = next((w for w in out["workers"] if w.get("machine") == "A"), None)
    return out


#: the pack's own caches in this process, by name -> a callable giving how many entries it holds now (each module
#: that keeps one registers it: the LoRA sets put for B, the late readouts); ``status`` reports them
CACHE_SIZES: dict = {"timing_records": lambda: len(TIMINGS.records()), "executors": lambda: len(_executors),
                     "encoders": lambda: len(_encoders)}


def resources(timeout: float = 5.0) -> dict:
    """What a long day of use could grow (``bench soak`` samples it): object-store bytes used on each Ray node, Ray's
    session folder, the pack's cache folder, the size of each of the pack's caches here (``CACHE_SIZES``) and the
    Python objects of this process after a garbage collection. Never raises; every call bounded."""
    out: dict = {"caches": {}, "object_store": {}, "ray_session_dir": None, "pack_cache_dir": str(catalog.cache_root())}
    gc.collect()  # what is garbage now is not counted (and its memory is back before the caller reads the RSS)
    out["caches"]["python_objects"] = len(gc.get_objects())  # what a leak of Python objects shows in
    for name, size in list(CACHE_SIZES.items()):
        try:
            out["caches"][name] = int(size())
        except Exception:  # noqa: BLE001 - a cache that cannot say is left out
            pass
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return out
    try:
        from ray._private import worker  # noqa: PLC0415 - Ray's own stats (the raylets' store)
        from ray._private.grpc_utils import init_grpc_channel  # noqa: PLC0415
        from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc  # noqa: PLC0415

        out["ray_session_dir"] = worker._global_node.get_session_dir_path()
        for n in ray.nodes():
            if n.get("Alive"):
                # Ray's internal_api.node_stats opens a channel per call and never closes it: closed here
                channel = init_grpc_channel(f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}")
                try:
                    st = node_manager_pb2_grpc.NodeManagerServiceStub(channel).GetNodeStats(
                        node_manager_pb2.GetNodeStatsRequest(include_memory_info=False), timeout=timeout)
                finally:
                    channel.close()
                out["object_store"][n["NodeManagerAddress"]] = int(st.store_stats.object_store_bytes_used)
    except Exception as exc:  # noqa: BLE001 - reported, never raised
        out["error"] = str(exc)
    return out


def encoders_status() -> list[dict]:
    """A's resident sides: what each holds (its own count of bytes per component), what was released and why."""
    with _lock:
        items = list(_encoders.items())
    out = []
    for k, e in items:
        held = e.resident_bytes() if hasattr(e, "resident_bytes") else {}
        out.append({"model_path": k[0], "dtype": k[1], "attention_backend": k[2], "resident": e.resident(),
                    "parts": {c: str(p.path) for c, p in (getattr(e, "parts", None) or {}).items()},
                    "memory_plan": e.memory_plan.summary(), "resident_bytes": held,
                    "total_bytes": int(sum(held.values())), "released": dict(getattr(e, "released", {}) or {}),
                    "reloads": int(getattr(e, "reloads", 0))})
    return out


def a_rank_held(ex, timeout: float = 10.0) -> tuple | None:
    """``(rank, bytes it holds, device)`` of the executor's DiT rank on A (parallel denoise), or None: what a host
    accounts for besides the A side (bounded)."""
    import ray  # noqa: PLC0415 - a rank exists only once Ray is joined

    rank = ex.a_rank() if hasattr(ex, "a_rank") else None
    if rank is None:
        return None
    st = ray.get(rank.handle.pool_status.remote(), timeout=timeout)
    return rank, int(sum((st.get("resident_bytes") or {}).values())), st.get("device") or "cpu"
