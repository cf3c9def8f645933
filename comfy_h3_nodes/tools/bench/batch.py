"""``python -m comfy_h3_nodes bench batch``: N prompts in one graph run against N graph runs of one prompt each.

Both go through the headless runner (the same node classes ComfyUI runs, A in this process as in ComfyUI) on the
embedded two-node cluster, with the tiny model and the stand-in stage times of ``bench pipeline`` added to the real
work (A: encode and decode, B: denoise; :mod:`.substitutes`: the nodes' A side is a timed one, and the DiT worker the
runner finds is a timed one started here first), so the stages have known, balanced costs.

* batch: ``example_workflows/h3_t2va_batch.json`` with N prompts from its H3PromptList;
* sequential: ``example_workflows/h3_t2va.json`` run N times, one prompt each (what ComfyUI's "queue N times" does);
* ideal: one request alone (the pipeline's fill: a sequential run's mean) + (N-1) x the busier machine's work per
  request, as the batch's own records measure it (A: encode, B->A receipt, decode and the MP4; B: A->B receipt and
  denoise).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict

import ray

from ...engine import session
from ...engine.contract.configs import TINY, BConfig
from ...engine.contract.versions import PACK_ROOT
from .. import runner
from . import substitutes
from .common import DEFAULT_SYNTHETIC

EXAMPLES = PACK_ROOT / "example_workflows"
GOALS = {"ratio_vs_ideal": 1.1, "speedup_vs_sequential": 1.5}
WORKER = "h3_dit_bench_batch"
SETTINGS = ["3.width=64", "3.height=64", "5.steps=3", '1.dtype="float32"', '2.dtype="float32"',
            f'2.actor_name="{WORKER}"', '6.decode_on="A"']


def _prompts(n: int) -> list[str]:
    return [f"request {i + 1}: a small robot dances on a table while a piano plays" for i in range(n)]


def _machine_work(result) -> list[dict]:
    """Seconds each machine worked on each request of a graph run, from its records (A: encode, B->A receipt,
    decode and the MP4; B: A->B receipt and denoise)."""
    per: dict[str, dict] = {}
    saves = []
    for event, payload in result.events:
        if event != "h3.timing":
            continue
        for r in payload["stages"]:
            if r["stage"] == "save":
                saves.append(r["compute_s"])
            elif r["request_id"]:
                per.setdefault(r["request_id"], {})[r["stage"]] = r
    out = []
    for recs, save in zip(per.values(), saves):
        a = recs["encode"]["compute_s"] + recs["b_to_a"]["receive_s"] + recs["decode"]["compute_s"] + save
        out.append({"A": a, "B": recs["a_to_b"]["receive_s"] + recs["denoise"]["compute_s"]})
    return out


def run_batch(requests: int = 8, synthetic: dict | None = None, log=print) -> dict:
    synthetic = dict(DEFAULT_SYNTHETIC if synthetic is None else synthetic)
    session.use_a_side(substitutes.a_side_factory({k: v for k, v in synthetic.items() if k in ("encode", "decode")}))
    prompts = _prompts(requests)
    t2va, batch = str(EXAMPLES / "h3_t2va.json"), str(EXAMPLES / "h3_t2va_batch.json")
    worker = None
    try:
        with tempfile.TemporaryDirectory() as out:
            run = dict(tiny=True, output=out, quiet=True)
            session.ensure_cluster("local")  # the runner's own embedded cluster, joined first so B's worker can start
            b_stages = {"denoise": synthetic.get("denoise", 0.0)}
            worker = substitutes.actors(b_stages).dit(asdict(BConfig(TINY, dtype="float32", name=WORKER)),
                                                      env=substitutes.env(b_stages))
            ray.get(worker.ping.remote(), timeout=600)
            runner.execute(t2va, sets=[*SETTINGS, '3.prompt="warm-up"'], **run)  # models and actors resident
            t0 = time.perf_counter()
            for i, p in enumerate(prompts):  # what "queue N times" does: one graph run per prompt
                runner.execute(t2va, sets=[*SETTINGS, f"3.prompt={json.dumps(p)}", f"5.seed={i}"], **run)
            sequential = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = runner.execute(batch, sets=[*SETTINGS, f"12.prompts={json.dumps(chr(10).join(prompts))}",
                                              "12.seed=0"], **run)
            makespan = time.perf_counter() - t0
            videos = len(res.videos())
    finally:
        session.use_a_side(None)
        session.forget(WORKER)  # this process's executor for the stand-in worker goes with it
        if worker is not None:
            ray.kill(worker, no_restart=True)
    busy = _machine_work(res)  # the work each request of the batch really cost each machine
    if len(busy) != requests:
        raise RuntimeError(f"the batch run reported {len(busy)} complete requests of {requests}")
    t_a, t_b = statistics.median(x["A"] for x in busy), statistics.median(x["B"] for x in busy)
    fill = sequential / requests  # one request's graph run, end to end
    ideal = fill + (requests - 1) * max(t_a, t_b)
    out = {"requests": requests, "makespan_s": round(makespan, 3), "ideal_s": round(ideal, 3),
           "sequential_s": round(sequential, 3), "ratio_vs_ideal": round(makespan / ideal, 3),
           "speedup_vs_sequential": round(sequential / makespan, 3)}
    log(f"bench batch: {requests} prompts, synthetic stages {synthetic}, {videos} MP4s written\n"
        f"  one graph run (batch)        {makespan:7.3f} s\n"
        f"  {requests} graph runs of one prompt  {sequential:7.3f} s  (fill {fill:.3f} s per run)\n"
        f"  ideal                        {ideal:7.3f} s  (A {t_a:.3f} s, B {t_b:.3f} s per request)\n"
        f"  ratio vs ideal {out['ratio_vs_ideal']} (goal <= {GOALS['ratio_vs_ideal']}), speedup vs sequential "
        f"{out['speedup_vs_sequential']} (goal >= {GOALS['speedup_vs_sequential']})")
    if videos != requests:
        raise RuntimeError(f"the batch run wrote {videos} MP4s for {requests} prompts")
    return out
