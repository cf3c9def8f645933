"""The two-node executor on a real two-node Ray cluster: exactness, residency, placement, pipelining, cancel."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.cluster.ray_cluster import ROLE_A, ROLE_B, ClusterError, NodeInfo, validate_topology
from comfy_h3_nodes.engine.contract.errors import H3Cancelled
from comfy_h3_nodes.engine.contract.request import H3Request
from conftest import wait_store_empty, PROMPT, single_process_reference, workflow_request


def _driver_refs() -> int:
    import ray

    return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())




@pytest.mark.parametrize("workflow", ["t2va", "fl2va", "ref2va"])
def test_two_node_bit_exact(executor, tiny_ckpt, media, workflow):
    req, _ = workflow_request(workflow, media)
    steps = []
    result = executor.generate(req, on_step=steps.append)
    expected = single_process_reference(tiny_ckpt, workflow, media)
    assert np.array_equal(result.media.frames, expected["videos"][0])
    assert np.array_equal(result.media.audio, expected["audio"][0].numpy())
    assert [s.index for s in steps] == [0, 1]
    stages = [(r.stage, r.machine) for r in result.records]
    assert stages == [("encode", "A"), ("a_to_b", "B"), ("denoise", "B"), ("b_to_a", "A"), ("decode", "A")]
    nodes = {r.machine: r.node for r in result.records}
    assert nodes == {"A": executor.topology.a.ip, "B": executor.topology.b.ip} and nodes["A"] != nodes["B"]


def test_timing_records_are_complete(executor, media):
    result = executor.generate(workflow_request("fl2va", media, steps=4)[0])
    recs = {r.stage: r for r in result.records}
    assert set(recs["a_to_b"].bytes) == {"prompt_embeds", "text_token_tags", "condition_latents[0]",
                                         "condition_latents[1]"}
    assert recs["a_to_b"].bytes == recs["encode"].bytes
    assert set(recs["b_to_a"].bytes) == {"latents", "audio_latents"}
    assert recs["b_to_a"].bytes["latents"] == 1 * 24 * 37 * 4 * 4 * 4
    assert len(recs["denoise"].steps) == 3 and all(s > 0 for s in recs["denoise"].steps)
    for r in result.records:
        assert r.request_id == result.request_id and r.end >= r.start
        assert min(r.producer_wait_s, r.fetch_s, r.materialize_s, r.compute_s) >= 0
    assert recs["encode"].compute_s > 0 and recs["decode"].compute_s > 0 and recs["denoise"].compute_s > 0
    assert recs["b_to_a"].fetch_s > 0
    # kept for export, as JSON and CSV
    exported = executor.timings.to_json(result.request_id)
    assert {r["stage"] for r in exported} == {"encode", "a_to_b", "denoise", "b_to_a", "decode"}
    csv_text = executor.timings.to_csv(result.request_id)
    assert csv_text.count(result.request_id) == 5


def test_second_request_loads_nothing(executor, media):
    executor.generate(workflow_request("t2va", media)[0])
    before = executor.load_records()
    executor.generate(workflow_request("t2va", media, seed=99)[0])
    executor.generate(workflow_request("fl2va", media, seed=98)[0])
    after = executor.load_records()
    assert after == before
    assert {r.component for r in before["A"]} == {"text_encoder", "tokenizer", "processor", "vae", "audio_vae"}
    assert {r.component for r in before["B"]} >= {"scheduler", "audio_scheduler"}


def test_health_reports_both_sides(executor):
    health = executor.check_health()
    assert health["A"]["node_ip"] == "127.0.0.2" and health["B"]["node_ip"] == "127.0.0.3"
    assert health["A"]["versions"] == health["B"]["versions"]
    assert health["A"]["versions"]["wire_schema"] == str(wire.SCHEMA_VERSION) == "7"
    assert set(health["A"]["resident"]) == {"text_encoder", "tokenizer", "processor", "vae", "audio_vae"}
    assert health["B"]["partition"] in health["B"]["resident"]
    assert health["A"]["device"] == "cpu" and health["B"]["memory"]["rss_mb"] > 0


def test_topology_validation_is_immediate_and_clear():
    a = NodeInfo("a" * 16, "10.0.0.1", (ROLE_A,), True)
    b = NodeInfo("b" * 16, "10.0.0.2", (ROLE_B,), True)
    both = NodeInfo("c" * 16, "10.0.0.3", (ROLE_A, ROLE_B), True)
    plain = NodeInfo("d" * 16, "10.0.0.4", (), True)
    assert validate_topology([a, b]).b.ip == "10.0.0.2"
    with pytest.raises(ClusterError, match="same node.*10.0.0.3 .*role A,B"):
        validate_topology([both])
    with pytest.raises(ClusterError, match="no alive node offers role B.*remote_worker setup.*10.0.0.1"):
        validate_topology([a])
    with pytest.raises(ClusterError, match="no alive node offers role A.*no alive node offers role B.*no role"):
        validate_topology([plain])
    dead_b = NodeInfo("e" * 16, "10.0.0.5", (ROLE_B,), False)
    with pytest.raises(ClusterError, match="role B.*10.0.0.5 .*dead"):
        validate_topology([a, dead_b])


def test_real_cluster_topology(ray_cluster):
    topo = validate_topology()
    assert (topo.a.ip, topo.b.ip) == ("127.0.0.2", "127.0.0.3")


def test_detached_b_found_by_name_from_second_driver(executor, ray_cluster, tiny_ckpt):
    import ray

    b_pid = ray.get(executor.b.health.remote())["pid"]
    script = textwrap.dedent(f"""
        import json, sys
        import ray
        from comfy_h3_nodes.cluster.ray_cluster import connect, A_IP
        import comfy_h3_nodes.placement
        from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts
        from comfy_h3_nodes.engine.executor import H3Executor
        from comfy_h3_nodes.engine.contract.request import H3Request
        connect("{ray_cluster.address}", node_ip=A_IP)
        ex = H3Executor(SideConfig("{tiny_ckpt}", dtype="float32", threads=1),
                        BConfig("{tiny_ckpt}", dtype="float32", threads=1, name="{executor.b_config.name}"),
                        timeouts=Timeouts(start=120))
        ex.start()
        r = ex.generate(H3Request(prompt="second driver", height=64, width=64, num_frames=124, steps=3, seed=3))
        print(json.dumps({{"pid": ray.get(ex.b.health.remote())["pid"], "frames": list(r.media.frames.shape)}}))
        ex.shutdown()
    """)
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last == {"pid": b_pid, "frames": [124, 64, 64, 3]}
    # and B still serves this driver afterwards
    assert ray.get(executor.b.ping.remote(), timeout=10) == "127.0.0.3"


def test_pipelining_overlaps_and_respects_max_in_flight(executor, media):
    executor.max_seen_in_flight = 0
    reqs = [workflow_request("t2va", media, steps=25, seed=s)[0] for s in range(4)]
    results = executor.run_many(reqs)
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    assert executor.max_seen_in_flight == 2
    spans = {r.request_id: {x.stage: (x.start, x.end) for x in r.records} for r in results}
    ids = [r.request_id for r in reqs]
    # A encoded request k+1 while B was denoising request k
    overlaps = 0
    for k in range(len(ids) - 1):
        d0, d1 = spans[ids[k]]["denoise"]
        e0, e1 = spans[ids[k + 1]]["encode"]
        overlaps += e0 < d1 and e1 > d0
    assert overlaps >= 1
    # never more than max_in_flight requests between their encode start and decode end
    events = sorted([(s["encode"][0], 1) for s in spans.values()] + [(s["decode"][1], -1) for s in spans.values()])
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak <= 2


def test_cancel_mid_denoise_stops_b_within_one_step(executor, media):
    import ray

    gc.collect()
    refs_before = _driver_refs()
    req = workflow_request("t2va", media, steps=200, seed=5)[0]
    seen = []

    def on_step(ev):
        seen.append(ev.index)
        if len(seen) == 3:
            executor.cancel(req.request_id)

    t0 = time.monotonic()
    fut = executor.submit(req, on_step=on_step)
    with pytest.raises(H3Cancelled):
        fut.result(timeout=60)
    assert time.monotonic() - t0 < 30
    progress = ray.get(executor.b.progress.remote(req.request_id), timeout=10)
    assert progress["state"] == "cancelled"
    # A's long poll: a request that has ended answers at once, whatever step A waits for; one B does not know answers
    # "queued" when its wait is over, never later
    t1 = time.monotonic()
    assert ray.get(executor.b.progress.remote(req.request_id, 10**6, 20.0), timeout=10)["state"] == "cancelled"
    assert time.monotonic() - t1 < 5
    t1 = time.monotonic()
    assert ray.get(executor.b.progress.remote("no-such-request", 0, 0.5), timeout=10)["state"] == "queued"
    assert 0.4 <= time.monotonic() - t1 < 5
    # B finishes at most the step it was in when the cancel arrived, then stops
    assert progress["cancel_at_step"] is not None and progress["cancel_at_step"] >= 3
    assert len(progress["steps"]) - progress["cancel_at_step"] <= 1
    assert len(progress["steps"]) < 199
    del fut
    gc.collect()
    assert _driver_refs() <= refs_before
    assert wait_store_empty() == 0
    # B serves the next request
    ok = executor.generate(workflow_request("t2va", media, seed=6)[0])
    assert ok.media.frames.shape == (124, 64, 64, 3)


def test_cancel_before_b_starts(executor, media):
    req = workflow_request("t2va", media, seed=11)[0]
    executor.cancel(req.request_id)
    with pytest.raises(H3Cancelled, match=req.request_id):
        executor.generate(req)
    assert executor.generate(workflow_request("t2va", media, seed=12)[0]).media.frames.shape[0] == 124


def test_bad_request_fails_fast_and_actors_survive(executor, media):
    from comfy_h3_nodes.engine.contract.request import RequestError

    with pytest.raises(RequestError, match="height 500 is not a multiple of 32"):
        executor.generate(H3Request(prompt=PROMPT, height=500, width=64))
    assert executor.check_health()["B"]["ok"]


@pytest.fixture(scope="module")
def local_executor(executor, tiny_ckpt):
    """A in this process (as inside ComfyUI), the same resident B actor as the session executor."""
    from comfy_h3_nodes.engine.a_side.side import ASide
    from comfy_h3_nodes.engine.executor import H3Executor

    ex = H3Executor(ASide(str(tiny_ckpt), dtype="float32"), executor.b_config, timeouts=executor.timeouts)
    ex.start()
    yield ex
    ex.shutdown(kill_b=False)


@pytest.mark.parametrize("workflow", ["t2va", "ref2va"])
def test_local_a_bit_exact(local_executor, executor, tiny_ckpt, media, workflow):
    import ray

    b_pid = ray.get(executor.b.health.remote())["pid"]
    result = local_executor.generate(workflow_request(workflow, media)[0])
    expected = single_process_reference(tiny_ckpt, workflow, media)
    assert np.array_equal(result.media.frames, expected["videos"][0])
    assert np.array_equal(result.media.audio, expected["audio"][0].numpy())
    assert ray.get(local_executor.b.health.remote())["pid"] == b_pid  # one resident B serves both drivers
    recs = {r.stage: r for r in result.records}
    assert recs["encode"].serialize_s > 0 and recs["b_to_a"].machine == "A"
    assert local_executor.check_health()["A"]["node_ip"] == "127.0.0.2"


def test_profiling_env_reaches_both_actors(ray_cluster, tiny_ckpt, tmp_path, media):
    """H3_PROFILE is forwarded to the actors before their imports and yields Chrome traces of every stage."""
    import json

    from comfy_h3_nodes.engine.executor import H3Executor
    from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts

    ex = H3Executor(SideConfig(str(tiny_ckpt), dtype="float32", threads=1),
                    BConfig(str(tiny_ckpt), dtype="float32", threads=1, name="h3_dit_profiled"),
                    env={"H3_PROFILE": "1", "H3_PROFILE_DIR": str(tmp_path)}, timeouts=Timeouts(start=120))
    try:
        ex.start()
        res = ex.generate(workflow_request("t2va", media)[0])
    finally:
        ex.shutdown(kill_b=True)
    note = next(r.note for r in res.records if r.stage == "denoise")
    trace = tmp_path / f"denoise_{res.request_id}.json"
    assert f"profile {trace}" in note
    assert json.loads(trace.read_text())["traceEvents"]
    assert (tmp_path / f"encode_{res.request_id}.json").is_file()
    assert (tmp_path / f"decode_{res.request_id}.json").is_file()


def test_b_records_carry_the_measured_clock_offset(executor, media):
    clock = executor.check_health()["clock"]
    assert clock["rtt_s"] > 0 and abs(clock["b_minus_a_s"]) < clock["rtt_s"] + 0.05  # one machine, one clock
    res = executor.generate(workflow_request("t2va", media)[0])
    for r in res.records:
        assert r.clock_offset_s == (executor.clock_offset_s if r.machine == "B" else 0.0)
