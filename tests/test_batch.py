"""Many prompts in one graph run: H3PromptList, list-aware H3 nodes passing handles to work in flight, the overlap
of A's and B's work, one progress bar, interrupt of the whole batch, a failed request named with the finished videos
saved, and the batch example through the headless runner."""

from __future__ import annotations

import asyncio
import json
import pathlib

import numpy as np
import pytest

import comfy_h3_nodes.nodes as N
from comfy_h3_nodes.tools import runner
from comfy_h3_nodes.engine import session
from comfy_h3_nodes.engine.contract.request import RequestError

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROMPTS = ["a red fox in the snow", "a lighthouse at dusk", "a saxophone in the rain"]
SEEDS = [11, 12, 13]
DENOISE_S = 0.4  # B's stand-in extra time per request: A's encode and decode must hide behind it


def test_prompt_list_lines_and_seed_modes():
    text = "  first prompt \n\n second prompt\nthird prompt\n"
    lines, seeds = N.H3PromptList().make(text, 7, "increment")["result"]
    assert lines == ["first prompt", "second prompt", "third prompt"] and seeds == [7, 8, 9]
    assert N.H3PromptList().make(text, 7, "fixed")["result"][1] == [7, 7, 7]
    rand = N.H3PromptList().make(text, 7, "random")["result"][1]
    assert rand == N.H3PromptList().make(text, 7, "random")["result"][1] and len(set(rand)) == 3  # reproducible per seed
    assert rand != N.H3PromptList().make(text, 8, "random")["result"][1]
    assert N.H3PromptList.OUTPUT_IS_LIST == (True, True)
    assert "prompts is empty" in N.H3PromptList.VALIDATE_INPUTS(prompts=" \n \n")
    assert "prompt line 2" in N.H3PromptList.VALIDATE_INPUTS(prompts="ok\n" + "x" * 20_001)


@pytest.fixture(scope="module")
def batch_b(local_host, tiny_ckpt):
    """A in this process (as in ComfyUI) and a B whose denoise takes DENOISE_S longer than its real work."""
    from comfy_h3_nodes.engine.contract.configs import BConfig, Timeouts
    from comfy_h3_nodes.engine.executor import H3Executor
    from comfy_h3_nodes.tools.bench import substitutes

    enc, _ = session.encoders(str(tiny_ckpt), "float32", "sdpa")
    stages = {"denoise": DENOISE_S}
    ex = H3Executor(None, BConfig(str(tiny_ckpt), dtype="float32", threads=1, name="h3_dit_batch"),
                    timeouts=Timeouts(start=120, health=10, encode=60, handoff=60, stall=60, decode=60, poll=0.05),
                    actors=substitutes.actors(stages), env=substitutes.env(stages))
    ex.start()
    yield enc, ex
    ex.shutdown(kill_b=True)


def _run_batch(enc, ex, prompts, seeds, steps=3, max_in_flight=2):
    conds = N.H3TextEncode().encode([enc], prompts, [64], [64], [124], unique_id=["3"])["result"][0]
    handles = asyncio.run(N.H3RemoteDenoise().denoise([ex], conds, seeds, [steps], [max_in_flight],
                                                      unique_id=["5"]))["result"][0]
    return conds, handles, N.H3Decode().decode([enc], handles, ["A"], unique_id=["6"])


def test_batch_is_bit_identical_to_single_runs_and_overlaps_a_and_b(batch_b, executor, local_host):
    from comfy_h3_nodes.engine.contract.request import H3Request

    enc, ex = batch_b
    start = len(local_host.events)
    conds, handles, out = _run_batch(enc, ex, PROMPTS, SEEDS)
    images, audios, fps = out["result"]
    assert len(images) == len(audios) == len(fps) == 3
    for i, (prompt, seed) in enumerate(zip(PROMPTS, SEEDS)):  # prompt order, each as if it had run alone
        ref = executor.generate(H3Request(prompt=prompt, height=64, width=64, num_frames=124, steps=3, seed=seed))
        assert np.array_equal(images[i].numpy(), ref.media.frames), i
        assert np.array_equal(audios[i]["waveform"][0].numpy(), ref.media.audio), i
    timings = [d for e, d in local_host.events[start:] if e == "h3.timing"]
    recs = {}
    for t in timings:
        for r in t["stages"]:
            recs[(r["request_id"], r["stage"])] = r
    rids = [h.request_id for h in handles]
    assert rids == [c.request_id for c in conds]
    off = recs[(rids[0], "denoise")]["clock_offset_s"]
    span = {k: (r["start"] - r.get("clock_offset_s", 0.0), r["end"] - r.get("clock_offset_s", 0.0))
            for k, r in recs.items()}
    # A encoded request 2 while B denoised request 1, and decoded request 1 while B denoised request 2
    assert span[(rids[1], "encode")][1] < span[(rids[0], "denoise")][1], off
    assert span[(rids[0], "decode")][0] < span[(rids[1], "denoise")][1]
    # at most max_in_flight requests between A's put and A's receipt at any time
    windows = [(span[(r, "a_to_b")][0], span[(r, "b_to_a")][1]) for r in rids]
    for t, _ in windows:
        assert sum(1 for s, e in windows if s <= t < e) <= 2
    # the readouts: one h3.timing per request and node, each naming its place in the batch
    per_node = {}
    for t in timings:
        per_node.setdefault(t["node_type"], []).append(t)
    assert [t["summary"]["batch"] for t in per_node["H3TextEncode"]] == [[1, 3], [2, 3], [3, 3]]
    assert sorted(t["summary"]["batch"][0] for t in per_node["H3RemoteDenoise"]) == [1, 2, 3]
    assert [t["request_id"] for t in per_node["H3Decode"]] == rids
    # H3Decode's ui (what /history keeps) holds the batch's encode and denoise records too, each naming its node
    kept = out["ui"]["h3_timing"]
    assert [t for t in kept if t["node_type"] == "H3Decode"] == per_node["H3Decode"]
    for kind in ("H3TextEncode", "H3RemoteDenoise"):
        assert sorted(t["request_id"] for t in kept if t["node_type"] == kind) == sorted(rids), kind


def test_a_batch_says_on_the_denoise_node_why_it_has_no_previews(batch_b, local_host):
    """ComfyUI's previews on and a batch: B makes none for its requests, and H3RemoteDenoise says why (its text while
    the requests run, and each request's readout); with previews off, the readout says that instead."""
    enc, ex = batch_b
    local_host.preview, local_host.factors = "latent2rgb", ([[0.1, 0.2, 0.3]] * 24, [0.0, 0.0, 0.0], "test")
    try:
        start = len(local_host.events)
        _run_batch(enc, ex, PROMPTS[:2], SEEDS[:2], steps=2)
        events = local_host.events[start:]
    finally:
        local_host.preview, local_host.factors = "none", None
    why = "no previews for a batch of 2: its requests run on B after this node returned, up to 2 at a time"
    dens = [d for e, d in events if e == "h3.timing" and d["node_type"] == "H3RemoteDenoise"]
    assert len(dens) == 2 and all(d["summary"]["preview"]["note"].startswith(why) for d in dens), dens
    assert not [d for e, d in events if e == "h3.preview"]
    assert any(why in str(d) for e, d in events if e != "h3.timing"), [e for e, _ in events]  # the node's text
    start = len(local_host.events)
    _run_batch(enc, ex, PROMPTS[:2], SEEDS[:2], steps=2)
    dens = [d for e, d in local_host.events[start:] if e == "h3.timing" and d["node_type"] == "H3RemoteDenoise"]
    assert [d["summary"]["preview"]["note"] for d in dens] == ["previews off (ComfyUI's preview method is none)"] * 2


def test_a_bad_prompt_is_refused_before_anything_runs(batch_b, local_host):
    enc, _ = batch_b
    start = len(local_host.events)
    with pytest.raises(RequestError, match=r"request 2 of 3 \(''\): prompt is empty"):
        N.H3TextEncode().encode([enc], ["fine", "", "also fine"], [64], [64], [124], unique_id=["3"])
    assert not [e for e, _ in local_host.events[start:] if e == "h3.timing"]  # nothing was encoded
    with pytest.raises(RequestError, match="1 or the same number N"):
        N.H3TextEncode().encode([enc], PROMPTS, [64, 64], [64], [124])


def test_interrupt_cancels_every_request_in_flight(batch_b, local_host):
    import ray

    from comfy_h3_nodes.engine.contract.errors import H3Cancelled

    enc, ex = batch_b
    seen = []

    def listener(event, data):
        if event == "h3.progress" and data.get("batch") == [2, 3] and data["step"] == 1:
            seen.append(data["request_id"])
            local_host.interrupt_flag.set()

    local_host.listeners.append(listener)
    try:
        with pytest.raises(H3Cancelled, match="interrupted"):
            _run_batch(enc, ex, PROMPTS, SEEDS, steps=200)  # request 2 is surely still on B when stopped
    finally:
        local_host.listeners.remove(listener)
        local_host.interrupt_flag.clear()
    assert seen
    prog = ray.get(ex.b.progress.remote(seen[0]), timeout=10)
    assert prog["state"] == "cancelled" and len(prog["steps"]) - prog["cancel_at_step"] <= 1
    # B is free and the next batch runs
    _, _, out = _run_batch(enc, ex, PROMPTS[:2], SEEDS[:2])
    assert len(out["result"][0]) == 2


def test_a_failed_request_is_named_and_finished_videos_are_saved(batch_b, local_host, tmp_path):
    from comfy_h3_nodes.engine.contract.errors import H3Error

    enc, ex = batch_b
    local_host.set_output_dir(tmp_path)
    victim = []

    def listener(event, data):  # request 2 fails on B (cancelled alone), the others go on
        if event == "h3.progress" and data.get("batch") == [2, 3] and not victim:
            victim.append(data["request_id"])
            ex.cancel(data["request_id"])

    local_host.listeners.append(listener)
    try:
        with pytest.raises(H3Error) as err:
            _run_batch(enc, ex, PROMPTS, SEEDS, steps=200)  # request 2 is surely still on B when cancelled
    finally:
        local_host.listeners.remove(listener)
    msg = str(err.value)
    assert f"1 of 3 requests failed: request 2 of 3 ({victim[0]})" in msg and "2 finished videos were saved" in msg
    saved = sorted((tmp_path / "h3").glob("batch_partial_*.mp4"))
    assert len(saved) == 2 and all(str(p) in msg for p in saved)


def test_batch_example_through_the_runner(local_host, tiny_ckpt, tmp_path):
    """h3_t2va_batch.json: H3PromptList's 4 prompts and seeds, one MP4 per prompt in prompt order."""
    wf = json.loads((ROOT / "example_workflows" / "h3_t2va_batch.json").read_text())
    prompts = next(n for n in wf["nodes"] if n["type"] == "H3PromptList")["widgets_values"][0].splitlines()
    res = runner.execute(str(ROOT / "example_workflows" / "h3_t2va_batch.json"), model_path=str(tiny_ckpt),
                         output=str(tmp_path),
                         sets=["3.width=64", "3.height=64", "5.steps=3", '1.dtype="float32"', '2.dtype="float32"',
                               '2.actor_name="new:h3_dit_test"'], quiet=True)
    videos = res.videos()
    assert len(videos) == 4 and [p.name for p in videos] == [f"video_{i:05d}_.mp4" for i in range(1, 5)]
    import av

    for path, prompt in zip(videos, prompts):
        with av.open(str(path)) as c:
            assert sum(1 for _ in c.decode(video=0)) == 124
            assert prompt in c.metadata["prompt"]  # the workflow's prompt list is in every file's metadata
    encodes = [d for e, d in res.events if e == "h3.timing" and d["node_type"] == "H3TextEncode"]
    assert [d["summary"]["batch"] for d in encodes] == [[i, 4] for i in range(1, 5)]
    seeds = [d["stages"][0] for e, d in res.events if e == "h3.timing" and d["node_type"] == "H3RemoteDenoise"]
    assert len(seeds) == 4


def test_bench_batch_quick_json(local_host, capsys):
    """``bench batch --quick --json``: the last line carries exactly the issue's keys, for three complete requests,
    its ratios consistent with its times. Whether the batch beats one graph run per prompt is the benchmark's figure
    (``python -m comfy_h3_nodes bench batch``, measured alone): it is not asserted here, where CI runs another lane
    on the same two cores (one fresh-clone CI saw the A side starved enough to lose the overlap)."""
    from comfy_h3_nodes.tools import bench

    assert bench.main(["batch", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(out) == ["requests", "makespan_s", "ideal_s", "sequential_s", "ratio_vs_ideal",
                         "speedup_vs_sequential"]
    assert out["requests"] == 3 and 0 < out["ideal_s"] and 0 < out["makespan_s"] and 0 < out["sequential_s"]
    assert out["speedup_vs_sequential"] == pytest.approx(out["sequential_s"] / out["makespan_s"], abs=2e-3)
    assert out["ratio_vs_ideal"] == pytest.approx(out["makespan_s"] / out["ideal_s"], abs=2e-3)
