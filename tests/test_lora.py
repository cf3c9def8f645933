"""Few-step generation on B: LoRA adapters through the two-node executor, bit-exact against diffusers'
single-process pipeline with the same adapter loaded the same way; refusals of adapters and checkpoints that do not
fit; distilled checkpoints in the diffusers layout."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from comfy_h3_nodes.engine.contract.request import H3Request
from comfy_h3_nodes.engine.model.tiny import build_tiny_checkpoint, build_tiny_lora
from conftest import PROMPT, denoise


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    d = tmp_path_factory.mktemp("loras")
    return {
        "plain": build_tiny_lora(d / "style.safetensors", seed=1),
        "other": build_tiny_lora(d / "other.safetensors", seed=2),
        "turbo": build_tiny_lora(d / "turbo4.safetensors", seed=3, steps=4, shift=5.0),
    }


def _request(seed=7, steps=3, adapters=()):
    return H3Request(prompt=PROMPT, height=64, width=64, num_frames=124, steps=steps, seed=seed,
                     adapters=list(adapters))


def _reference(ckpt, adapters=(), seed=7, steps=3, shift=None):
    """diffusers' single-process pipeline with the adapters loaded by its own LoRA loader."""
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    from comfy_h3_nodes.engine.model.compat import ensure_processor_compat

    ensure_processor_compat()
    pipe = MiniMaxH3Blocks().get_workflow("t2va").init_pipeline(str(ckpt))
    pipe.load_components(dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    names = []
    for i, (path, _) in enumerate(adapters):
        pipe.load_lora_weights(str(path), adapter_name=f"a{i}")
        names.append(f"a{i}")
    if names:
        pipe.set_adapters(names, [w for _, w in adapters])
    if shift is not None:
        pipe.update_components(scheduler=type(pipe.scheduler).from_config(pipe.scheduler.config, shift=shift))
    return pipe(prompt=PROMPT, height=64, width=64, num_frames=124, num_inference_steps=steps,
                generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                output=["videos", "audio"])["videos"][0]


def test_lora_split_bit_exact_and_differs_from_base(executor, tiny_ckpt, loras):
    with_lora = executor.generate(_request(adapters=[(str(loras["plain"]), 0.8)]))
    expected = _reference(tiny_ckpt, [(loras["plain"], 0.8)])
    assert np.array_equal(with_lora.media.frames, expected)
    base = executor.generate(_request())
    assert not np.array_equal(base.media.frames, with_lora.media.frames)
    assert np.array_equal(base.media.frames, _reference(tiny_ckpt))  # adapters switched off again
    note = next(r.note for r in with_lora.records if r.stage == "denoise")
    assert "LoRA style.safetensorsx0.8" in note and "switch" in note


def test_two_requests_in_flight_with_different_adapters(executor, tiny_ckpt, loras):
    before = executor.load_records()["B"]
    a = _request(seed=11, adapters=[(str(loras["plain"]), 1.0)])
    b = _request(seed=12, adapters=[(str(loras["other"]), 0.5), (str(loras["plain"]), 0.25)])
    ra, rb = executor.run_many([a, b])
    assert np.array_equal(ra.media.frames, _reference(tiny_ckpt, [(loras["plain"], 1.0)], seed=11))
    assert np.array_equal(rb.media.frames,
                          _reference(tiny_ckpt, [(loras["other"], 0.5), (loras["plain"], 0.25)], seed=12))
    assert executor.load_records()["B"] == before  # switching adapters never reloads the base transformer


def test_adapter_sidecar_sets_the_schedule(executor, tiny_ckpt, loras):
    res = executor.generate(_request(steps=4, adapters=[(str(loras["turbo"]), 1.0)]))
    note = next(r.note for r in res.records if r.stage == "denoise")
    assert "shift 5 (video) / 3 (audio)" in note and "3 forwards" in note
    assert np.array_equal(res.media.frames, _reference(tiny_ckpt, [(loras["turbo"], 1.0)], steps=4, shift=5.0))
    plain = executor.generate(_request(steps=4))
    assert "shift 12 (video)" in next(r.note for r in plain.records if r.stage == "denoise")


def test_adapter_that_does_not_fit_is_refused_and_b_keeps_serving(executor, tmp_path, loras):
    from safetensors.torch import load_file, save_file

    from comfy_h3_nodes.engine.contract.errors import H3Error

    state = load_file(str(loras["plain"]))
    bad = {k.replace("attn.to_q", "attn.to_gate_compress"): v for k, v in state.items()}
    save_file(bad, str(tmp_path / "vsa.safetensors"))
    with pytest.raises(H3Error, match=r"fit no module .*to_gate_compress.*FastVideo's video sparse attention"):
        executor.generate(_request(adapters=[(str(tmp_path / "vsa.safetensors"), 1.0)]))
    wide = {k: (torch.zeros(v.shape[0], 99) if k.endswith("to_q.lora_A.weight") else v) for k, v in state.items()}
    save_file(wide, str(tmp_path / "wide.safetensors"))
    with pytest.raises(H3Error, match=r"do not match the transformer's shapes.*module takes 24 inputs"):
        executor.generate(_request(adapters=[(str(tmp_path / "wide.safetensors"), 1.0)]))
    with pytest.raises(H3Error, match="does not exist on machine B"):
        executor.generate(_request(adapters=[(str(tmp_path / "missing.safetensors"), 1.0)]))
    assert executor.generate(_request()).media.frames.shape == (124, 64, 64, 3)


def test_lora_node_checks_its_file_on_b_up_front(local_host, executor, tiny_ckpt, tmp_path, loras):
    """H3LoRA asks B about its file before any request: a missing or misfit file fails on H3LoRA (with the
    tiny-random hint), a good one is named in its readout as B's; B keeps serving."""
    import comfy_h3_nodes.nodes as N
    from comfy_h3_nodes.engine.contract.errors import H3Error
    from comfy_h3_nodes.nodes.values import DiT

    dit = DiT(executor, ())
    with pytest.raises(H3Error, match=r"missing.safetensors does not exist on machine B.*'tiny-random'"):
        N.H3LoRA().apply(dit, str(tmp_path / "missing.safetensors"), 1.0, unique_id="9")
    state = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(loras["plain"]))
    bad = {k.replace("attn.to_q", "attn.to_gate_compress"): v for k, v in state.items()}
    __import__("safetensors.torch", fromlist=["save_file"]).save_file(bad, str(tmp_path / "vsa.safetensors"))
    with pytest.raises(H3Error, match="fit no module"):
        N.H3LoRA().apply(dit, str(tmp_path / "vsa.safetensors"), 1.0, unique_id="9")
    out = N.H3LoRA().apply(dit, str(loras["turbo"]), 0.5, unique_id="9")
    timing = out["ui"]["h3_timing"][0]
    assert timing["summary"]["machine"] == "B" and timing["summary"]["resolved"] == str(loras["turbo"].resolve())
    assert out["result"][0].adapters == ((str(loras["turbo"]), 0.5),)
    assert N.H3LoRA().apply(dit, "tiny-random", 1.0)["ui"]["h3_timing"][0]["summary"]["resolved"].endswith(
        ".safetensors")
    assert executor.generate(_request()).media.frames.shape == (124, 64, 64, 3)


def test_request_refuses_bad_adapter_values():
    from comfy_h3_nodes.engine.contract.request import RequestError, validate_request

    with pytest.raises(RequestError, match="not a .safetensors file"):
        validate_request(_request(adapters=[("/models/x.ckpt", 1.0)]))
    with pytest.raises(RequestError, match="strength nan"):
        validate_request(_request(adapters=[("/models/x.safetensors", float("nan"))]))


def test_foreign_checkpoint_refused_with_its_tensors_named(tiny_ckpt, tmp_path):
    from safetensors.torch import load_file, save_file

    from comfy_h3_nodes.engine.contract.errors import ModelFolderError
    from remote_worker.b_side import BSide

    folder = tmp_path / "sparse"
    shutil.copytree(tiny_ckpt, folder)
    (weights,) = list((folder / "transformer").glob("*.safetensors"))
    state = load_file(str(weights))
    state["token_refiner.refiner_blocks.0.attn.to_gate_compress.weight"] = torch.zeros(16, 24)
    save_file(state, str(weights), metadata={"format": "pt"})
    # refused by the format check (engine/formats.py, FastH3's layout in fasth3.py) before anything loads: a VSA gate
    # where FastH3 has none
    with pytest.raises(ModelFolderError, match=r"VSA gate tensors that do not fit FastH3's layout: .*1 are not a "
                                               r"main block's `attn.to_gate_compress.weight` "
                                               r"\(`token_refiner.refiner_blocks.0.attn.to_gate_compress.weight`\)"):
        BSide(folder, dtype="float32")


def test_distilled_checkpoint_loads_like_the_base(tmp_path, media):
    from comfy_h3_nodes.engine.a_side.side import ASide
    from remote_worker.b_side import BSide

    base = build_tiny_checkpoint(tmp_path / "base", seed=0)
    distilled = build_tiny_checkpoint(tmp_path / "distilled", seed=5)
    shutil.rmtree(distilled / "text_encoder")
    shutil.copytree(base / "text_encoder", distilled / "text_encoder")  # same encoder, another transformer
    a, b = ASide(distilled, dtype="float32"), BSide(distilled, dtype="float32")
    out = a.decode_raw(denoise(b, a, _request(steps=4)).latents, "np")["videos"][0]
    assert np.array_equal(out, _reference(distilled, steps=4))
    assert not np.array_equal(out, _reference(base, steps=4))
