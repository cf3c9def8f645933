"""``python -m comfy_h3_nodes bench pool``: a B-bound load through a pool of one DiT worker, then of two.

Three nodes on this machine (A at 127.0.0.2, B1 at 127.0.0.3, B2 at 127.0.0.4; the embedded cluster plus one more
raylet), the tiny model, and stand-in stage times that make B the bottleneck: A 0.1 s per request (encode 0.05 s,
decode 0.05 s), B 0.8 s per denoise. The same ``requests`` requests run through an executor whose pool is B1 alone,
then through one whose pool is B1 and B2 (``max_in_flight`` requests between A and B at a time, the same both runs).
The makespan is the wall time from the first submit to the last decoded request. With B 8 x A's time per request, two
workers should nearly halve it: the goal is a speedup of at least 1.8.

Its ``--json`` line is ``{"workers": {"1": {"makespan_s": ..}, "2": {"makespan_s": ..}}, "speedup": ..}``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import ray

from ...cluster import ray_cluster as cl
from ...engine.contract.configs import BConfig
from . import substitutes
from .common import _make_executor, _request, tiny_checkpoint

POOL_SYNTHETIC = {"encode": 0.05, "denoise": 0.8, "decode": 0.05}
GOAL_SPEEDUP = 1.8
B2_IP = "127.0.0.4"


def _start_worker(name: str, node_id: str, ckpt, synthetic: dict):
    cfg = asdict(BConfig(str(ckpt), dtype="float32", threads=1, name=name, max_restarts=0))
    return substitutes.actors(synthetic).dit(cfg, node_id=node_id, env=substitutes.env(synthetic))


def run_pool(requests: int = 8, synthetic: dict | None = None, max_in_flight: int = 4, ckpt=None,
             object_store_mb: int = 512, log=print) -> dict:
    synthetic = dict(POOL_SYNTHETIC if synthetic is None else synthetic)
    ckpt = ckpt or tiny_checkpoint()
    own = None
    if not ray.is_initialized():
        own = cl.EmbeddedCluster(object_store_mb=object_store_mb).start()
    tag = f"h3_bench_pool_{os.getpid()}"
    actors, executors = [], []
    try:
        if own is not None:
            own.add_b_node(B2_IP)
        topo = cl.validate_topology()
        b_nodes = topo.b_nodes()
        if len(b_nodes) < 2:
            raise RuntimeError(f"bench pool needs two B nodes; the cluster has {len(b_nodes)} (start it without "
                               "joining another cluster first, so the bench adds its second B node)")
        names = [f"{tag}_b{i + 1}" for i in range(2)]
        t0 = time.perf_counter()
        actors = [_start_worker(n, node.node_id, ckpt, synthetic) for n, node in zip(names, b_nodes)]
        ray.get([a.ping.remote() for a in actors], timeout=600)
        log(f"pool: 2 DiT workers up in {time.perf_counter() - t0:.1f} s on {', '.join(n.ip for n in b_nodes[:2])}; "
            f"{requests} requests, stand-in A {synthetic['encode'] + synthetic['decode']:.2f} s "
            f"(encode {synthetic['encode']} + decode {synthetic['decode']}), B {synthetic['denoise']} s, "
            f"max_in_flight {max_in_flight}")
        out: dict = {"workers": {}}  # + "served": requests per worker, per pool size (not in the JSON line)
        for k, spec in ((1, names[0]), (2, f"{tag}_b*")):
            ex = _make_executor(ckpt, "pool", synthetic, max_in_flight, spec=spec)
            executors.append(ex)
            ex.start()
            ex.run_many([_request(900 + 10 * k + i) for i in range(k)])  # warm: B's pipelines built
            reqs = [_request(100 * k + i) for i in range(requests)]
            t0 = time.perf_counter()
            results = ex.run_many(reqs)
            makespan = time.perf_counter() - t0
            served: dict[str, int] = {}
            for r in results:
                w = next(x for x in r.records if x.stage == "denoise").info.get("worker", "?").removeprefix(tag + "_")
                served[w] = served.get(w, 0) + 1
            out["workers"][str(k)] = {"makespan_s": round(makespan, 3)}
            out.setdefault("served", {})[str(k)] = served
            log(f"  {k} worker{'s' if k > 1 else ''}: makespan {makespan:.2f} s "
                f"({makespan / requests:.2f} s per request); requests per worker {served}")
        out["speedup"] = round(out["workers"]["1"]["makespan_s"] / out["workers"]["2"]["makespan_s"], 3)
        log(f"  speedup {out['speedup']:.2f}x with 2 workers (goal >= {GOAL_SPEEDUP}; "
            f"{'met' if out['speedup'] >= GOAL_SPEEDUP else 'NOT met'})")
        return out
    finally:
        for ex in executors:
            try:
                ex.shutdown(kill_b=False)
            except Exception:  # noqa: BLE001 - the workers are killed below anyway
                pass
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        if own is not None:
            own.shutdown()  # B2's raylet ends with the cluster


def main_json(result: dict) -> str:
    return json.dumps({"workers": result["workers"], "speedup": result["speedup"]})
