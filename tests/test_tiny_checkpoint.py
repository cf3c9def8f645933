"""The tiny random MiniMax-H3 checkpoint: layout, determinism, loading, and one request per workflow."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from comfy_h3_nodes.engine.model.tiny import COMPONENT_NAMES, TINY_REPO_ID, TINY_SIZES, build_tiny_checkpoint, ensure_processor_compat


def _digests(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


def test_layout(checkpoint):
    assert isinstance(checkpoint, Path)
    assert (checkpoint / "modular_model_index.json").is_file()
    for name in COMPONENT_NAMES:
        assert (checkpoint / name).is_dir(), name
    for name in ("transformer", "transformer_ref", "vae", "audio_vae"):
        assert (checkpoint / name / "diffusion_pytorch_model.safetensors").is_file()
    assert (checkpoint / "text_encoder" / "model.safetensors").is_file()
    assert (checkpoint / "processor" / "processor_config.json").is_file()
    assert (checkpoint / "tokenizer" / "tokenizer.json").is_file()

    import json

    index = json.loads((checkpoint / "modular_model_index.json").read_text())
    assert index["_class_name"] == "MiniMaxH3ModularPipeline"
    assert index["_blocks_class_name"] == "MiniMaxH3Blocks"
    for name in COMPONENT_NAMES:
        library, class_name, spec = index[name]
        assert spec["subfolder"] == name
        assert spec["pretrained_model_name_or_path"] == TINY_REPO_ID


def test_same_seed_is_byte_identical(checkpoint, tmp_path):
    again = build_tiny_checkpoint(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(checkpoint)

    other = _digests(build_tiny_checkpoint(tmp_path / "other", seed=1))
    weights = "transformer/diffusion_pytorch_model.safetensors"
    assert other[weights] != _digests(checkpoint)[weights]
    # The two transformer partitions are distinct models.
    assert other[weights] != other["transformer_ref/diffusion_pytorch_model.safetensors"]


def test_from_pretrained_loads_every_component(checkpoint):
    from diffusers import ModularPipeline

    ensure_processor_compat()
    pipe = ModularPipeline.from_pretrained(str(checkpoint))
    assert type(pipe).__name__ == "MiniMaxH3ModularPipeline"
    pipe.load_components(dtype=torch.bfloat16)
    missing = [name for name in COMPONENT_NAMES if getattr(pipe, name, None) is None]
    assert not missing, f"components left None: {missing}"

    assert pipe.text_encoder.config.text_config.num_hidden_layers == TINY_SIZES["text_num_layers"]
    assert pipe.transformer.config.text_dim == pipe.text_encoder.config.text_config.hidden_size
    assert pipe.vae.spatial_compression_ratio == TINY_SIZES["vae_spatial_compression"]
    assert pipe.vae_latents_per_chunk == 5 and pipe.vae_frames_per_chunk == 17
    assert pipe.audio_vae.hop_length == TINY_SIZES["audio_hop_length"]
    assert pipe.audio_sampling_rate == TINY_SIZES["audio_sampling_rate"]
    assert pipe.scheduler.shift == 12.0 and pipe.audio_scheduler.shift == 3.0
    assert pipe.processor.video_processor is None
    # `dtype=` keeps the modules the checkpoint pins to float32.
    assert pipe.transformer.proj_in.weight.dtype == torch.float32
    assert pipe.transformer.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16
    assert pipe.audio_vae.dtype == torch.float32


@pytest.mark.parametrize("workflow", ["t2va", "fl2va", "ref2va"])
def test_workflow_runs(checkpoint, workflow):
    from PIL import Image

    from diffusers.modular_pipelines import MiniMaxH3Blocks
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3AudioReference, MiniMaxH3ImageReference

    ensure_processor_compat()
    torch.set_num_threads(1)
    pipe = MiniMaxH3Blocks().get_workflow(workflow).init_pipeline(str(checkpoint))
    pipe.load_components(dtype=torch.float32)
    expected = "transformer_ref" if workflow == "ref2va" else "transformer"
    assert getattr(pipe, expected) is not None
    assert not hasattr(pipe, "transformer" if workflow == "ref2va" else "transformer_ref")

    rng = np.random.default_rng(0)
    image = Image.fromarray((rng.random((48, 80, 3)) * 255).astype("uint8"))
    inputs = dict(
        prompt="a robot dancing",
        height=64,
        width=64,
        num_frames=124,
        num_inference_steps=2,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="pt",
    )
    if workflow == "fl2va":
        inputs.update(image=image, last_image=image)
    elif workflow == "ref2va":
        audio = torch.rand(2, 3 * TINY_SIZES["audio_sampling_rate"], generator=torch.Generator().manual_seed(1))
        inputs["references"] = [
            MiniMaxH3ImageReference(image=image),
            MiniMaxH3AudioReference(audio=audio * 2 - 1, sample_rate=TINY_SIZES["audio_sampling_rate"]),
        ]
    state = pipe(**inputs)

    videos, audio = state.get("videos"), state.get("audio")
    assert videos.shape == (1, 124, 3, 64, 64) and videos.dtype == torch.float32
    assert 0.0 <= float(videos.min()) and float(videos.max()) <= 1.0
    assert audio.shape == (1, 2, 207 * TINY_SIZES["audio_hop_length"]) and audio.dtype == torch.float32
    assert state.get("sampling_rate") == TINY_SIZES["audio_sampling_rate"]
    assert state.get("latents").shape == (1, 24, 37, 4, 4)
    assert state.get("audio_latents").shape == (2, 32, 207)
