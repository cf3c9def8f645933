"""Releasing and reloading the resident models (issue 29), without ComfyUI: A's side drops its text encoder and VAEs
and the next encode or decode loads them again with the same result; B's side drops its transformer and decoder, keeps
everything else, and its next denoise reloads and gives the same latents; B's actor does the same through Ray and its
pool's ``release``; A's memory plan counts what other holders have and refuses with numbers and options. Tiny real
models, a real cluster; nothing is mocked."""

from __future__ import annotations

import numpy as np
import pytest
import ray

from conftest import call_of, workflow_request
from comfy_h3_nodes.engine.contract.configs import MODEL_COMPONENTS_A
from comfy_h3_nodes.engine.model import memory_plan as mp

GIB = 2**30


@pytest.fixture(scope="module")
def a_side(tiny_ckpt):
    from comfy_h3_nodes.engine.a_side.side import ASide

    return ASide(tiny_ckpt, dtype="float32")


def test_a_side_release_drops_what_it_counted_and_the_next_use_reloads_the_same(a_side, media):
    req = workflow_request("fl2va", media)[0]
    before = a_side.encode(req)
    held = a_side.resident_bytes()
    assert set(held) == set(MODEL_COMPONENTS_A) and all(v > 0 for v in held.values())
    loads = len(a_side.load_records)

    freed = a_side.release(cause="a test's release")
    assert freed == held  # what it held, per component, by its own count
    assert a_side.resident_bytes() == {}
    assert a_side.resident()["text_encoder"] == "released (a test's release)"
    assert a_side.resident()["tokenizer"] != "NoneType"  # no weights: kept

    again = a_side.encode(req)  # reloads the text encoder and both VAEs first
    assert a_side.resident_bytes() == held
    new = a_side.load_records[loads:]
    assert sorted(r.component for r in new) == sorted(MODEL_COMPONENTS_A)
    assert {r.reason for r in new} == {"reloaded after a test's release"}
    assert sorted(r.component for r in a_side.last_reload) == sorted(MODEL_COMPONENTS_A)
    np.testing.assert_array_equal(again.prompt_embeds.to_torch().float().numpy(), before.prompt_embeds.to_torch().float().numpy())
    assert len(again.condition_latents) == len(before.condition_latents)
    for x, y in zip(again.condition_latents, before.condition_latents):
        np.testing.assert_array_equal(x.to_torch().float().numpy(), y.to_torch().float().numpy())
    assert a_side.ensure(MODEL_COMPONENTS_A) == []  # resident: nothing loads


def test_a_side_decode_reloads_only_the_vaes_and_decodes_the_same(a_side, media, tiny_ckpt):
    from remote_worker.b_side import BSide

    req = workflow_request("t2va", media)[0]
    payload = a_side.encode(req)
    latents = BSide(tiny_ckpt, dtype="float32").denoise(payload, call_of(req, payload)).latents
    first = a_side.decode(latents)
    a_side.release(("vae", "audio_vae"), cause="ComfyUI freed memory")
    assert set(a_side.resident_bytes()) == {"text_encoder"}
    assert a_side.num_clips(latents) >= 1 and a_side.decoder_info()["resident"]  # answered without reloading
    assert set(a_side.released) == {"vae", "audio_vae"}
    second = a_side.decode(latents)
    assert sorted(r.component for r in a_side.last_reload) == ["audio_vae", "vae"]
    np.testing.assert_array_equal(second.frames, first.frames)
    np.testing.assert_array_equal(second.audio, first.audio)
    with pytest.raises(ValueError, match="A cannot release"):
        a_side.release(("transformer",))


def test_a_side_reload_is_checked_against_the_plan(a_side):
    a_side.release(("text_encoder",), cause="a test")
    a_side.memory_limit_bytes = 1000  # as if the machine had filled up meanwhile
    try:
        with pytest.raises(mp.MemoryPlanError) as err:
            a_side.ensure(("text_encoder",), held_elsewhere={"ComfyUI's loaded models": 3 * GIB})
        msg = str(err.value)
        assert "text_encoder" in msg and "free on A" in msg and "ComfyUI's loaded models hold 3.0 GiB" in msg
        assert "Unload models" in msg and "then it fits" in msg and "parallel off" in msg
        assert "text_encoder" in a_side.released  # nothing loaded, still released
    finally:
        a_side.memory_limit_bytes = None
    a_side.ensure(("text_encoder",))
    assert "text_encoder" in a_side.resident_bytes()


def test_a_plan_counts_other_holders_and_names_the_ways_out(tiny_ckpt):
    base = mp.plan_a(tiny_ckpt, MODEL_COMPONENTS_A, "float32", limit_bytes=100 * GIB)
    need = base.need_bytes
    comfy = 10 * need
    held = {"ComfyUI's loaded models": comfy}
    # fits: the figure is in the summary, nothing to advise
    ok = mp.plan_a(tiny_ckpt, MODEL_COMPONENTS_A, "float32", limit_bytes=100 * GIB, held_elsewhere=held)
    assert ok.fits and not ok.advice and "ComfyUI's loaded models hold" in ok.summary()
    # does not fit in free memory, would after ComfyUI frees its models
    tight = int(need * 0.5)
    plan = mp.plan_a(tiny_ckpt, MODEL_COMPONENTS_A, "float32", limit_bytes=tight, held_elsewhere=held)
    assert not plan.fits
    text = plan.summary()
    assert f"> {mp.human(plan.usable_bytes)} free on A" in text
    assert "press ComfyUI's Unload models" in text and f"frees {mp.human(comfy)}" in text
    assert "then it fits" in text and "smaller text-encoder file" in text and "parallel off" in text
    # too little even after freeing ComfyUI's models: says how much is still short
    small = {"ComfyUI's loaded models": 1}
    plan = mp.plan_a(tiny_ckpt, MODEL_COMPONENTS_A, "float32", limit_bytes=tight, held_elsewhere=small)
    assert "still" in plan.summary() and "short" in plan.summary()
    with pytest.raises(mp.MemoryPlanError, match="memory plan refused before loading anything"):
        plan.check()


def test_a_plan_at_the_released_size_with_comfyuis_models():
    """The README's figures: the Comfy-Org text encoder file against the folder's, and a Spark holding a ComfyUI
    model besides."""
    saved = mp.RELEASED_TEXT_ENCODER_BYTES["folder"] - mp.RELEASED_TEXT_ENCODER_BYTES["comfy_org_file"]
    assert abs(saved / GIB - 14.1) < 0.05


def test_b_side_release_keeps_the_worker_and_the_next_denoise_reloads_the_same(tiny_ckpt, a_side, media):
    from remote_worker.b_side import BSide

    b = BSide(tiny_ckpt, dtype="float32")
    req = workflow_request("t2va", media)[0]
    payload = a_side.encode(req)
    first = b.denoise(payload, call_of(req, payload))
    held = b.resident_bytes()
    loads = len(b.load_records)
    out = b.release("a test")
    assert out["partitions"] == list(held) and all(out["bytes"][k] == v for k, v in held.items())
    assert out["total_bytes"] >= sum(held.values())
    assert b.resident_bytes() == {} and b.vae is None and b.resident_partitions == []
    assert b.release("again")["already"] is True
    assert b.memory_report()["measured_bytes"] == {}  # health still answers
    second = b.denoise(payload, call_of(req, payload))
    assert second.reload_s > 0 and "reloaded the model after a release" in second.schedule_note()
    assert b.resident_bytes() == held and b.released is None and b.reloads == 1
    assert {r.reason for r in b.load_records[loads:]} == {"reloaded after a test"}
    np.testing.assert_array_equal(second.latents.latents.to_torch().float().numpy(), first.latents.latents.to_torch().float().numpy())
    n = len(b.load_records)
    third = b.denoise(payload, call_of(req, payload))
    assert third.reload_s == 0.0 and len(b.load_records) == n  # resident again: nothing loads


def test_b_actor_release_through_the_pool(ray_cluster, tiny_ckpt, media):
    """The DiT actor's ``release`` (what the route and the shell verb call through ``pool.release``): the actor and
    its name stay, its status shows no weights, the next denoise reloads and its record says so."""
    from comfy_h3_nodes.engine.a_side.side import ASide
    from comfy_h3_nodes.engine.contract import wire
    from comfy_h3_nodes.engine.executor import pool
    from remote_worker.actor import start_dit

    name = "h3_dit_release_test"
    actor = start_dit({"model_dir": str(tiny_ckpt), "dtype": "float32", "threads": 1, "name": name,
                       "max_restarts": 0}, detached=False)
    try:
        before = ray.get(actor.pool_status.remote(), timeout=120)
        assert before["resident_bytes"]["transformer"] > 0 and before["released"] is None
        pid = before["pid"]
        out = pool.release(name, "comfy_h3", timeout=60, cause="a test")
        assert [r["name"] for r in out["released"]] == [name] and out["missing"] == {}
        assert out["released"][0]["bytes"]["transformer"] == before["resident_bytes"]["transformer"]
        st = ray.get(actor.pool_status.remote(), timeout=30)
        assert st["resident_bytes"] == {} and st["released"]["cause"] == "a test" and st["pid"] == pid
        h = ray.get(actor.health.remote(), timeout=30)
        assert h["released"]["partitions"] == before["resident_partitions"] and h["memory_plan"]["measured_bytes"] == {}
        loads = len(ray.get(actor.load_records.remote(), timeout=30))

        a = ASide(tiny_ckpt, dtype="float32")
        req = workflow_request("t2va", media)[0]
        payload = a.encode(req)
        ref = ray.put(payload)
        lat_ref, rec_ref = actor.denoise.options(num_returns=2).remote([ref], call_of(req, payload), 60.0)
        latents, records = ray.get([lat_ref, rec_ref], timeout=120)
        assert isinstance(latents, wire.DenoisedLatents)
        den = records[-1]
        reload_s = den.info["reloaded_after_release_s"]  # rounded to 0.1 ms in the record's info
        assert reload_s > 0 and round(den.load_s, 4) >= reload_s, (den.load_s, reload_s)
        assert "reloaded the model after a release" in den.note
        assert len(ray.get(actor.load_records.remote(), timeout=30)) > loads
        st = ray.get(actor.pool_status.remote(), timeout=30)
        assert st["released"] is None and st["resident_bytes"] == before["resident_bytes"] and st["pid"] == pid
        with pytest.raises(pool.PoolError, match="no DiT worker matching"):
            pool.release("h3_nobody_*", "comfy_h3", timeout=5)
    finally:
        ray.kill(actor, no_restart=True)


def test_b_load_count_never_goes_backwards_when_b_is_reconfigured(ray_cluster, tiny_ckpt):
    """#37 item 9: B's load count (health ``loads``: what ``remote_worker status`` and the node's note show) is the
    worker's since it started. A reconfigure (another model, dtype: a new model object on the same worker) adds its
    loads to it; the count fell 5 -> 3 before, when the new model's own records replaced the old ones."""
    from remote_worker.actor import start_dit

    actor = start_dit({"model_dir": str(tiny_ckpt), "dtype": "float32", "threads": 1,
                       "name": "h3_dit_load_count_test", "max_restarts": 0}, detached=False)
    try:
        before = ray.get(actor.health.remote(), timeout=120)
        assert before["loads"] >= 3 and before["reconfigures"] == 0, before
        done = ray.get(actor.reconfigure.remote({"dtype": "bfloat16"}), timeout=120)
        assert done["changed"] == {"dtype": ["float32", "bfloat16"]}
        after = ray.get(actor.health.remote(), timeout=30)
        loaded_now = len(ray.get(actor.load_records.remote(), timeout=30))  # the new model's own loads
        assert after["pid"] == before["pid"] and after["reconfigures"] == 1, after
        assert after["loads"] == before["loads"] + loaded_now > before["loads"], (before["loads"], after["loads"])
    finally:
        ray.kill(actor, no_restart=True)
