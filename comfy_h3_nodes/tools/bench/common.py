"""What the benchmarks share: the cluster they run on, the tiny checkpoint, requests, medians and the goals."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import statistics
import tempfile

import ray

from ... import placement
from ...cluster import ray_cluster as cl
from ...engine.contract.configs import BConfig, SideConfig, Timeouts
from ...engine.contract.request import H3Request
from ...engine.contract.timing import summarize
from ...engine.executor import ActorClasses, H3Executor
from ...engine.model.tiny import build_tiny_checkpoint
from . import substitutes

GOALS = {"plan_vs_measured": 0.02, "fp8_both_vs_bf16_one": 1.05, "ratio_vs_raw": 1.2, "makespan_vs_ideal": 1.05,
         "speedup_vs_sequential": 1.6, "step_overhead_us": 1000.0, "warm_load_s": 0.0}

# Balanced stand-in stage times of ``bench pipeline`` (seconds). A: encode + decode = 0.30 s plus ~0.1 s of real
# tiny-model work; B: denoise 0.40 s plus ~0.01 s of real work, so both machines spend ~0.41 s per request.
DEFAULT_SYNTHETIC = {"encode": 0.15, "denoise": 0.40, "decode": 0.15}
BENCH_TIMEOUTS = Timeouts(start=600, health=30, encode=120, handoff=120, stall=120, decode=120, poll=0.05)


def _median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else float("nan")


def _ms(s: float) -> float:
    return round(s * 1e3, 3)


@contextlib.contextmanager
def cluster(object_store_mb: int = 1024):
    """The embedded two-node cluster, or the one this process already joined (topology validated either way)."""
    if ray.is_initialized():
        cl.validate_topology()
        yield None
        return
    c = cl.EmbeddedCluster(object_store_mb=object_store_mb).start()
    try:
        cl.validate_topology()
        yield c
    finally:
        c.shutdown()


def tiny_checkpoint(path: str | None = None) -> pathlib.Path:
    """The tiny random checkpoint (real classes), built once into a cache folder (or ``path``)."""
    if path:
        p = pathlib.Path(path)
        if not (p / "modular_model_index.json").is_file():
            build_tiny_checkpoint(p, seed=0)
        return p
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "comfy-h3"
    target = cache / "bench-tiny-h3"
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-tiny-h3.", dir=cache))
    build_tiny_checkpoint(tmp, seed=0)
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def stand_in_actors(stages: dict | None) -> ActorClasses:
    """The composition root's actors, or, with ``stages`` (seconds per stage), their timed stand-ins."""
    if not stages:
        return placement.ACTORS
    return substitutes.actors(stages)


def _make_executor(ckpt, tag: str, synthetic: dict | None = None, max_in_flight: int = 2, spec: str | None = None):
    """An executor with A's actor and a DiT worker of its own (``spec``: a pool's name spec instead), both doing
    their real work plus the stand-in seconds of ``synthetic``."""
    a = SideConfig(str(ckpt), dtype="float32", threads=1)
    b = BConfig(str(ckpt), dtype="float32", threads=1, name=spec or f"h3_dit_bench_{tag}_{os.getpid()}")
    return H3Executor(a, b, max_in_flight=max_in_flight, timeouts=BENCH_TIMEOUTS,
                      a_name=f"h3_enc_bench_{tag}_{os.getpid()}", actors=stand_in_actors(synthetic),
                      env=substitutes.env(synthetic))


def _request(i: int, steps: int = 2, size: int = 32):
    return H3Request(prompt=f"bench request {i}: a robot dances while a piano plays", height=size, width=size,
                     num_frames=124, steps=steps, seed=1000 + i, request_id=f"bench-{i:03d}-{os.getpid()}")


def _busy(records) -> dict:
    """Seconds each machine was occupied by one request (its calls, minus waiting for the producer)."""
    r = {x.stage: x for x in records}
    a = r["encode"].compute_s + r["b_to_a"].receive_s + r["b_to_a"].validate_s + r["decode"].compute_s
    b = r["a_to_b"].receive_s + r["a_to_b"].validate_s + r["denoise"].compute_s
    return {"A": a, "B": b}


def _stage_medians(results) -> dict:
    per = [summarize(res.records) for res in results]
    return {k: round(_median([p.get(k, 0.0) for p in per]), 4) for k in ("encode", "a_to_b", "denoise", "b_to_a",
                                                                          "decode")}
