"""Bad input that reaches the resident actors or the loaders: a clear error, and the actors stay healthy."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.contract.configs import A_COMPONENTS
from comfy_h3_nodes.engine.contract.errors import ModelFolderError
from comfy_h3_nodes.engine.model.folders import check_model_dir
from conftest import PROMPT, workflow_request


@pytest.fixture(scope="module")
def good_payload(executor, media):
    import ray

    cond = executor.encode(workflow_request("t2va", media)[0])
    return ray.get(cond.ref)


def _corrupt(payload, kind):
    pe = payload.prompt_embeds
    if kind == "nan":
        data = pe.data.copy()
        data[0, 0, 0] = np.nan
        return dataclasses.replace(payload, prompt_embeds=wire.WireTensor(pe.dtype, data))
    if kind == "schema":
        return dataclasses.replace(payload, schema_version=99)
    if kind == "text_dim":
        return dataclasses.replace(payload, prompt_embeds=wire.WireTensor(pe.dtype, np.zeros((1, 4, 64), np.float32)),
                                   text_token_tags=wire.WireTensor("int64", np.zeros(4, np.int64)))
    if kind == "truncated":
        return dataclasses.replace(payload, text_token_tags=wire.WireTensor(
            "int64", payload.text_token_tags.data[:-1].copy()))
    if kind == "steps":
        return payload  # the payload is fine: its denoise call asks for 0 steps
    raise AssertionError(kind)


@pytest.mark.parametrize("kind,words", [
    ("nan", "prompt_embeds holds NaN or inf"),
    ("schema", f"wire schema version 99 but this side speaks version {wire.SCHEMA_VERSION}"),
    ("text_dim", "prompt_embeds has shape (1, 4, 64), expected (1, *, 32)"),
    ("truncated", "text_token_tags has shape"),
    ("steps", "num_inference_steps is 0"),
])
def test_bad_payload_refused_by_b_which_stays_healthy(executor, good_payload, kind, words):
    import ray

    ref = ray.put(_corrupt(good_payload, kind))
    call = wire.DenoiseCall(f"bad-{kind}", good_payload.request_id, 0, 0 if kind == "steps" else 3)
    lat_ref, recs_ref = executor.b.denoise.remote([ref], call, 10.0)
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(recs_ref, timeout=30)
    assert words in str(info.value)
    assert executor.check_health()["B"]["ok"]
    assert ray.get(executor.b.ping.remote(), timeout=10) == "127.0.0.3"


def test_bad_latents_refused_by_a_which_stays_healthy(executor, media):
    import ray

    bad = wire.DenoisedLatents("r1", "t2va", 64, 64, 124, wire.WireTensor("float32", np.zeros((1, 24, 37, 4, 5),
                                                                                               np.float32)),
                               wire.WireTensor("float32", np.zeros((2, 32, 207), np.float32)))
    media_ref, recs_ref = executor.a.handle.decode.remote([ray.put(bad)], "r1", 10.0)
    with pytest.raises(ray.exceptions.RayTaskError, match=r"latents has shape \(1, 24, 37, 4, 5\)"):
        ray.get(recs_ref, timeout=30)
    assert executor.generate(workflow_request("t2va", media, seed=3)[0]).media.frames.shape[0] == 124


def test_bad_requests_through_executor_then_good_one(executor, media):
    from comfy_h3_nodes.engine.contract.request import H3Request, RequestError

    bad = [
        (H3Request(prompt=PROMPT, height=64, width=320), "aspect ratio"),
        (H3Request(prompt="", height=64, width=64), "prompt is empty"),
        (H3Request(prompt=PROMPT, height=64, width=64, num_frames=60), "nearest valid: 124"),
        (H3Request(prompt=PROMPT, height=64, width=64, steps=-1), "steps -1 is below 1"),
        (H3Request(prompt=PROMPT, height=64, width=64, reference_images=[media["ref"]] * 10), "drop 1"),
        (H3Request(prompt=PROMPT, height=64, width=64, first_image=np.zeros((64, 64, 4), np.uint8)), "[H,W,3]"),
    ]
    for req, words in bad:
        with pytest.raises(RequestError, match=None) as info:
            executor.generate(req)
        assert words in str(info.value)
    assert executor.check_health()["A"]["ok"]
    assert executor.generate(workflow_request("t2va", media, seed=4)[0]).media.frames.shape[0] == 124


def test_missing_folder_and_component_are_named(tiny_ckpt, tmp_path):
    with pytest.raises(ModelFolderError, match="does not exist"):
        check_model_dir(tmp_path / "nope", A_COMPONENTS)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_ckpt, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(ModelFolderError, match=rf"model folder {broken} lacks the component 'vae'"):
        check_model_dir(broken, A_COMPONENTS)
    (tmp_path / "no_index").mkdir()
    with pytest.raises(ModelFolderError, match="has no modular_model_index.json"):
        check_model_dir(tmp_path / "no_index", A_COMPONENTS)


def test_a_side_refuses_folder_missing_a_component(tiny_ckpt, tmp_path):
    from comfy_h3_nodes.engine.a_side.side import ASide

    broken = tmp_path / "no_audio_vae"
    shutil.copytree(tiny_ckpt, broken)
    shutil.rmtree(broken / "audio_vae")
    with pytest.raises(ModelFolderError, match="lacks the component 'audio_vae'"):
        ASide(broken, dtype="float32")


def test_corrupt_component_weights_named(tiny_ckpt, tmp_path):
    from remote_worker.b_side import BSide

    broken = tmp_path / "bad_weights"
    shutil.copytree(tiny_ckpt, broken)
    for f in (broken / "transformer").glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFolderError, match=r"bad_weights/transformer/.*does not start with a safetensors header"):
        BSide(broken, dtype="float32")


def test_unknown_attention_backend_and_missing_flash(tiny_ckpt):
    from comfy_h3_nodes.engine.model.backends import AttentionBackendError, resolve_attention_backend

    with pytest.raises(AttentionBackendError, match="'flash_hub' downloads its kernels"):
        resolve_attention_backend("flash_hub")
    with pytest.raises(AttentionBackendError, match="unknown"):
        resolve_attention_backend("warp")
    try:
        import flash_attn  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(AttentionBackendError, match=f"whose import failed: {type(exc).__name__}"):
            resolve_attention_backend("flash")
