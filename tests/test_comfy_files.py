"""Comfy-Org's file layouts on both machines, from the tiny builder's fixtures (``<ckpt>/comfy/``, made from the tiny
checkpoint's own weights): B runs every transformer layout as its partition, A takes each of its parts from a file, all
three workflows run, the memory plans equal what each side holds, and the refusals are one sentence.

Tolerances (measured on these fixtures, bf16 on B, fp32 on A): the pruned files approximate the unpruned model (8
curve dimensions of 16, a 33-point grid) and the quantised ones round their weights, so B's latents stay within
``PRUNED_TOL`` of the folder's (measured 0.007-0.012; latents' mean magnitude 0.9); A's prompt embeddings from a bf16,
int8_convrot or nvfp4_awq text encoder file stay within ``TE_TOL`` of the folder's fp32 ones (measured 8e-4, 6e-3,
9e-2 on a scale of 0.23). Unquantised fp32 files of the text encoder and both VAEs are bit-exact to the folder.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.model import comfy_keys, formats, memory_plan as mp, tiny_comfy
from comfy_h3_nodes.engine.model.tiny_comfy import fixture
from conftest import denoise_each, encode_each, workflow_request

PRUNED_TOL = 0.05
TE_TOL = {"bf16": 0.005, "int8_convrot": 0.02, "nvfp4_awq": 0.2}
DIT_LAYOUTS = list(tiny_comfy.DIT_FILES)
WORKFLOWS = ("t2va", "fl2va", "ref2va")


def _dit(ckpt, label):
    return {p: str(fixture(ckpt, f"{p}:{label}")) for p in ("transformer", "transformer_ref")}


@pytest.fixture(scope="module")
def a_side(tiny_ckpt):
    from comfy_h3_nodes.engine.a_side.side import ASide

    return ASide(tiny_ckpt, dtype="float32")


@pytest.fixture(scope="module")
def encoded(a_side, media):
    return encode_each(a_side, WORKFLOWS, media)


@pytest.fixture(scope="module")
def folder_latents(tiny_ckpt, encoded):
    return denoise_each(tiny_ckpt, encoded)


# ------------------------------------------------------------------------------------------------ detection
@pytest.mark.parametrize("label,variant,pruned", [("pruned_bf16", "", True), ("pruned_fp8_scaled", "fp8_scaled", True),
                                                  ("pruned_int8_convrot", "int8", True), ("int8_convrot", "int8", False)])
def test_transformer_layouts_are_told_apart_by_their_headers(tiny_ckpt, label, variant, pruned):
    for part in ("transformer", "transformer_ref"):
        src = formats.detect(fixture(tiny_ckpt, f"{part}:{label}"), part)
        assert (src.kind, src.variant, src.pruned) == ("single_file", variant, pruned)
        assert src.config_root == fixture(tiny_ckpt, f"{part}:{label}").parent.resolve()  # the config beside it
        assert formats.is_h3_transformer(src.path)


@pytest.mark.parametrize("label,part,variant", [("text_encoder:bf16", "text_encoder", ""),
                                                ("text_encoder:int8_convrot", "text_encoder", "int8"),
                                                ("text_encoder:nvfp4_awq", "text_encoder", "nvfp4_awq"),
                                                ("vae:fp16", "vae", ""), ("vae:int8_convrot", "vae", "int8"),
                                                ("audio_vae:fp32", "audio_vae", "")])
def test_a_part_files_are_told_apart_by_their_headers(tiny_ckpt, label, part, variant):
    from comfy_h3_nodes.engine.model import comfy_files

    path = fixture(tiny_ckpt, label)
    tensors, meta = formats.read_safetensors_header(path)
    assert comfy_keys.part_of(tensors) == part and comfy_keys.variant_of(tensors, meta) == variant
    src = comfy_files.detect_part(path, part, tiny_ckpt)
    assert src.config_root == tiny_ckpt.resolve() and src.variant == variant
    assert all(comfy_files.is_part_file(path, p) == (p == part) for p in ("text_encoder", "vae", "audio_vae"))
    with pytest.raises(formats.FormatError, match="is not a MiniMax-H3 transformer: it looks like a .* machine A"):
        formats.detect(path)  # given to B: named, with the machine and folder it belongs in


def test_wrong_files_for_a_part_are_refused_in_one_sentence(tiny_ckpt):
    from comfy_h3_nodes.engine.model import comfy_files

    for path, part, what in ((fixture(tiny_ckpt, "vae:fp16"), "text_encoder", "video VAE"),
                             (fixture(tiny_ckpt, "transformer:pruned_bf16"), "vae", "transformer"),
                             (fixture(tiny_ckpt, "audio_vae:fp32"), "vae", "audio VAE")):
        with pytest.raises(formats.FormatError) as err:
            comfy_files.detect_part(path, part, tiny_ckpt)
        msg = str(err.value)
        assert what in msg and f"for {part}" in msg and msg.count(". ") == 0, msg


def test_w6a8_needs_a_kitchen_that_decodes_six_bit_rows(tmp_path, tiny_ckpt):
    """A w6a8 layer (6-bit rows: a packed row of 3K/4 bytes) is named from the header; comfy-kitchen 0.2.31 (ComfyUI's
    pin) decodes 4-bit rows only, so there it is refused in one sentence naming the version that works."""
    from safetensors.torch import load_file

    state = load_file(str(fixture(tiny_ckpt, "transformer:pruned_bf16")))
    w = state.pop("blocks.0.mlp.fc2.weight")  # [24, 48]: K = 48, 6-bit rows of 36 bytes
    state["blocks.0.mlp.fc2.weight"] = torch.zeros(w.shape[0], 48 * 6 // 8, dtype=torch.int8)
    state["blocks.0.mlp.fc2.weight_s_rel"] = torch.zeros(w.shape[0], 3, dtype=torch.uint8)
    state["blocks.0.mlp.fc2.weight_s_channel"] = torch.ones(w.shape[0])
    f = tmp_path / "minimax_h3_t2va_pruned_w6a8.safetensors"
    save_file(state, str(f))
    if comfy_keys.kitchen_version() < (0, 2, 40):
        with pytest.raises(comfy_keys.QuantError) as err:
            formats.detect(f, model_dir=tiny_ckpt)
        msg = str(err.value)
        assert "w6a8" in msg and "comfy-kitchen>=0.2.40" in msg and msg.count(". ") == 0
    else:
        assert formats.detect(f, model_dir=tiny_ckpt).variant == "w6a8"


# ------------------------------------------------------------------------------------------------ B
@pytest.mark.parametrize("label", DIT_LAYOUTS)
def test_b_runs_every_transformer_layout_in_every_workflow(tiny_ckpt, encoded, folder_latents, label):
    """Both partitions from the layout's files: t2va, fl2va (transformer) and ref2va (transformer_ref) denoise close
    to the folder's bf16 model; quantised layers stay as stored (comfy-kitchen tensors) and the plan is what B holds."""
    from comfy_kitchen.tensor import QuantizedTensor

    from remote_worker.b_side import BSide

    b = BSide(tiny_ckpt, dtype="bfloat16", sources=_dit(tiny_ckpt, label))
    assert b.residency == "both" and {s.kind for s in b.sources.values()} == {"single_file"}
    model = b._host.transformer
    quantised = isinstance(model.transformer_blocks[0].attn.to_q.weight, QuantizedTensor)
    assert quantised == (b.sources["transformer"].variant != "") and b.precision == ("stored" if quantised else "bf16")
    assert {c.name: c.bytes for c in b.memory_plan.components} == b.resident_bytes()
    for wf, enc in encoded.items():
        got = b.denoise(*enc).latents
        assert got.latents.to_torch().isfinite().all() and got.audio_latents.to_torch().isfinite().all()
        for field in ("latents", "audio_latents"):
            ref = getattr(folder_latents[wf], field).to_torch()
            diff = (getattr(got, field).to_torch() - ref).abs().max().item()
            assert 0 < diff < PRUNED_TOL, (label, wf, field, diff)
    assert b.partition == "transformer_ref"  # ref2va ran on the ref file


@pytest.mark.parametrize("label,precision,runs,storage", [
    ("int8_convrot", "auto", "int8 layers as stored, dequantised per call to bfloat16", torch.int8),
    ("pruned_fp8_scaled", "auto", "fp8_scaled layers as stored, dequantised per call to bfloat16, pruned AdaLN in "
                                  "fp32", torch.float8_e4m3fn),
    ("pruned_int8_convrot", "bf16", "int8 dequantised to bfloat16 at load, pruned AdaLN in fp32", torch.bfloat16),
])
def test_b_says_which_file_it_runs_and_at_what_precision(tiny_ckpt, label, precision, runs, storage):
    """What B reports for each partition (the readouts' source): the file picked, not the configs folder the pack
    ships, and what the layers really are: a quantised file's layers as stored (their storage dtype checked on the
    model) or dequantised at load. H3RemoteDiT's line and the denoise's schedule say the same."""
    from comfy_kitchen.tensor import QuantizedTensor

    from comfy_h3_nodes.engine.contract.timing import StageRecord
    from comfy_h3_nodes.nodes.generate import schedule_extra
    from comfy_h3_nodes.nodes.loaders import b_config_text
    from remote_worker.b_side import BSide

    files = _dit(tiny_ckpt, label)
    b = BSide(tiny_ckpt, dtype="bfloat16", residency="one",
              precision=precision, sources=files)
    weight = b._host.transformer.transformer_blocks[0].attn.to_q.weight
    held = weight._qdata.dtype if isinstance(weight, QuantizedTensor) else weight.dtype
    assert held == storage, (label, held)
    w = b.weights()
    assert w["transformer"] == {"file": files["transformer"], "runs": runs}, w
    health = {"model": files["transformer"], "model_dir": str(formats.RELEASED_CONFIG_DIR), "partition": "transformer",
              "dtype": b.dtype, "precision": precision, "attention_backend": "sdpa", "weights": w,
              "memory_plan": {"resident_partitions": ["transformer"]}}
    name = pathlib.Path(files["transformer"]).name
    assert b_config_text(health) == f"{name}, transformer, precision {precision}: {runs}, attention sdpa"
    den = StageRecord("r", "denoise", "B", "b", 0.0, 1.0, steps=(0.1, 0.1), note="2 forwards",
                      info={**health, "attention_backend": "sdpa"})
    assert schedule_extra([den], 3)["schedule"] == f"3 sigma points on transformer from {name} ({runs}, sdpa): 2 forwards"


def test_pruned_file_runs_the_curve_and_dequantised_precision(tiny_ckpt, encoded):
    """The pruned model replaces the time embedder by the table's interpolation (its modulation is fp32), and a
    quantised file at precision bf16 is dequantised at load: plain tensors, more bytes, nearly the same latents."""
    from remote_worker.b_side import BSide

    stored = BSide(tiny_ckpt, dtype="bfloat16", residency="one", sources=_dit(tiny_ckpt, "pruned_fp8_scaled"))
    plain = BSide(tiny_ckpt, dtype="bfloat16", residency="one", precision="bf16",
                  sources=_dit(tiny_ckpt, "pruned_fp8_scaled"))
    m = plain._host.transformer
    assert type(m.time_embedder).__name__ == "CurveTimeEmbedding" and isinstance(m.time_proj, torch.nn.Identity)
    assert m.transformer_blocks[0].adaln_proj.linear.weight.dtype == torch.float32
    assert m.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16 and plain.precision == "bf16"
    assert sum(plain.resident_bytes().values()) > sum(stored.resident_bytes().values())
    a = stored.denoise(*encoded["t2va"]).latents.latents.to_torch()
    b = plain.denoise(*encoded["t2va"]).latents.latents.to_torch()
    assert (a - b).abs().max().item() < 0.01
    with pytest.raises(mp.MemoryPlanError, match="Comfy-Org fp8_scaled file: choose precision 'auto'"):
        BSide(tiny_ckpt, dtype="bfloat16", precision="fp8", sources=_dit(tiny_ckpt, "pruned_fp8_scaled"))


def test_converter_is_diffusers_own_on_the_published_layout(tiny_ckpt):
    """The pack's reader of Comfy-Org files gives, on the plain published file, exactly the weights diffusers' own
    single-file converter gives (the folder's, bf16-rounded as stored)."""
    from comfy_h3_nodes.engine.model import comfy_dit

    src = formats.detect(tiny_ckpt / "single_file" / "transformer.safetensors", model_dir=tiny_ckpt)
    ours = comfy_dit.load(src, torch.float32).state_dict()
    from safetensors.torch import load_file

    ref = load_file(str(tiny_ckpt / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert set(ours) - {"rope.inv_freq"} == set(ref) - {"rope.inv_freq"}
    for k, v in ref.items():
        if k == "rope.inv_freq":
            continue
        stored = torch.float32 if mp.keep_fp32(mp.MiniMaxH3Transformer3DModel, k) else torch.bfloat16
        assert torch.equal(ours[k], v.to(stored).float()), k


def test_lora_on_a_pruned_file_works_and_an_adaln_lora_is_refused(tiny_ckpt, encoded, tmp_path):
    from comfy_h3_nodes.engine.model.tiny import build_tiny_lora
    from remote_worker.adapters import AdapterError
    from remote_worker.b_side import BSide

    b = BSide(tiny_ckpt, dtype="bfloat16", residency="one", sources=_dit(tiny_ckpt, "pruned_fp8_scaled"))
    payload, call = encoded["t2va"]
    base = b.denoise(payload, call).latents.latents.to_torch()
    lora = build_tiny_lora(tmp_path / "style.safetensors", seed=1)
    with_lora = b.denoise(payload, wire.DenoiseCall(call.request_id, call.conditioning_id, call.seed,
                                                   call.num_inference_steps, (wire.AdapterSpec(str(lora), 0.8),)))
    assert (with_lora.latents.latents.to_torch() - base).abs().max().item() > 0.01
    adaln = tmp_path / "adaln.safetensors"
    save_file({"transformer.transformer_blocks.0.adaln_proj.linear.lora_A.weight": torch.zeros(4, 16),
               "transformer.transformer_blocks.0.adaln_proj.linear.lora_B.weight": torch.zeros(432, 4)}, str(adaln))
    with pytest.raises(AdapterError) as err:
        b.denoise(payload, wire.DenoiseCall(call.request_id, call.conditioning_id, call.seed, call.num_inference_steps,
                                            (wire.AdapterSpec(str(adaln), 1.0),)))
    msg = str(err.value)
    assert "pruned transformer" in msg and "unpruned file" in msg and msg.count(". ") == 1  # + "Nothing was loaded."


# ------------------------------------------------------------------------------------------------ A
@pytest.mark.parametrize("te,vae", [("bf16", "fp16"), ("int8_convrot", "int8_convrot"), ("nvfp4_awq", "fp16")])
def test_a_takes_its_parts_from_files_in_every_workflow(tiny_ckpt, a_side, encoded, folder_latents, te, vae):
    """Text encoder, video VAE and audio VAE from files: every workflow encodes close to the folder's parts, decodes
    close to them, and the plan equals what A holds."""
    from comfy_h3_nodes.engine.a_side.side import ASide

    parts = {"text_encoder": fixture(tiny_ckpt, f"text_encoder:{te}"), "vae": fixture(tiny_ckpt, f"vae:{vae}"),
             "audio_vae": fixture(tiny_ckpt, "audio_vae:fp32")}
    a = ASide(tiny_ckpt, dtype="float32", parts=parts)
    assert set(a.parts) == set(parts) and all(r.reason.startswith("startup (file ") for r in a.load_records[-3:])
    for name, comp in ((c.name, c) for c in a.memory_plan.components):
        model = getattr(a._host, name)
        held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        assert comp.bytes == held, name
    for wf, (payload, _) in encoded.items():
        got = a.encode(_requests[wf])
        diff = (got.prompt_embeds.to_torch() - payload.prompt_embeds.to_torch()).abs().max().item()
        assert diff < TE_TOL[te], (wf, diff)
        for x, y in zip(got.condition_latents, payload.condition_latents):
            assert (x.to_torch() - y.to_torch()).abs().max().item() < 0.05, wf
    media = a.decode(folder_latents["t2va"])
    ref = a_side.decode(folder_latents["t2va"])
    assert media.frames.shape == ref.frames.shape and np.abs(media.frames - ref.frames).max() < 0.05
    assert np.abs(media.audio - ref.audio).max() < 1e-3


_requests: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _keep_requests(media):
    for wf in WORKFLOWS:
        _requests[wf] = workflow_request(wf, media)[0]


def test_fp32_files_are_bit_exact_and_layer_50_is_the_files_last(tiny_ckpt, tmp_path, a_side, folder_latents):
    """Unquantised fp32 files of the three parts give exactly the folder's results: the 50-layer text encoder file
    loads as 51 layers whose last adds nothing, so diffusers reads ``hidden_states[50]`` = the file's 50th layer."""
    from transformers import Qwen3VLForConditionalGeneration

    from comfy_h3_nodes.engine.a_side.side import ASide
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    te = Qwen3VLForConditionalGeneration.from_pretrained(str(tiny_ckpt / "text_encoder"))
    files = {"text_encoder": tiny_comfy.comfy_text_encoder_state(te, dtype=torch.float32),
             "vae": tiny_comfy.comfy_video_vae_state(AutoencoderKLMiniMaxH3.from_pretrained(str(tiny_ckpt / "vae")),
                                                     dtype=torch.float32),
             "audio_vae": tiny_comfy.comfy_audio_vae_state(
                 AutoencoderKLMiniMaxH3Audio.from_pretrained(str(tiny_ckpt / "audio_vae")))}
    assert not any(k.startswith(("model.layers.50.", "model.norm.", "lm_head")) for k in files["text_encoder"])
    parts = {}
    for name, state in files.items():
        parts[name] = tmp_path / f"{name}.safetensors"
        save_file(state, str(parts[name]))
    a = ASide(tiny_ckpt, dtype="float32", parts=parts)
    lm = a._host.text_encoder.model.language_model
    assert len(lm.layers) == 51 and type(lm.layers[50].mlp).__name__ == "ZeroMLP"
    assert a._host.text_encoder.config.text_config.num_hidden_layers == 51
    for wf in WORKFLOWS:
        assert torch.equal(a.encode(_requests[wf]).prompt_embeds.to_torch(),
                           a_side.encode(_requests[wf]).prompt_embeds.to_torch()), wf
    got, ref = a.decode(folder_latents["ref2va"]), a_side.decode(folder_latents["ref2va"])
    assert np.array_equal(got.frames, ref.frames) and np.array_equal(got.audio, ref.audio)


def test_tiny_random_parts_and_a_plan_at_the_released_size(tmp_path, monkeypatch):
    """``tiny-random`` as a part is the tiny model's own part as a single file (built on first use); the shipped
    configs describe the released files (text encoder shapes as Comfy-Org's file holds them)."""
    from comfy_h3_nodes.engine.model import catalog, comfy_files

    monkeypatch.setenv("H3_CACHE", str(tmp_path / "cache"))
    path = catalog.resolve_part(catalog.TINY, "text_encoder")
    assert comfy_files.is_part_file(path, "text_encoder") and catalog.resolve_part(catalog.FROM_MODEL, "vae") is None
    cfg = json.loads((formats.RELEASED_CONFIG_DIR / "text_encoder" / "config.json").read_text())
    header = {"model.layers.49.self_attn.q_proj.weight": (8192, 5120), "model.layers.0.mlp.gate_proj.weight":
              (25600, 5120), "model.embed_tokens.weight": (151936, 5120), "visual.pos_embed.weight": (2304, 1152),
              "visual.deepstack_merger_list.0.norm.weight": (4608,)}
    tensors = {n: formats.TensorInfo(n, s, "BF16", 0) for n, s in header.items()}
    model = comfy_files.skeleton("text_encoder", cfg, tensors)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for name, shape in header.items():
        mapped = "model.language_model." + name[6:] if name.startswith("model.") else "model." + name
        assert shapes[mapped] == shape, name
    n = sum(p.numel() for k, p in comfy_files.resident_params(
        comfy_files.PartSource("text_encoder", tmp_path, tensors), model).items())
    assert 25.5e9 < n < 26.0e9  # about 25.7 G parameters, 51 GB in bf16 (no lm_head: tied)


def test_a_template_names_comfy_org_files_on_both_machines(local_host, tiny_ckpt, tmp_path, monkeypatch):
    """The t2va template with its pickers set to Comfy-Org's file names (A: text_encoders/ and vae/ of its model
    folders; B: the pruned fp8_scaled transformer file, its config beside it) runs to an MP4, model_path tiny-random;
    the loader's readout says which parts came from files."""
    from comfy_h3_nodes.tools import runner

    models = tmp_path / "models"
    names = {"text_encoders/qwen3vl_32b_minimax_h3_bf16.safetensors": "text_encoder:bf16",
             "vae/minimax_h3_video_vae_int8_convrot.safetensors": "vae:int8_convrot",
             "vae/minimax_h3_audio_vae_fp32.safetensors": "audio_vae:fp32"}
    for rel, label in names.items():
        (models / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(fixture(tiny_ckpt, label), models / rel)
    dit = models / "diffusion_models" / "minimax_h3_t2va_pruned_fp8_scaled.safetensors"
    dit.parent.mkdir(parents=True)
    shutil.copy(fixture(tiny_ckpt, "transformer:pruned_fp8_scaled"), dit)
    shutil.copytree(tiny_ckpt / "comfy" / "diffusion_models" / "transformer", dit.parent / "transformer")
    monkeypatch.setenv("H3_MODEL_DIRS", str(models))
    sets = ['1.text_encoder="qwen3vl_32b_minimax_h3_bf16.safetensors"',
            '1.vae="minimax_h3_video_vae_int8_convrot.safetensors"', '1.audio_vae="minimax_h3_audio_vae_fp32.safetensors"',
            '1.model_path="tiny-random"', f'2.model_path={json.dumps(str(dit))}', "3.width=64", "3.height=64",
            "5.steps=3", '2.actor_name="new:h3_dit"']  # the template's worker, started here if none is
    res = runner.execute(str(runner.EXAMPLES / "h3_t2va.json"), sets=sets, output=str(tmp_path / "out"), quiet=True)
    (video,) = res.videos()
    assert video.stat().st_size > 0
    note = res.timing_payloads()["1"]["stages"][0]["note"]
    assert "text_encoder from file qwen3vl_32b_minimax_h3_bf16.safetensors (plain)" in note
    assert "vae from file minimax_h3_video_vae_int8_convrot.safetensors (int8, dequantised to bfloat16)" in note
    dit_note = res.timing_payloads()["2"]["stages"][0]["note"]  # H3RemoteDiT: the file picked, what it runs as
    runs = "fp8_scaled layers as stored, dequantised per call to bfloat16, pruned AdaLN in fp32"
    assert f"{dit.name}, transformer, precision auto: {runs}" in dit_note, dit_note
    assert str(formats.RELEASED_CONFIG_DIR) not in dit_note, dit_note
    schedule = res.timing_payloads()["5"]["summary"]["schedule"]
    assert schedule.startswith(f"3 sigma points on transformer from {dit.name} ({runs}, sdpa): "), schedule


# ------------------------------------------------------------------------------------------------ partitions
def test_a_file_of_the_other_partition_is_refused_in_one_sentence(tiny_ckpt):
    """t2va's and ref2va's transformers share every tensor name and shape (so do the tiny fixtures'), so only the
    file's name (Comfy-Org's minimax_h3_<workflow>_...) says which it is: a ref2va file picked for transformer, or a
    t2va one for transformer_ref, is refused naming the file and the fix; either is an H3 transformer to the pickers."""
    from remote_worker.b_side import BSide

    ref, t2va = fixture(tiny_ckpt, "transformer_ref:int8_convrot"), fixture(tiny_ckpt, "transformer:int8_convrot")
    assert set(formats.read_safetensors_header(ref)[0]) == set(formats.read_safetensors_header(t2va)[0])
    with pytest.raises(formats.FormatError) as err:
        formats.detect(ref, "transformer")
    assert str(err.value) == (f"{ref.name} is the ref2va transformer (its name says so), picked for partition "
                              "transformer (t2va/fl2va): set partition to transformer_ref for it, or pick a t2va/fl2va "
                              "transformer file for transformer.")
    with pytest.raises(formats.FormatError, match=rf"^{t2va.name} is the t2va transformer .* partition transformer_ref "
                                                  r"\(ref2va\): set partition to transformer for it"):
        formats.detect(t2va, "transformer_ref")
    assert formats.detect(ref, "transformer_ref").subfolder == "transformer_ref"
    assert formats.is_h3_transformer(ref) and formats.is_h3_transformer(t2va)
    with pytest.raises(formats.FormatError, match=f"{ref.name} is the ref2va transformer"):
        BSide(tiny_ckpt, dtype="bfloat16", residency="one", sources={"transformer": str(ref)})


def test_h3remotedit_refuses_a_ref2va_file_as_the_t2va_transformer(local_host, tiny_ckpt, tmp_path, monkeypatch):
    """The t2va template with H3RemoteDiT's model_path set to a ref2va file (partition transformer): the run stops on
    H3RemoteDiT with the sentence, before any request."""
    from comfy_h3_nodes.tools import runner

    models = tmp_path / "models" / "diffusion_models"
    models.mkdir(parents=True)
    ref = models / "minimax_h3_ref2va_int8_convrot.safetensors"
    shutil.copy(fixture(tiny_ckpt, "transformer_ref:int8_convrot"), ref)
    shutil.copytree(tiny_ckpt / "comfy" / "diffusion_models" / "transformer", models / "transformer")
    monkeypatch.setenv("H3_MODEL_DIRS", str(tmp_path / "models"))
    sets = ['1.model_path="tiny-random"', f'2.model_path={json.dumps(str(ref))}', '2.actor_name="new:h3_dit_refpick"',
            "3.width=64", "3.height=64", "5.steps=3"]
    with pytest.raises(Exception) as err:
        runner.execute(str(runner.EXAMPLES / "h3_t2va.json"), sets=sets, output=str(tmp_path / "out"), quiet=True)
    msg = str(err.value)
    print(f"[refused] {type(err.value).__name__}: {msg}")
    assert f"{ref.name} is the ref2va transformer (its name says so), picked for partition transformer" in msg, msg
    assert "set partition to transformer_ref for it" in msg, msg
