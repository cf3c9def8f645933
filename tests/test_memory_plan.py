"""The memory plan: its arithmetic at the released model's size, A's plan, and the plan as B's Ray actor checks and
reports it (tiny checkpoints and lowered limits only; nothing is ever exhausted for real)."""

from __future__ import annotations

import json

import pytest

from comfy_h3_nodes.engine.model import memory_plan as mp
from comfy_h3_nodes.engine.model import released_sizes
from comfy_h3_nodes.engine.contract.configs import MODEL_COMPONENTS_A
from comfy_h3_nodes.engine.model import split

GIB = 2**30
SPARK = 121 * GIB  # about what a DGX Spark has usable (shared/design.md section 8)


@pytest.fixture(scope="module")
def real():
    return {"single_file": released_sizes.real_sources("single_file"), "gguf": released_sizes.real_sources("gguf", "Q8_0")}


def test_real_size_resident_bytes(real):
    both = ("transformer", "transformer_ref")
    bf16 = mp.plan_b(real["single_file"], ("transformer",), "bf16", limit_bytes=SPARK)
    fp8 = mp.plan_b(real["single_file"], both, "fp8", limit_bytes=SPARK)
    q8 = mp.plan_b(real["gguf"], both, "gguf", limit_bytes=SPARK)
    assert abs(bf16.resident_bytes / GIB - 61.7) < 0.1  # the published 61.7 GiB per partition
    assert abs(fp8.components[0].bytes / GIB - 30.9) < 0.2  # design: fp8 storage about 31 GiB
    assert abs(q8.components[0].bytes / GIB - 32.8) < 0.3  # design: GGUF Q8_0 about 32.8 GiB
    assert fp8.resident_bytes <= 1.05 * bf16.resident_bytes  # both partitions in fp8 cost one in bf16
    assert bf16.fits and fp8.fits and q8.fits
    # a bf16 load of the second partition peaks at fp8 + bf16, and the plan counts it
    assert abs(fp8.load_peak_bytes / GIB - (30.9 + 61.7)) < 0.3


def test_real_size_bf16_both_is_refused_with_what_fits(real):
    plan = mp.plan_b(real["single_file"], ("transformer", "transformer_ref"), "bf16", "bfloat16", "cuda",
                     limit_bytes=SPARK)
    assert not plan.fits
    with pytest.raises(mp.MemoryPlanError) as err:
        plan.check()
    msg = str(err.value)
    assert "transformer 61.7 GiB + transformer_ref 61.7 GiB + working " in msg
    assert "> 117.4 GiB free on B" in msg
    assert "fp8 for both (" in msg and "bfloat16 for one partition (swapping) (" in msg


def test_working_memory_grows_with_the_canvas(real):
    cfg = real["single_file"]["transformer"].config()
    small = mp.working_bytes_b(cfg, "bf16", "bfloat16", (480, 832, 124))
    big = mp.working_bytes_b(cfg, "bf16", "bfloat16", (768, 1344, 345))
    assert mp.packed_rows(768, 1344, 124) == 37_966 and mp.packed_rows(480, 832, 124) == 15_100  # design, section 2
    assert small < big and 2 * GIB < small < 4 * GIB and 15 * GIB < big < 25 * GIB


def test_available_memory_sources(monkeypatch):
    n, where = mp.available_memory("cpu")
    assert n > 0 and where == "MemAvailable"
    monkeypatch.setenv(mp.LIMIT_ENV, "12345")
    assert mp.available_memory("cpu") == (12345, mp.LIMIT_ENV)
    assert mp.available_memory("cpu", limit_bytes=7) == (7, "limit")  # the parameter wins
    monkeypatch.setenv(mp.LIMIT_ENV, "lots")
    with pytest.raises(mp.MemoryPlanError, match="not a number of bytes"):
        mp.available_memory("cpu")


def test_a_plan_predicts_what_a_holds_and_refuses(tiny_ckpt):
    from comfy_h3_nodes.engine.a_side.side import ASide

    a = ASide(tiny_ckpt, dtype="bfloat16")
    planned = {c.name: c.bytes for c in a.memory_plan.components}
    for name in MODEL_COMPONENTS_A:
        model = getattr(a._host, name)
        held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        assert abs(planned[name] - held) <= 0.01 * held, name  # headers hold no non-persistent buffers (bytes)
    assert a.memory_plan.canvas == (64, 128, 124)  # the checkpoint's own default canvas
    with pytest.raises(mp.MemoryPlanError, match=r"^memory plan refused before loading anything: A plan \(float32\): "
                                                 r"text_encoder .* \+ vae .* \+ audio_vae .* > .* free on A"):
        ASide(tiny_ckpt, dtype="float32", memory_limit_bytes=10**6)


def test_bench_memory_through_the_actor(ray_cluster, tiny_ckpt, capsys):
    """``bench memory --json``: B's actor measures exactly what the plan predicted, in all three plans."""
    from comfy_h3_nodes.tools import bench

    assert bench.main(["memory", "--json", "--ckpt", str(tiny_ckpt)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(last)
    assert list(out) == ["plans"] and list(out["plans"]) == ["bf16-one", "fp8-both", "gguf-q8_0-both",
                                                             "pruned-fp8-both"]
    for label, v in out["plans"].items():
        assert list(v) == ["tiny_measured_bytes", "tiny_planned_bytes", "real_planned_bytes"]
        assert abs(v["tiny_planned_bytes"] - v["tiny_measured_bytes"]) <= 0.02 * v["tiny_measured_bytes"], label
    p = out["plans"]
    assert p["fp8-both"]["real_planned_bytes"] <= 1.05 * p["bf16-one"]["real_planned_bytes"]
    assert p["fp8-both"]["tiny_measured_bytes"] < 2 * p["bf16-one"]["tiny_measured_bytes"]
    # Comfy-Org's pruned fp8_scaled files: both partitions about 40 GB at the released size (21 GB files each)
    assert 38e9 < p["pruned-fp8-both"]["real_planned_bytes"] < 43e9
    assert p["pruned-fp8-both"]["real_planned_bytes"] < 0.7 * p["fp8-both"]["real_planned_bytes"]


def test_actor_refuses_a_plan_that_does_not_fit(ray_cluster, tiny_ckpt):
    import dataclasses
    import os

    import ray

    from comfy_h3_nodes.engine.contract.configs import BConfig
    from remote_worker.actor import start_dit

    cfg = dataclasses.asdict(BConfig(str(tiny_ckpt), dtype="bfloat16", threads=1, precision="fp8",
                                     name=f"h3_dit_plan_refused_{os.getpid()}", max_restarts=0))
    cfg["memory_limit_bytes"] = 1000
    actor = start_dit(cfg, detached=False, get_if_exists=False)
    try:
        with pytest.raises(ray.exceptions.RayError, match="memory plan refused before loading anything: B plan "
                                                          r"\(fp8, transformer only, swapping\): transformer "):
            ray.get(actor.ping.remote(), timeout=120)
    finally:
        ray.kill(actor, no_restart=True)


def test_preflight_prints_the_plan_b_will_load_by(tiny_ckpt, monkeypatch):
    from remote_worker import preflight as pf

    monkeypatch.delenv("H3_MODEL_ROOTS", raising=False)
    gguf = {p: str(tiny_ckpt / "gguf" / f"{p}-Q8_0.gguf") for p in ("transformer", "transformer_ref")}
    opts = pf.Options(head="127.0.0.2:1", model_path=str(tiny_ckpt), allow_cpu=True, sources=gguf,
                      model_roots=[str(tiny_ckpt)], head_timeout=2)
    res = pf.run(opts)
    checks = {c.name: c for c in res.checks}
    assert checks["transformer source"].ok and "GGUF" in checks["transformer source"].detail
    assert checks["memory plan"].ok and "B plan (gguf Q8_0, both partitions)" in checks["memory plan"].detail
    assert "object store" in checks["memory plan"].detail
    monkeypatch.setenv(mp.LIMIT_ENV, str(2**20))
    res = pf.run(pf.Options(head="127.0.0.2:1", model_path=str(tiny_ckpt), allow_cpu=True, precision="fp8",
                            model_roots=[str(tiny_ckpt)], object_store_mb=1, head_timeout=2))
    plan = next(c for c in res.checks if c.name == "memory plan")
    assert not plan.ok and "B plan (fp8, transformer only, swapping)" in plan.detail and "--precision" in plan.fix


def test_b_plan_counts_the_workers_b_holds(tiny_ckpt):
    """#37 item 5: B's plan beside the workers B holds. A fixed figure (a limit: B's whole budget) loses each other
    worker's model and working memory; a measured one (MemAvailable already lacks what they hold) loses their working
    memory and a released worker's model (its next request loads it again), and says what they hold now."""
    from comfy_h3_nodes.engine.model import formats

    sources = {"transformer": formats.detect(tiny_ckpt, "transformer")}
    alone = mp.plan_b(sources, ("transformer",), "auto", "float32", limit_bytes=10**9)
    other = {"planned": alone.resident_bytes, "working": alone.working_bytes, "now": alone.resident_bytes}
    limit = int((alone.need_bytes + 0.5 * (other["planned"] + other["working"])) / (1 - mp.margin_fraction()))
    assert mp.plan_b(sources, ("transformer",), "auto", "float32", limit_bytes=limit).fits  # alone it fits
    beside = mp.plan_b(sources, ("transformer",), "auto", "float32", limit_bytes=limit, workers={"h3_dit": other})
    assert not beside.fits
    assert beside.usable_bytes == limit - beside.margin_bytes - other["planned"] - other["working"]
    with pytest.raises(mp.MemoryPlanError) as info:
        beside.check()
    said = str(info.value)
    assert said.startswith("memory plan refused before loading anything: B plan (float32, transformer only"), said
    assert f"margin kept, less worker h3_dit's {mp.human(other['planned'] + other['working'])})" in said, said
    assert said.endswith("; options: set actor_name to h3_dit, which B holds"), said
    # measured: a loaded worker's model is already outside the free figure, a released one's is not
    reserved, held = mp.counted_workers({"h3_dit": other}, "MemAvailable")
    assert reserved == {"worker h3_dit": other["working"]} and held == {"worker h3_dit's weights": other["now"]}
    reserved, held = mp.counted_workers({"h3_dit": {**other, "now": 0, "released": True}}, "MemAvailable")
    assert reserved == {"worker h3_dit": other["planned"] + other["working"]} and held == {}
    assert mp.counted_workers(None, "limit") == ({}, {})


def test_a_second_worker_that_would_not_fit_beside_the_one_b_holds_is_refused_before_loading(ray_cluster, tiny_ckpt):
    """A second worker on B on purpose: its plan counts the worker B holds (asked on B, by the new worker) and is
    refused before it loads anything, with the numbers; alone, the same budget fits it. The first keeps serving."""
    import dataclasses
    import os

    import ray

    from comfy_h3_nodes.engine.contract.configs import BConfig
    from comfy_h3_nodes.engine.model import formats
    from remote_worker.actor import start_dit

    first_name, second_name = f"h3_dit_held_{os.getpid()}", f"h3_dit_beside_{os.getpid()}"
    cfg = dataclasses.asdict(BConfig(str(tiny_ckpt), dtype="float32", threads=1, name=first_name, max_restarts=0))
    first = start_dit(cfg, detached=False, get_if_exists=False)
    second = None
    try:
        held = ray.get(first.pool_status.remote(), timeout=120)["plan"]
        assert held["planned"] > 0 and held["working"] > 0, held
        one = mp.plan_b({"transformer": formats.detect(tiny_ckpt, "transformer")}, ("transformer",), "auto",
                        "float32", canvas=mp.default_canvas(tiny_ckpt), limit_bytes=10**9)
        limit = int((one.need_bytes + 0.5 * (held["planned"] + held["working"])) / (1 - mp.margin_fraction()))
        assert mp.plan_b({"transformer": formats.detect(tiny_ckpt, "transformer")}, ("transformer",), "auto",
                         "float32", canvas=one.canvas, limit_bytes=limit).fits  # the same budget fits it alone
        second = start_dit({**cfg, "name": second_name, "memory_limit_bytes": limit}, detached=False,
                           get_if_exists=False)
        with pytest.raises(ray.exceptions.RayError) as info:
            ray.get(second.ping.remote(), timeout=120)
        said = str(info.value)
        assert "memory plan refused before loading anything: B plan (float32, transformer only" in said, said
        # the session may hold other workers on B (earlier tests'): each is counted in its own clause
        assert f"less worker {first_name}'s {mp.human(held['planned'] + held['working'])}" in said, said
        assert ray.get(first.pool_status.remote(), timeout=30)["ok"]  # the worker B holds keeps serving
    finally:
        for actor in (second, first):
            if actor is not None:
                ray.kill(actor, no_restart=True)


def test_a_resident_worker_holds_no_cpu_slot_so_more_workers_than_cpus_start(ray_cluster, tiny_ckpt):
    """Ray, given a custom resource, holds one CPU per actor for its life: B's N+1th worker on an N-CPU node then
    pended silently until the start's 900 s bound (CI: the nodes and pool tests). A resident worker takes its role
    unit and no CPU; memory, which the plans count, is what limits how many B holds."""
    import dataclasses
    import os

    import ray

    from comfy_h3_nodes.engine.contract.configs import BConfig
    from remote_worker.actor import start_dit

    cfg = dataclasses.asdict(BConfig(str(tiny_ckpt), dtype="float32", threads=1, name=f"h3_dit_slot_{os.getpid()}",
                                     max_restarts=0))
    worker = start_dit(cfg, detached=False, get_if_exists=False)
    try:
        assert ray.get(worker.ping.remote(), timeout=120) == "127.0.0.3"
        total = ray.cluster_resources()["CPU"]
        assert ray.available_resources().get("CPU", 0.0) == total, (ray.available_resources(), total)
    finally:
        ray.kill(worker, no_restart=True)
