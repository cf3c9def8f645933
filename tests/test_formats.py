"""Transformer sources told apart by their headers: the tiny fixtures in every format, and every refusal."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from comfy_h3_nodes.engine.model import formats


def test_tiny_fixtures_exist_in_every_format(tiny_ckpt):
    for name in ("transformer", "transformer_ref"):
        assert (tiny_ckpt / "single_file" / f"{name}.safetensors").is_file()
        assert (tiny_ckpt / "gguf" / f"{name}-Q8_0.gguf").is_file()


@pytest.mark.parametrize("rel,kind", [(".", "folder"), ("single_file/transformer.safetensors", "single_file"),
                                      ("gguf/transformer-Q8_0.gguf", "gguf")])
def test_detect_each_format(tiny_ckpt, rel, kind):
    src = formats.detect(tiny_ckpt / rel, "transformer", model_dir=tiny_ckpt)
    assert src.kind == kind
    assert src.config_root == tiny_ckpt.resolve() and src.subfolder == "transformer"
    assert formats.is_h3_transformer(tiny_ckpt / rel)
    # the diffusers view of every format names exactly the model's tensors, with the model's shapes
    ref = load_file(str(tiny_ckpt / "transformer" / "diffusion_pytorch_model.safetensors"))
    view = formats.diffusers_view(src)
    assert set(view) == set(ref)
    assert all(view[k].numel == ref[k].numel() for k in ref)
    if kind != "gguf":
        assert all(tuple(view[k].shape) == tuple(ref[k].shape) for k in ref)


def test_published_layout_is_what_diffusers_converts(tiny_ckpt):
    """Our writer is the inverse of diffusers' own single-file converter: converting the file gives back the folder's
    weights exactly (bf16-stored ones rounded as bf16 rounds them)."""
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    published = load_file(str(tiny_ckpt / "single_file" / "transformer.safetensors"))
    assert formats.PUBLISHED_MARKER in published and "blocks.0.attn.qkv_proj.weight" in published
    assert published["video_patch_proj.weight"].dtype == torch.float32  # the release's fp32 modules
    assert published["blocks.0.mlp.fc1.weight"].dtype == torch.bfloat16
    config = json.loads((tiny_ckpt / "transformer" / "config.json").read_text())
    converted = convert_minimax_h3_transformer_checkpoint_to_diffusers(dict(published), config)
    ref = load_file(str(tiny_ckpt / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert set(converted) == set(ref)
    for k, v in ref.items():
        assert torch.equal(converted[k], v.to(converted[k].dtype)), k


def test_gguf_header_is_read_without_tensor_data(tiny_ckpt):
    src = formats.detect(tiny_ckpt / "gguf" / "transformer-Q8_0.gguf", model_dir=tiny_ckpt)
    types = src.quant_types()
    assert types.get("Q8_0", 0) >= 1 and "F32" in types and "BF16" in types  # rows of 32 quantize; 1-D stay F32
    t = src.tensors["condition_proj.weight"]
    assert t.shape == (24, 32) and t.dtype == "Q8_0" and t.nbytes == 24 * 34  # one 34-byte block per row
    assert src.metadata.get("general.architecture") == "minimax_h3"


def test_shipped_config_is_the_released_model():
    cfg = json.loads((formats.SHIPPED_CONFIG_ROOT / "transformer" / "config.json").read_text())
    ref = json.loads((formats.SHIPPED_CONFIG_ROOT / "transformer_ref" / "config.json").read_text())
    assert cfg == ref and cfg["num_layers"] == 50 and cfg["hidden_size"] == 5376 and cfg["text_dim"] == 5120
    from comfy_h3_nodes.engine.model import memory_plan

    model = memory_plan.skeleton(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert n == 33_122_992_896 and abs(n * 2 / 2**30 - 61.7) < 0.05  # 61.7 GiB in bf16, as published


def test_single_file_without_a_folder_uses_the_shipped_config(tiny_ckpt, tmp_path):
    f = tmp_path / "x.safetensors"
    shutil.copy(tiny_ckpt / "single_file" / "transformer.safetensors", f)
    src = formats.detect(f, "transformer_ref")
    assert src.config_root == formats.SHIPPED_CONFIG_ROOT and src.subfolder == "transformer_ref"
    # the tiny file is not the released size: the key check says so before any load
    with pytest.raises(formats.FormatError, match="does not match the transformer config"):
        from comfy_h3_nodes.engine.model import memory_plan

        memory_plan.transformer_bytes(src, "bf16")


# ------------------------------------------------------------------------------------------------ refusals
def _tiny_file(path, names, shape=(4, 4)):
    save_file({n: torch.zeros(shape) for n in names}, str(path))
    return path


def test_pruned_is_a_comfy_variant_and_an_incomplete_one_is_refused(tmp_path, tiny_ckpt):
    """Comfy-Org's pruned files are recognised from their header (``adaln_t_table``); one lacking tensors is refused
    before loading, in one sentence naming what is missing."""
    from comfy_h3_nodes.engine.model import memory_plan
    from comfy_h3_nodes.engine.model.tiny_comfy import fixture

    src = formats.detect(fixture(tiny_ckpt, "transformer:pruned_fp8_scaled"), model_dir=tiny_ckpt)
    assert src.kind == "single_file" and src.pruned and src.variant == "fp8_scaled" and src.comfy
    assert "Comfy-Org fp8_scaled, pruned" in src.describe()
    f = _tiny_file(tmp_path / "minimax_h3_fl2va_fp8_scaled_pruned.safetensors",
                   [formats.PUBLISHED_MARKER, "adaln_t_table", "blocks.0.mlp.fc1.weight"])
    src = formats.detect(f, model_dir=tiny_ckpt)
    with pytest.raises(formats.FormatError) as err:
        memory_plan.transformer_bytes(src, "bf16")
    msg = str(err.value)
    assert "does not match the transformer config" in msg and "missing" in msg and msg.count(". ") == 1


def test_refuses_pruned_gguf(tmp_path):
    import gguf

    f = tmp_path / "h3-PRUNED-Q4_0.gguf"
    w = gguf.GGUFWriter(str(f), "minimax_h3")
    for n in (formats.PUBLISHED_MARKER, "adaln_t_table"):
        w.add_tensor(n, np.zeros((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(formats.FormatError, match="pruned MiniMax-H3 GGUF .* pruned .safetensors"):
        formats.detect(f)


def test_refuses_fastvideo_vsa_outside_a_folder(tmp_path, tiny_ckpt):
    """FastH3 (VSA) loads as a diffusers folder (tests/test_fasth3.py); gates in a single file are refused."""
    f = _tiny_file(tmp_path / "fasth3_v1.safetensors",
                   [formats.PUBLISHED_MARKER, "blocks.0.attn.to_gate_compress.weight"])
    with pytest.raises(formats.FormatError, match="FastVideo VSA .* load as a diffusers folder"):
        formats.detect(f)
    # a diffusers folder whose transformer config asks for VSA, without the gates
    folder = tmp_path / "vsa"
    shutil.copytree(tiny_ckpt / "transformer", folder / "transformer")
    (folder / "modular_model_index.json").write_text("{}")
    cfg = json.loads((folder / "transformer" / "config.json").read_text())
    cfg["VSA_sparsity"] = 0.9
    (folder / "transformer" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(formats.FormatError, match="VSA_sparsity"):
        formats.detect(folder, "transformer")


@pytest.mark.parametrize("rel,what", [("text_encoder/model.safetensors", "text encoder"),
                                      ("vae/diffusion_pytorch_model.safetensors", "VAE")])
def test_refuses_foreign_files(tiny_ckpt, rel, what):
    with pytest.raises(formats.FormatError) as err:
        formats.detect(tiny_ckpt / rel)
    msg = str(err.value)
    assert "is not a MiniMax-H3 transformer" in msg and what in msg and formats.PUBLISHED_MARKER in msg
    assert not formats.is_h3_transformer(tiny_ckpt / rel)


def test_refuses_lora_and_other_layouts(tmp_path, tiny_ckpt):
    from comfy_h3_nodes.engine.model.tiny import build_tiny_lora

    lora = build_tiny_lora(tmp_path / "turbo.safetensors")
    with pytest.raises(formats.FormatError, match="LoRA adapter"):
        formats.detect(lora)
    with pytest.raises(formats.FormatError, match="diffusers-named tensors .* checkpoint folder"):
        formats.detect(tiny_ckpt / "transformer" / "diffusion_pytorch_model.safetensors")
    prefixed = _tiny_file(tmp_path / "comfy.safetensors", [formats.COMFY_PREFIX + formats.PUBLISHED_MARKER])
    with pytest.raises(formats.FormatError, match="model.diffusion_model"):
        formats.detect(prefixed)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(formats.FormatError, match="safetensors header"):
        formats.detect(junk)
    with pytest.raises(formats.FormatError, match="neither a folder"):
        formats.detect(tiny_ckpt / "modular_model_index.json")


def test_refuses_a_mismatched_file_before_loading(tmp_path, tiny_ckpt):
    state = load_file(str(tiny_ckpt / "single_file" / "transformer.safetensors"))
    del state["blocks.0.mlp.fc2.weight"]
    state["blocks.0.extra.weight"] = torch.zeros(2, 2)
    f = tmp_path / "broken.safetensors"
    save_file(state, str(f))
    from comfy_h3_nodes.engine.model import memory_plan

    src = formats.detect(f, model_dir=tiny_ckpt)
    with pytest.raises(formats.FormatError, match=r"1 missing .*blocks.0.ff.net.2.weight.*1 unexpected"):
        memory_plan.transformer_bytes(src, "bf16")


def test_q6_k_quantizer_round_trips():
    """The K-quant writer of the fixtures produces blocks gguf's own dequantizer reads back closely."""
    import gguf

    from comfy_h3_nodes.engine.model.tiny import quantize_q6_k

    x = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    q = quantize_q6_k(x).reshape(8, -1)
    assert q.shape == (8, 2 * 210)
    back = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q6_K)
    assert back.shape == x.shape
    assert np.abs(back - x).max() < 0.05 * np.abs(x).max()


def test_catalog_lists_h3_transformer_files_by_their_keys(tiny_ckpt, tmp_path):
    from comfy_h3_nodes.engine.model import catalog
    from comfy_h3_nodes.engine.model.tiny import build_tiny_lora

    root = tmp_path / "models"
    (root / "diffusion_models").mkdir(parents=True)
    (root / "unet").mkdir()
    models, unet = root / "diffusion_models", root / "unet"
    shutil.copy(tiny_ckpt / "single_file" / "transformer.safetensors", models / "renamed.bin.safetensors")
    shutil.copy(tiny_ckpt / "gguf" / "transformer_ref-Q8_0.gguf", unet / "h3-ref.gguf")
    shutil.copy(tiny_ckpt / "vae" / "diffusion_pytorch_model.safetensors", models / "minimax_h3_vae.safetensors")
    build_tiny_lora(root / "diffusion_models" / "minimax_h3_turbo_lora.safetensors")
    shutil.copy(tiny_ckpt / "comfy" / "diffusion_models" / "minimax_h3_t2va_pruned_int8_convrot.safetensors",
                unet / "pruned.safetensors")  # Comfy-Org's pruned variants load now: a choice
    shutil.copy(tiny_ckpt / "comfy" / "text_encoders" / "qwen3vl_h3_bf16.safetensors", models / "te.safetensors")
    shutil.copytree(tiny_ckpt, root / "MiniMax-H3")  # a diffusers folder: its shards are not choices
    found = catalog.find_transformer_files([root])
    assert found == sorted([str(models / "renamed.bin.safetensors"), str(unet / "h3-ref.gguf"),
                            str(unet / "pruned.safetensors")])
