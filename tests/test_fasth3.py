"""FastH3 (FastVideo's VSA checkpoints) on B: the folder recognised and its VSA settings read, the memory plan with
the gates, the gates loaded by name, the trained step count enforced, the kernel chosen with its real errors, the
``tiny-random-fasth3`` choice, and t2va / fl2va / ref2va through the split: in process (the real A and B sides) and
on the two-node cluster."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from comfy_h3_nodes.engine.contract.errors import H3Error, ModelFolderError
from comfy_h3_nodes.engine.model import catalog, fasth3, formats, memory_plan
from comfy_h3_nodes.engine.model.backends import AttentionBackendError
from comfy_h3_nodes.engine.model.vsa_kernels import resolve_vsa_kernel
from conftest import call_of, workflow_request

WORKFLOWS = ("t2va", "fl2va", "ref2va")
GATE = "transformer_blocks.0.attn.to_gate_compress.weight"


def _copy(tiny_fasth3, tmp_path, name="fh3"):
    folder = tmp_path / name
    shutil.copytree(tiny_fasth3, folder)
    return folder


def _edit_config(folder, fn, part="transformer"):
    path = folder / part / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg)
    path.write_text(json.dumps(cfg))


# ---------------------------------------------------------------------------------------------------- detection
def test_fasth3_folder_is_recognised_with_its_settings(tiny_fasth3, tiny_ckpt):
    src = formats.detect(tiny_fasth3, "transformer")
    assert src.kind == "folder" and src.vsa is not None
    s = src.vsa
    assert (s.release, s.sparsity, s.tile_size, s.tile_shape, s.mode, s.steps, s.forwards, s.shift, s.audio_shift,
            s.gates) == ("v1", 0.9, 64, (4, 4, 4), "exempt", 5, 4, 12.0, 3.0, 1)
    assert s.source == "config.json `vsa`"
    assert formats.detect(tiny_ckpt, "transformer").vsa is None  # a dense folder stays dense
    assert formats.is_h3_transformer(tiny_fasth3 / "transformer_ref")


def test_settings_come_from_fastvideo_inference_json_then_the_release(tiny_fasth3, tmp_path):
    folder = _copy(tiny_fasth3, tmp_path)
    _edit_config(folder, lambda c: c.pop("vsa"))
    assert formats.detect(folder, "transformer").vsa.source == "FastH3 v1 defaults (no VSA settings in the folder)"
    (folder / fasth3.INFERENCE_JSON).write_text(json.dumps(
        {"release": "V2", "VSA_sparsity": 0.85, "num_inference_steps": 9, "model_path": "FastVideo/x"}))
    s = formats.detect(folder, "transformer").vsa  # the checkpoint folder's file: FastVideo's names
    assert (s.release, s.sparsity, s.steps, s.shift, s.tile_size) == ("v2", 0.85, 9, 10.0, 64)
    assert s.source == "fastvideo_inference.json, the rest v2 defaults"
    (folder / "transformer" / fasth3.INFERENCE_JSON).write_text(json.dumps({"VSA_tile_size": 256}))
    assert formats.detect(folder, "transformer").vsa.tile_size == 256  # the transformer's own file wins
    _edit_config(folder, lambda c: c.update(vsa={"sparsity": 0.8}))
    s = formats.detect(folder, "transformer").vsa
    assert (s.sparsity, s.tile_size, s.release) == (0.8, 256, "v1")  # key by key: vsa block, then the json
    assert s.source == "config.json `vsa` + fastvideo_inference.json, the rest v1 defaults"
    _edit_config(folder, lambda c: c.update(VSA_sparsity=0.7, num_inference_steps=6))  # FastVideo's names in it
    s = formats.detect(folder, "transformer").vsa
    assert (s.sparsity, s.steps, s.tile_size) == (0.8, 6, 256)  # the vsa block first, then config.json's names


@pytest.mark.parametrize("block,match", [
    ({"sparsity": 1.0}, r"`vsa`.sparsity is 1.0; it must be a number in \[0, 1\)"),
    ({"tile_size": 128}, "tile_size is 128; it must be one of 64, 256"),
    ({"mode": "dense"}, "mode is 'dense'; it must be one of exempt, compete"),
    ({"steps": 1}, "steps is 1; it must be a whole number of sigma points"),
    ({"release": "v3"}, "release is 'v3'; it must be one of v1, v2"),
    ({"sparsty": 0.9}, "unknown keys sparsty"),
])
def test_bad_vsa_settings_are_refused_in_one_sentence(tiny_fasth3, tmp_path, block, match):
    folder = _copy(tiny_fasth3, tmp_path)
    _edit_config(folder, lambda c: c.update(vsa=block))
    with pytest.raises(fasth3.FastH3Error, match=match):
        formats.detect(folder, "transformer")


def test_half_a_fasth3_folder_is_refused(tiny_fasth3, tiny_ckpt, tmp_path):
    folder = _copy(tiny_fasth3, tmp_path)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    state["token_refiner.refiner_blocks.0.attn.to_gate_compress.weight"] = torch.zeros(16, 24)
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(fasth3.FastH3Error, match="not a main block's `attn.to_gate_compress.weight`"):
        formats.detect(folder, "transformer")
    dense = _copy(tiny_ckpt, tmp_path, "dense")
    _edit_config(dense, lambda c: c.update(vsa={"release": "v1"}))
    with pytest.raises(fasth3.FastH3Error, match="declares VSA .* holds no `to_gate_compress` tensors"):
        formats.detect(dense, "transformer")
    broken = _copy(tiny_fasth3, tmp_path, "broken")
    (broken / fasth3.INFERENCE_JSON).write_text("{not json")
    with pytest.raises(fasth3.FastH3Error, match="fastvideo_inference.json is not valid JSON"):
        formats.detect(broken, "transformer")


def test_a_gate_of_another_shape_is_refused_before_loading(tiny_fasth3, tmp_path):
    from remote_worker.b_side import BSide

    folder = _copy(tiny_fasth3, tmp_path)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    state[GATE] = torch.zeros(32, 24)
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelFolderError, match=rf"1 with other shapes \(`{GATE}` is \(32, 24\), the config wants "
                                               r"\(16, 24\)\)"):
        BSide(folder, dtype="float32")


# ---------------------------------------------------------------------------------------------------- memory plan
def test_memory_plan_counts_the_gates(tiny_fasth3, tiny_ckpt):
    from remote_worker.b_side import BSide

    fh3 = memory_plan.transformer_bytes(formats.detect(tiny_fasth3, "transformer"), "bf16", "float32")
    dense = memory_plan.transformer_bytes(formats.detect(tiny_ckpt, "transformer"), "bf16", "float32")
    assert fh3.bytes - dense.bytes == 16 * 24 * 4  # one block's gate, fp32
    b = BSide(tiny_fasth3, dtype="float32", residency="one")
    assert b.memory_report()["measured_bytes"]["transformer"] == fh3.bytes  # what B really holds
    fp8 = memory_plan.transformer_bytes(formats.detect(tiny_fasth3, "transformer"), "fp8", "float32")
    fp8_dense = memory_plan.transformer_bytes(formats.detect(tiny_ckpt, "transformer"), "fp8", "float32")
    assert fp8.bytes - fp8_dense.bytes == 16 * 24  # the gate is a Linear: stored in fp8 too


def test_release_size_fasth3_is_35_billion_parameters():
    cfg = json.loads((formats.SHIPPED_CONFIG_ROOT / "transformer" / "config.json").read_text())
    base = sum(p.numel() for p in memory_plan.skeleton(cfg).parameters())
    fh3 = sum(p.numel() for p in memory_plan.skeleton(cfg, vsa=True).parameters())
    assert base == 33_122_992_896 and fh3 - base == 50 * 7168 * 5376 == 1_926_758_400  # 1.93 B gate parameters


# ---------------------------------------------------------------------------------------------------- kernels
def test_vsa_kernel_choice_is_checked_with_its_real_error(monkeypatch):
    assert resolve_vsa_kernel(None, "cpu").name == "torch"
    with pytest.raises(AttentionBackendError, match="VSA kernel 'flash' is unknown"):
        resolve_vsa_kernel("flash", "cpu")
    with pytest.raises(AttentionBackendError, match="runs on CUDA GPUs only and B runs on cpu"):
        resolve_vsa_kernel("triton", "cpu")
    # on CUDA, auto means FastVideo's kernels: their import error is the message, not a quiet switch to anything
    with pytest.raises(AttentionBackendError, match="needs 'fastvideo_kernel.block_sparse_attn'.*ModuleNotFoundError: "
                                                    "No module named 'fastvideo_kernel'"):
        resolve_vsa_kernel("auto", "cuda")
    monkeypatch.setenv("H3_VSA_KERNEL", "fastvideo")
    with pytest.raises(AttentionBackendError, match="runs on CUDA GPUs only"):
        resolve_vsa_kernel(None, "cpu")


def test_b_refuses_a_kernel_it_cannot_run_before_loading(tiny_fasth3, tiny_ckpt, monkeypatch):
    from remote_worker.b_side import BSide

    with pytest.raises(AttentionBackendError, match="'triton' runs on CUDA GPUs only"):
        BSide(tiny_fasth3, dtype="float32", vsa_kernel="triton")
    monkeypatch.setenv("H3_VSA_KERNEL", "triton")
    assert BSide(tiny_ckpt, dtype="float32").vsa_kernel is None  # a dense B has no VSA kernel to choose


# ---------------------------------------------------------------------------------------------------- catalog
def test_tiny_random_fasth3_is_a_choice_built_on_first_use(tmp_path, monkeypatch, tiny_fasth3):
    monkeypatch.setenv("H3_CACHE", str(tmp_path / "cache"))
    said = []
    path = catalog.resolve(catalog.TINY_CHOICES[0], announce=said.append)
    assert catalog.TINY_CHOICES == ("tiny-random-fasth3", "tiny-random") and "FastH3" in said[0]
    assert formats.detect(path, "transformer").vsa.release == "v1"
    assert catalog.resolve("tiny-random-fasth3", announce=said.append) == path and len(said) == 1  # reused

    def digest(root):
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    assert digest(pathlib.Path(path)) == digest(tiny_fasth3)  # deterministic: the fixture's bytes
    assert catalog.choices([])[-2:] == ["tiny-random-fasth3", "tiny-random"]
    assert not catalog.same_model("tiny-random", "tiny-random-fasth3")
    assert catalog.same_model("tiny-random-fasth3", " tiny-random-fasth3")


# ---------------------------------------------------------------------------------------------------- B in process
@pytest.fixture(scope="module")
def sides(tiny_fasth3):
    from comfy_h3_nodes.engine.a_side.side import ASide
    from remote_worker.b_side import BSide

    return ASide(tiny_fasth3, dtype="float32"), BSide(tiny_fasth3, dtype="float32")


def test_b_loads_every_gate_by_name(sides, tiny_fasth3):
    _, b = sides
    for part in ("transformer", "transformer_ref"):
        model = getattr(b._host, part)
        with safe_open(str(tiny_fasth3 / part / "diffusion_pytorch_model.safetensors"), "pt") as fh:
            assert torch.equal(model.transformer_blocks[0].attn.to_gate_compress.weight, fh.get_tensor(GATE))
        assert type(model.transformer_blocks[0].attn.processor).__name__ == "H3VSAProcessor"
        assert type(model.token_refiner.refiner_blocks[0].attn.processor).__name__ == "MiniMaxH3AttnProcessor"


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_split_runs_fasth3(sides, tiny_ckpt, media, workflow):
    from comfy_h3_nodes.engine.a_side.side import ASide
    from remote_worker.b_side import BSide

    a, b = sides
    req, _ = workflow_request(workflow, media, steps=5)
    enc = a.encode(req)
    res = b.denoise(enc, call_of(req, enc))
    assert len(res.steps) == 4 and (res.shift, res.audio_shift) == (12.0, 3.0)
    note = res.schedule_note()
    assert "VSA-H3 (FastH3 v1" in note and "kernel torch" in note and "kept 10.0% of video tile pairs" in note
    frames = a.decode(res.latents).frames
    assert frames.shape == (124, 64, 64, 3) and np.isfinite(frames).all()
    again = b.denoise(enc, call_of(req, enc))
    assert np.array_equal(again.latents.latents.data, res.latents.latents.data)  # deterministic
    dense = BSide(tiny_ckpt, dtype="float32").denoise(ASide(tiny_ckpt, dtype="float32").encode(req),
                                                      call_of(req, enc))
    assert not np.allclose(dense.latents.latents.data, res.latents.latents.data, atol=1e-3)  # VSA is not dense


def test_b_refuses_other_step_counts_and_keeps_serving(sides, media, tmp_path):
    from comfy_h3_nodes.engine.model.tiny import build_tiny_lora

    a, b = sides
    req, _ = workflow_request("t2va", media, steps=8)
    enc = a.encode(req)
    with pytest.raises(fasth3.TrainedScheduleError, match=r"is a FastH3 v1 checkpoint trained for 5 sigma points "
                                                          r"\(4 transformer forwards, shifts 12/3\) and the request "
                                                          r"asks for 8 steps: set steps to 5\.$"):
        b.denoise(enc, call_of(req, enc))
    lora = build_tiny_lora(tmp_path / "turbo.safetensors", steps=4, shift=5.0)
    req5, _ = workflow_request("t2va", media, steps=5, adapters=[(str(lora), 1.0)])
    enc5 = a.encode(req5)
    with pytest.raises(fasth3.TrainedScheduleError, match="ask for shift 5, and .* was trained with 12"):
        b.denoise(enc5, call_of(req5, enc5))
    ok, _ = workflow_request("t2va", media, steps=5)
    enc = a.encode(ok)
    assert len(b.denoise(enc, call_of(ok, enc)).steps) == 4


# ---------------------------------------------------------------------------------------------------- two nodes
@pytest.fixture(scope="module")
def fasth3_executor(ray_cluster, tiny_fasth3):
    from comfy_h3_nodes import placement
    from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts
    from comfy_h3_nodes.engine.executor import H3Executor

    ex = H3Executor(SideConfig(str(tiny_fasth3), dtype="float32", threads=1),
                    BConfig(str(tiny_fasth3), dtype="float32", threads=1, name="h3_dit_fasth3", max_restarts=0),
                    timeouts=Timeouts(start=120, health=10, encode=60, handoff=60, stall=60, decode=60, poll=0.05),
                    a_name="h3_encoders_fasth3", actors=placement.ACTORS)
    ex.start()
    yield ex
    ex.shutdown(kill_b=True)


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_two_node_fasth3_equals_the_in_process_split(fasth3_executor, sides, media, workflow):
    a, b = sides
    req, _ = workflow_request(workflow, media, steps=5)
    steps = []
    result = fasth3_executor.generate(req, on_step=steps.append)
    enc = a.encode(req)
    expected = a.decode(b.denoise(enc, call_of(req, enc)).latents)
    assert np.array_equal(result.media.frames, expected.frames) and np.array_equal(result.media.audio, expected.audio)
    assert [s.index for s in steps] == [0, 1, 2, 3]
    den = next(r for r in result.records if r.stage == "denoise")
    assert den.machine == "B" and "VSA-H3 (FastH3 v1" in den.note and den.info["vsa"]["transformer"]["steps"] == 5
    assert den.info["vsa"]["transformer"]["kernel"].startswith("torch")


def test_two_node_refuses_other_step_counts_before_encoding(fasth3_executor, media):
    assert fasth3_executor.check_health()["B"]["trained_steps"] == {"transformer": 5, "transformer_ref": 5}
    encodes = len(fasth3_executor.timings.records())
    with pytest.raises(H3Error, match=r"B's transformer is a FastH3 checkpoint trained for 5 sigma points \(4 "
                                      r"transformer forwards\) and the request asks for 3 steps: set steps to 5\."):
        fasth3_executor.generate(workflow_request("t2va", media, steps=3)[0])
    assert len(fasth3_executor.timings.records()) == encodes  # nothing ran: no encode, no transfer


def test_preflight_names_the_fasth3_model_and_its_kernel(tiny_fasth3, capsys):
    from remote_worker import cli

    def run(*extra):
        cli.main(["preflight", "--head", "127.0.0.2:9", "--allow-cpu", "--model-path", str(tiny_fasth3), *extra])
        return capsys.readouterr().out

    out = run()
    source = next(ln for ln in out.splitlines() if "transformer source" in ln)
    assert source.strip().startswith("PASS") and "FastH3 v1 (VSA-H3): sparsity 0.9, tile 64" in source
    kernel = next(ln for ln in out.splitlines() if "vsa kernel" in ln)
    assert kernel.strip().startswith("PASS") and "torch (kept tiles gathered into SDPA" in kernel
    out = run("--vsa-kernel", "triton")
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if "vsa kernel" in ln)
    assert lines[i].strip().startswith("FAIL") and "'triton' runs on CUDA GPUs only" in lines[i]
    assert "--vsa-kernel torch" in lines[i + 1]
