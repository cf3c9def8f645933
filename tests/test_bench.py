"""Smoke tests of ``python -m comfy_h3_nodes bench``: each bench runs with tiny counts and prints well-formed output.

Timing goals are reported by the benches, never asserted here (2 shared CPU cores). What is asserted are facts that
do not depend on speed: payload sizes, zero-copy arrival, a warm request loading nothing, the JSON shape. The
NaN/inf check that the hand-off work introduced is tested at the end.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from comfy_h3_nodes.tools import bench
from comfy_h3_nodes.tools.bench import handoff, parallel, remote_model
from comfy_h3_nodes.engine.contract import wire

SHAPE_BYTES = {
    "t2va 832x480x124 A->B": 256 * 5120 * 2 + 256 * 8,
    "832x480x124 B->A": 24 * 37 * 30 * 52 * 4 + 2 * 32 * 207 * 4,
    "1344x768x124 B->A": 24 * 37 * 48 * 84 * 4 + 2 * 32 * 207 * 4,
    "1344x768x345 B->A": 24 * 102 * 48 * 84 * 4 + 2 * 32 * 575 * 4,
    "ref2va 1344x768x124 +1 image A->B": 7552 * 5120 * 2 + 7552 * 8 + 24 * 128 * 224 * 4,
}


def _run(argv, capsys) -> tuple[dict, str]:
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def test_payloads_are_real_shapes_and_valid():
    for spec in handoff.handoff_shapes():
        payload = handoff.build_payload(spec)
        assert payload.nbytes == SHAPE_BYTES[spec["name"]], spec["name"]
        if spec["kind"] == "encoded":
            assert payload.prompt_embeds.dtype == "bfloat16"
        else:
            assert payload.latents.dtype == "float32"


def test_handoff_smoke(ray_cluster, capsys):
    out, table = _run(["handoff", "--quick", "--repeats", "2", "--json"], capsys)
    assert out["bench"] == "handoff" and out["quick"] is True and out["repeats"] == 2
    assert set(out["shapes"]) == set(SHAPE_BYTES)
    for name, row in out["shapes"].items():
        assert row["bytes"] == SHAPE_BYTES[name]
        for key in ("receive_ms", "raw_ms", "memcpy_ms", "serialize_ms", "fetch_ms", "materialize_ms",
                    "validate_ms", "local_get_ms", "ratio_vs_raw", "ratio_paired"):
            assert isinstance(row[key], float) and row[key] > 0, (name, key)
        assert row["ratio_vs_raw"] == pytest.approx(row["receive_ms"] / row["raw_ms"], rel=1e-2)
        assert row["direction"] in ("A->B", "B->A") and row["repeats"] == 2
        # every wire tensor arrived as a read-only view of the object store, and its torch tensor is that memory
        assert row["zero_copy"] is True and row["raw_zero_copy"] is True
        assert name in table
    assert "receive" in table and "raw" in table


def test_pipeline_smoke(ray_cluster, tiny_ckpt, capsys):
    out, table = _run(["pipeline", "--quick", "--requests", "2", "--ckpt", str(tiny_ckpt), "--json"], capsys)
    assert out["bench"] == "pipeline" and out["requests"] == 2
    assert out["synthetic_s"] == {k: v / 4 for k, v in bench.DEFAULT_SYNTHETIC.items()}
    assert set(out["runs"]) == {"2"}
    run = out["runs"]["2"]
    for key in ("makespan_s", "ratio_vs_ideal", "speedup_vs_sequential"):
        assert run[key] > 0
    assert run["max_seen_in_flight"] == 2
    assert out["ideal_s"] > 0 and out["sequential_makespan_s"] > 0
    # the synthetic times reached the actors: each stage took at least its sleep
    med = out["sequential_stage_medians_s"]
    for stage, sleep in out["synthetic_s"].items():
        assert med[stage] >= sleep
    assert "ideal" in table and "sequential" in table


def test_step_overhead_smoke(tiny_ckpt, capsys):
    out, table = _run(["step-overhead", "--quick", "--iterations", "500", "--ckpt", str(tiny_ckpt), "--json"],
                      capsys)
    assert out["bench"] == "step-overhead" and out["iterations"] == 500
    assert out["hooked_step_us"] > 0 and out["empty_step_us"] > 0 and out["progress_poll_us"] > 0
    assert set(out["tiny_model"]) >= {"with_hooks_ms_per_step", "without_hooks_ms_per_step", "steps"}
    assert "hook" in table


def test_preview_smoke(capsys):
    out, table = _run(["preview", "--quick", "--json"], capsys)
    shapes = out["shapes"]
    assert set(shapes) == {"1344x768x124/noise", "1344x768x124/smooth", "1344x768x345/noise", "1344x768x345/smooth"}
    assert all(r["image"] == [84, 48] and 0 < r["jpeg_bytes"] < 16384 and r["cost_ms"] > 0 for r in shapes.values())
    assert shapes["1344x768x345/noise"]["latent_grid"] == [102, 48, 84] and isinstance(out["met"], bool)
    assert "% of a 31.4 s step" in table


def test_parallel_smoke(ray_cluster, capsys):
    """``bench parallel``: one JSON line with one rank's and a group of two's denoise (A's rank + a B worker), the
    group's communication share, the speedup of the two and the shape it ran at (Ulysses over the packed rows)."""
    out, table = _run(["parallel", "--quick", "--json"], capsys)
    one, two = out["ranks"]["1"], out["ranks"]["2"]
    assert one["denoise_s"] > 0 and two["denoise_s"] > 0 and 0 <= two["comm_share"] < 1
    assert out["speedup"] == pytest.approx(one["denoise_s"] / two["denoise_s"], rel=1e-2)
    assert out["shape"]["height"] == out["shape"]["width"] == 128 and out["shape"]["forwards"] == 2
    assert out["shape"]["method"] == "ulysses" and out["shape"]["rows"] > 0 and out["shape"]["threads_per_rank"] == 1
    assert "2 ranks (A + B)" in table and "goal >= 1.7" in table


def test_remote_model_smoke(ray_cluster, capsys):
    """``bench remote-model``: one sampler forward through B's real DiT actor (stand-in forward that echoes the rows)
    and back; the last line is exactly ``{"shapes": {...}, "worst_share_of_step"}``, the share is the round trip over
    vLLM-Omni's 31.4 s step, the bytes are the wire's at that canvas and B really ran every forward."""
    out, table = _run(["remote-model", "--quick", "--forwards", "2", "--warmup", "1", "--json"], capsys)
    assert set(out) == {"shapes", "worst_share_of_step"} and set(out["shapes"]) == {"256x128x22"}
    row = out["shapes"]["256x128x22"]
    n = remote_model.rows(256, 128, 22)
    assert row["rows"] == n == {"text": 512, "video": 7 * 4 * 8, "audio": 2 * 37, "seq": 512 + 224 + 74}
    rows_bytes = 2 * n["video"] * 96 * 2 + 2 * n["audio"] * 32 * 2  # bf16 rows, CFG batch 2
    assert row["bytes_b_to_a"] == rows_bytes and row["bytes_a_to_b"] == rows_bytes + 2 * 4 + n["seq"]
    assert row["context_bytes"] > 2 * 512 * 5120 * 2 and row["context_s"] > 0 and row["context_fetch_s"] > 0
    assert row["round_trip_s"] > 0 and row["a_to_b_s"] > 0 and row["b_to_a_s"] > 0 and row["compute_s"] >= 0
    assert row["share_of_step"] == pytest.approx(row["round_trip_s"] / 31.4, rel=1e-3)
    assert remote_model.VLLM_OMNI_STEP_S == 31.4
    assert out["worst_share_of_step"] == row["share_of_step"] and isinstance(row["met"], bool)
    assert row["a_records"] == row["b_forwards"] == 3  # 1 warm-up + 2 timed, each run by B's stand-in
    assert "256x128x22" in table and "goal <= 0.3 %" in table


def test_remote_model_rows_are_the_real_shapes():
    """At 1344x768 the per-forward rows are the B->A latents of ``bench handoff`` (patchified, CFG batch 2)."""
    for name, frames in (("1344x768x124 B->A", 124), ("1344x768x345 B->A", 345)):
        n = remote_model.rows(*remote_model.parse_canvas(f"1344x768x{frames}"))
        assert n["video"] * 96 * 4 + n["audio"] * 32 * 4 == SHAPE_BYTES[name]
        assert n["seq"] == 512 + n["video"] + n["audio"]
    assert remote_model.rows(1344, 768, 345)["video"] == 102 * 24 * 42


@pytest.mark.parametrize("text", ["1344x768", "1344x770x124", "1344x768x100", "wide"])
def test_remote_model_shapes_refuse_what_they_cannot_run(text):
    with pytest.raises(SystemExit, match="WIDTHxHEIGHTxFRAMES|multiples of 32"):
        remote_model.parse_canvas(text)


@pytest.mark.parametrize("text, want", [("384x640", (384, 640)), ("320X480", (320, 480)), (None, None)])
def test_parallel_canvas_option(text, want):
    assert parallel.parse_canvas(text) == want


@pytest.mark.parametrize("text", ["384", "384x650", "0x640", "tall"])
def test_parallel_canvas_option_refuses_what_it_cannot_run(text):
    with pytest.raises(SystemExit, match="HEIGHTxWIDTH|multiples of 16"):
        parallel.parse_canvas(text)


def test_warm_smoke(ray_cluster, tiny_ckpt, capsys):
    out, table = _run(["warm", "--quick", "--ckpt", str(tiny_ckpt), "--json"], capsys)
    assert out["bench"] == "warm"
    assert set(out["startup_loads"]["A"]) == {"text_encoder", "tokenizer", "processor", "vae", "audio_vae"}
    assert "transformer" in out["startup_loads"]["B"]
    assert out["second"]["loads"] == 0 and out["second"]["load_s"] == 0.0
    assert out["first"]["wall_s"] > 0 and out["second"]["wall_s"] > 0
    assert "second" in table


def test_vsa_smoke(capsys):
    """``bench vsa``: one JSON line with VSA-H3 and dense attention times, the sparsity it ran at, and the sparse output
    checked against dense attention restricted to the kept tiles (a fact, unlike the times)."""
    out, table = _run(["vsa", "--quick", "--json"], capsys)
    assert out["bench"] == "vsa" and out["quick"] is True and out["sparsity"] == 0.9 and out["tile_size"] == 64
    assert out["tiles"] == {"prefix": 10, "video": 48, "kept_video_per_query_tile": 5}
    assert out["dense_s"] > 0 and out["vsa_s"] > 0 and out["speedup"] == pytest.approx(out["dense_s"] / out["vsa_s"],
                                                                                      rel=1e-2)
    assert out["max_abs_diff"] < 1e-5 and out["kernel"].startswith("torch") and "sparsity 0.9" in table
    dense, _ = _run(["vsa", "--quick", "--json", "--sparsity", "0", "--repeats", "1"], capsys)
    assert dense["tiles"]["kept_video_per_query_tile"] == 48


def test_cli_dispatch():
    """``python -m comfy_h3_nodes bench`` reaches bench.main (the verb needs no cluster)."""
    proc = subprocess.run([sys.executable, "-m", "comfy_h3_nodes", "bench", "step-overhead", "--quick",
                           "--iterations", "200", "--no-model", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "step-overhead" and "tiny_model" not in out


# ---------------------------------------------------------------------------------------- hand-off fixes
def test_finite_check_matches_torch_for_every_bf16_word():
    words = np.arange(1 << 16, dtype=np.uint16)
    expected = torch.isfinite(torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)).numpy()
    got = np.array([wire._all_finite("bfloat16", words[i:i + 1]) for i in range(words.size)])
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("where", [0, wire._FINITE_CHUNK - 1, wire._FINITE_CHUNK, 3 * wire._FINITE_CHUNK + 6])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_finite_check_finds_one_bad_value_anywhere(dtype, where, value):
    t = torch.randn(3 * wire._FINITE_CHUNK + 7).to(getattr(torch, dtype))
    wt = wire.WireTensor.from_torch(t)
    assert wire._all_finite(dtype, wt.data)
    t[where] = value
    assert not wire._all_finite(dtype, wire.WireTensor.from_torch(t).data)


def _t2va(**kw):
    spec = {"name": "t", "kind": "encoded", "workflow": "t2va", "height": 64, "width": 64, "frames": 124,
            "tokens": 8}
    return handoff.build_payload(spec)  # validated once already (text_dim 5120)


def test_a_copied_payload_is_validated_like_the_original():
    payload = _t2va()
    payload.validate(text_dim=5120)
    with pytest.raises(wire.WireError, match="expected \\(1, \\*, 32\\)"):
        payload.validate(text_dim=32)
    bad = pickle.loads(pickle.dumps(payload))  # what crossed the wire
    data = bad.prompt_embeds.data
    data[0, 0, 0] = 0x7FC0  # a bf16 NaN word
    with pytest.raises(wire.WireError, match="NaN or inf"):
        bad.validate(text_dim=5120)


def test_soak_growth_is_the_slope_after_warmup_and_the_schedule_mixes_the_day():
    """bench soak: growth per 100 prompts is the least-squares slope of the samples after the warm-up (a metric that
    only jumps during the warm-up does not grow); the schedule has every kind of prompt the issue names."""
    from comfy_h3_nodes.tools.bench import soak

    mib = 2 ** 20
    samples = [(n, {"comfyui_rss": (500 if n < 20 else 900) * mib + n * mib // 10, "comfyui_threads": 40})
               for n in range(0, 101, 10)]
    g = soak.growth(samples, warmup=20)
    assert g["comfyui_rss_mib"] == {"after_warmup": pytest.approx(902.0), "per_100_prompts": pytest.approx(10.0)}
    assert g["comfyui_threads"] == {"after_warmup": 40, "per_100_prompts": 0.0}
    last = soak.pack_prompt(1, 1.0, False)
    kinds = [soak.schedule(i, last)[0] for i in range(1, 31)]
    assert kinds[6] == "requeue" and kinds[9].endswith("interrupted") and kinds[14].endswith("bad"), kinds
    assert {"pack", "core"} <= set(kinds)
    core = soak.core_prompt(2, 0.8, True)
    assert core["4"]["inputs"]["parallel"] == "A+B" and core["30"]["inputs"]["strength_model"] == 0.8
    assert "30" not in soak.core_prompt(2, 0.0, False)
    assert json.loads(soak.main_json({"prompts": 1, "failed_unexpectedly": 0, "growth": g, "samples": [],
                                      "worst_growth_per_100_mib": 10.0, "leaked_processes_after_stop": 0})).keys() == {
        "prompts", "failed_unexpectedly", "growth", "worst_growth_per_100_mib", "leaked_processes_after_stop"}


def test_loader_cache_key_is_the_identity_of_the_model_it_names(tmp_path):
    """H3RemoteDiT / H3RemoteModel's IS_CHANGED (catalog.identity): the same for the same file, new when the file
    under the name changes; a name this machine does not hold is the name alone; never B's health."""
    import os

    from comfy_h3_nodes.engine.model import catalog

    f = tmp_path / "dit.safetensors"
    f.write_bytes(b"x" * 10)
    one = catalog.identity("dit.safetensors", [tmp_path])
    assert one == catalog.identity(str(f)) and str(f) in one
    f.write_bytes(b"y" * 11)
    assert catalog.identity("dit.safetensors", [tmp_path]) != one
    d = tmp_path / "model" / "transformer"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    folder = catalog.identity(str(tmp_path / "model"))
    os.utime(d / "config.json", ns=(1, 1))
    assert catalog.identity(str(tmp_path / "model")) != folder
    assert catalog.identity("on_b_only/minimax.safetensors", [tmp_path]) == "on_b_only/minimax.safetensors"
    assert catalog.identity("tiny-random") == catalog.identity(" tiny-random ")
