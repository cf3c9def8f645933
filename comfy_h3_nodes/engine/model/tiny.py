"""Build a tiny, random MiniMax-H3 checkpoint in the real diffusers modular layout.

Every component is an instance of the real class (diffusers' `MiniMaxH3Transformer3DModel`,
`AutoencoderKLMiniMaxH3`, `AutoencoderKLMiniMaxH3Audio`, `MiniMaxH3Scheduler`, transformers'
`Qwen3VLForConditionalGeneration`, `Qwen2Tokenizer`, `Qwen3VLProcessor`), shrunk so that a whole
`t2va` / `fl2va` / `ref2va` request runs on a CPU in about a second. Nothing is downloaded.

    python -m comfy_h3_nodes.engine.model.tiny OUT_DIR [--seed N]

Layout written (what `ModularPipeline.from_pretrained(OUT_DIR)` reads)::

    modular_model_index.json
    transformer/  transformer_ref/  vae/  audio_vae/  text_encoder/
    tokenizer/  processor/  scheduler/  audio_scheduler/

plus the same two random transformers in the formats users hold (shared/design.md section 8), so tests load each
format through the code a user's file goes through::

    single_file/transformer.safetensors  single_file/transformer_ref.safetensors   published layout (``blocks.N``,
        stacked ``attn.qkv_proj``, ``mlp.fc1`` = [gate; value]); bf16 except the modules the release keeps fp32
    gguf/transformer-Q8_0.gguf  gguf/transformer_ref-Q8_0.gguf   the same names, Q8_0 where a row is a multiple of 32

    gguf/wide/transformer/config.json  gguf/wide/transformer.safetensors  gguf/wide/transformer-Q6_K.gguf
        a K-quant fixture: a wider random transformer (rows of 256, the same text_dim), its config beside the files

The tiny transformer itself gets no K-quant: its widest row is 96 values and a K-quant block holds 256, so a Q4_K/Q6_K
file of it would hold no K-quantized tensor at all. The wide one is Q6_K-quantized by ``quantize_q6_k`` (gguf-py 0.19
only dequantizes K-quants; the writer is checked against gguf's own dequantizer).

The same seed gives byte-identical files, whatever the output folder: the index names the
components by a fixed placeholder repo id (`TINY_REPO_ID`), and diffusers loads every component
whose files are present in the local folder from that folder instead.

The processor is written by hand and carries no video processor, because transformers' video
processors need torchvision. Loading a `Qwen3VLProcessor` without one needs
`ensure_processor_compat()` in the loading process (importing this module does not call it; the
builder does).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from diffusers import (AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler,
                       MiniMaxH3Transformer3DModel)
from diffusers.modular_pipelines import MiniMaxH3Blocks, MiniMaxH3ModularPipeline
from safetensors.torch import save_file
from tokenizers import AddedToken
from transformers import Qwen2Tokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from . import formats
from .compat import ensure_processor_compat
from .split import quiet_weight_norm
from .tiny_comfy import write_comfy_fixtures

__all__ = [
    "TINY_REPO_ID",
    "TINY_SIZES",
    "COMPONENT_NAMES",
    "build_tiny_checkpoint",
    "ensure_processor_compat",
    "main",
]

# Placeholder id recorded in `modular_model_index.json`. It is never contacted as long as the component
# folders sit next to the index (diffusers prefers local files); it deliberately does not name the real
# MiniMaxAI repository, so a missing folder fails instead of pulling 120 GB.
TINY_REPO_ID = "comfy-h3/tiny-minimax-h3"

COMPONENT_NAMES = (
    "transformer",
    "transformer_ref",
    "vae",
    "audio_vae",
    "text_encoder",
    "tokenizer",
    "processor",
    "scheduler",
    "audio_scheduler",
)

# Geometry callers may want to rely on (tests, fixtures).
TINY_SIZES = {
    "text_hidden_size": 32,  # prompt_embeds last dim == transformer text_dim
    "text_num_layers": 51,  # MiniMax-H3 reads hidden_states[50]
    "transformer_hidden_size": 24,
    "transformer_num_heads": 2,  # x 8 channels: two heads, so a DiT group of 2 ranks can split them (Ulysses)
    "transformer_num_layers": 1,
    "video_latent_channels": 24,
    "vae_spatial_compression": 16,
    "vae_temporal_compression": 4,
    "vae_clip_length": 17,
    "audio_latent_channels": 32,
    "audio_hop_length": 4,
    "audio_sampling_rate": 160,  # 40 latents per second, as at real scale
    "video_shift": 12.0,
    "audio_shift": 3.0,
}

# Pipeline configs stored in the index (read back as `pipe.config.<name>`). Real values are 768, 768*1344
# and 2048; the tiny ones keep an accidental size-less request CPU-cheap (t2va default canvas 64x128).
TINY_PIPELINE_CONFIGS = {
    "canvas_short_edge": 64,
    "canvas_max_pixels": 64 * 128,
    "reference_image_short_edge": 64,
}

# The special tokens of the Qwen2/Qwen3-VL vocabulary, in their real relative order.
_SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
_TEXT_VOCAB_SIZE = 272  # 256 bytes + <|endoftext|> + 13 specials = 270, rounded up


# --------------------------------------------------------------------------------------------------
# Components
# --------------------------------------------------------------------------------------------------


def _seeded(seed: int, offset: int):
    """Fork the global RNG and seed it for one component, so components are independent of build order."""
    class _Ctx:
        def __enter__(self):
            self._fork = torch.random.fork_rng(devices=[])
            self._fork.__enter__()
            torch.manual_seed(seed * 1000 + offset)

        def __exit__(self, *exc):
            return self._fork.__exit__(*exc)

    return _Ctx()


#: the tiny transformer. Two heads of 8 in one block (plus the refiner): the shipped templates (832x480x124, 15,100
#: tokens, 49 forwards) then run to an MP4 in about a minute on two CPU cores (attention over the full sequence is most
#: of a step), and ``parallel`` A+B splits the heads over two ranks. More heads: :data:`PARALLEL_TRANSFORMER`.
TINY_TRANSFORMER = dict(
    num_attention_heads=TINY_SIZES["transformer_num_heads"], attention_head_dim=8, hidden_size=24,
    num_layers=TINY_SIZES["transformer_num_layers"], num_refiner_layers=1, ffn_dim=48, in_channels=24,
    audio_in_channels=32, patch_size=(1, 2, 2), text_dim=32, freq_dim=16, time_embed_hidden_dim=32,
    time_embed_dim=16,
    rope_freq_dim=1,  # 2 * 3 * 1 = 6 of the 8 head channels are rotated
    rope_theta=10000.0,
)
#: six heads split over 2 or 3 ranks (Ulysses); still tiny
PARALLEL_TRANSFORMER = dict(num_attention_heads=6, attention_head_dim=16, hidden_size=48, num_layers=2, ffn_dim=96)


def _make_transformer(overrides: dict | None = None):
    return MiniMaxH3Transformer3DModel(**{**TINY_TRANSFORMER, **(overrides or {})}).eval()


def _latent_stats(generator, channels: int) -> tuple[list[float], list[float]]:
    # Non-trivial normalisation stats, so a missing (de)normalisation shows up in tests.
    mean = (torch.randn(channels, generator=generator) * 0.1).tolist()
    std = (1.0 + torch.rand(channels, generator=generator) * 0.5).tolist()
    return [round(v, 6) for v in mean], [round(v, 6) for v in std]


def _make_vae(seed: int):
    mean, std = _latent_stats(torch.Generator().manual_seed(seed * 1000 + 101), 24)
    return AutoencoderKLMiniMaxH3(
        in_channels=3,
        out_channels=3,
        latent_channels=24,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        spatial_downsample_factors=(2, 2, 2, 2),  # 16x
        temporal_downsample_factors=(1, 2, 2, 1),  # 4x
        norm_num_groups=4,
        decoder_num_layers=1,
        decoder_num_attention_heads=2,
        decoder_attention_head_dim=8,
        decoder_num_register_tokens=4,
        decoder_ffn_mult=2,
        clip_length=17,
        token_drop=3,
        latents_mean=tuple(mean),
        latents_std=tuple(std),
    ).eval()


def _make_audio_vae(seed: int):
    mean, std = _latent_stats(torch.Generator().manual_seed(seed * 1000 + 102), 32)
    return AutoencoderKLMiniMaxH3Audio(
        encoder_dim=4,
        encoder_rates=(2, 2),  # hop 4
        latent_dim=128,  # 128 / 2 heads = 64 != 32: exercises the adaptive pooling branch
        latent_channels=32,
        num_attention_heads=2,
        decoder_dim=16,
        decoder_rates=(2, 2),
        decoder_kernel_sizes=(4, 4),
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1, 3),),
        sampling_rate=160,  # 160 / 4 = 40 latents per second, as at real scale
        latents_mean=mean,
        latents_std=std,
    ).eval()


def _make_tokenizer():
    byte_to_unicode = bytes_to_unicode()
    # Byte-level BPE with the 256-symbol byte alphabet and no merges: every UTF-8 byte is one token.
    vocab = {byte_to_unicode[b]: b for b in range(256)}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], model_max_length=32768)  # adds <|endoftext|> = 256
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS], special_tokens=True)
    return tokenizer


def _make_image_processor():
    # Qwen3-VL's geometry (16 px patches, 2x2 merge, temporal patch 2, mean/std 0.5), with a pixel budget that
    # keeps an image at 2x2 .. 4x4 merged tokens.
    return Qwen2VLImageProcessorPil(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def _make_text_encoder(tokenizer, hidden: int = TINY_SIZES["text_hidden_size"]):
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in _SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": _TEXT_VOCAB_SIZE,
            "hidden_size": hidden,
            "intermediate_size": 64,
            "num_hidden_layers": 51,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "max_position_embeddings": 32768,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [4, 2, 2],  # sums to head_dim / 2
                "mrope_interleaved": True,
            },
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    return Qwen3VLForConditionalGeneration(config).eval()


def _write_processor(folder: Path, tokenizer, image_processor) -> None:
    """The `Qwen3VLProcessor` folder, by hand: tokenizer files plus a nested `processor_config.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    config = {
        "image_processor": json.loads(image_processor.to_json_string()),
        "processor_class": "Qwen3VLProcessor",
    }
    with open(folder / "processor_config.json", "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
        handle.write("\n")


def _write_index(out_dir: Path, components: dict) -> None:
    """Write `modular_model_index.json` with diffusers' own serializer, pointing every component at TINY_REPO_ID."""
    pipe = MiniMaxH3ModularPipeline(blocks=MiniMaxH3Blocks())
    pipe.update_components(**components, **TINY_PIPELINE_CONFIGS)
    for name in COMPONENT_NAMES:
        library, class_name, spec = pipe.config[name]
        spec = dict(spec)
        spec["pretrained_model_name_or_path"] = TINY_REPO_ID
        spec["subfolder"] = name
        spec["variant"] = None
        spec["revision"] = None
        pipe.register_to_config(**{name: (library, class_name, spec)})
    pipe.save_config(save_directory=str(out_dir))


def build_tiny_checkpoint(out_dir, seed: int = 0, formats: bool = True, transformer: dict | None = None,
                          text_hidden: int = TINY_SIZES["text_hidden_size"]) -> Path:
    """Write the tiny random checkpoint into `out_dir` (created; existing component folders are replaced).

    Returns the checkpoint folder as a `Path`. Deterministic: the same `seed` writes byte-identical files.
    ``formats`` also writes ``single_file/``, ``gguf/`` (the same transformers in the other formats) and ``comfy/``
    (every Comfy-Org layout of the transformers, text encoder and VAEs: :mod:`.tiny_comfy`).
    ``transformer`` overrides the transformers' config (e.g. :data:`PARALLEL_TRANSFORMER`); ``text_hidden`` is the text
    encoder's width, the last dimension of ``prompt_embeds`` (the real model's is 5120: give the transformer that
    ``text_dim`` too).
    """
    with quiet_weight_norm():  # the audio VAE warns on every construction (split.quiet_weight_norm)
        return _build(out_dir, seed, formats, transformer, text_hidden)


def _build(out_dir, seed: int, formats: bool, transformer: dict | None, text_hidden: int) -> Path:
    ensure_processor_compat()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (*COMPONENT_NAMES, "single_file", "gguf", "comfy"):
        shutil.rmtree(out_dir / name, ignore_errors=True)

    with torch.no_grad():
        overrides = transformer
        with _seeded(seed, 1):
            transformer = _make_transformer(overrides)
        with _seeded(seed, 2):
            # The `ref2va` partition: same architecture, its own weights, so a test can tell which one ran.
            transformer_ref = _make_transformer(overrides)
        with _seeded(seed, 3):
            vae = _make_vae(seed)
        with _seeded(seed, 4):
            audio_vae = _make_audio_vae(seed)
        tokenizer = _make_tokenizer()
        image_processor = _make_image_processor()
        with _seeded(seed, 5):
            text_encoder = _make_text_encoder(tokenizer, text_hidden)

    scheduler = MiniMaxH3Scheduler(shift=TINY_SIZES["video_shift"])
    audio_scheduler = MiniMaxH3Scheduler(shift=TINY_SIZES["audio_shift"])
    processor = Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)

    for name, model in (
        ("transformer", transformer),
        ("transformer_ref", transformer_ref),
        ("vae", vae),
        ("audio_vae", audio_vae),
        ("text_encoder", text_encoder),
        ("scheduler", scheduler),
        ("audio_scheduler", audio_scheduler),
        ("tokenizer", tokenizer),
    ):
        model.save_pretrained(str(out_dir / name))
    _write_processor(out_dir / "processor", tokenizer, image_processor)

    _write_index(
        out_dir,
        {
            "transformer": transformer,
            "transformer_ref": transformer_ref,
            "vae": vae,
            "audio_vae": audio_vae,
            "text_encoder": text_encoder,
            "tokenizer": tokenizer,
            "processor": processor,
            "scheduler": scheduler,
            "audio_scheduler": audio_scheduler,
        },
    )
    if formats:
        for name, model in (("transformer", transformer), ("transformer_ref", transformer_ref)):
            write_single_file(model, out_dir / "single_file" / f"{name}.safetensors")
            write_gguf(model, out_dir / "gguf" / f"{name}-Q8_0.gguf", "Q8_0")
        with torch.no_grad(), _seeded(seed, 6):
            wide = _make_wide_transformer()
        wide.save_config(str(out_dir / "gguf" / "wide" / "transformer"))
        write_single_file(wide, out_dir / "gguf" / "wide" / "transformer.safetensors")
        write_gguf(wide, out_dir / "gguf" / "wide" / "transformer-Q6_K.gguf", "Q6_K")
        write_comfy_fixtures(out_dir, {"transformer": transformer, "transformer_ref": transformer_ref,  # comfy/
                                       "text_encoder": text_encoder, "vae": vae, "audio_vae": audio_vae},
                             published_state_dict)
    return out_dir


def _make_wide_transformer():
    """The K-quant fixture's transformer: every Linear outside the release's fp32 modules reads rows of 256 values
    (one Q6_K block) except the text projection (text_dim 32, as the tiny text encoder gives)."""
    return MiniMaxH3Transformer3DModel(
        num_attention_heads=1, attention_head_dim=256, hidden_size=256, num_layers=1, num_refiner_layers=1,
        ffn_dim=256, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=32, freq_dim=16,
        time_embed_hidden_dim=32, time_embed_dim=256, rope_freq_dim=2, rope_theta=10000.0,
    ).eval()


# --------------------------------------------------------------------------------------------------
# Other formats of the same transformer
# --------------------------------------------------------------------------------------------------


def published_state_dict(model) -> dict:
    """The transformer's weights in the published single-file layout (the inverse of diffusers' single-file
    converter): ``to_q/to_k/to_v`` stacked into ``attn.qkv_proj``, ``ff.net.0.proj`` stored as [gate; value], names
    as published. Values are unchanged (fp32 for the tiny model)."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    out = {}
    for name in sorted(state):
        value = state[name]
        if name.endswith(".attn.to_q.weight"):
            base = name[: -len(".attn.to_q.weight")]
            qkv = torch.cat([state[f"{base}.attn.to_{p}.weight"] for p in "qkv"], dim=0)
            out[formats.diffusers_to_published_name(base) + formats.QKV] = qkv
            continue
        if name.endswith((".attn.to_k.weight", ".attn.to_v.weight")):
            continue
        if name.endswith(".ff.net.0.proj.weight"):
            value_half, gate = torch.chunk(value, 2, dim=0)  # diffusers' SwiGLU reads [value; gate]
            value = torch.cat([gate, value_half], dim=0)
        out[formats.diffusers_to_published_name(name)] = value
    return {k: out[k].contiguous() for k in sorted(out)}


def _stored_dtype(published_name: str):
    """The release's mixed precision: fp32 for the patch projections, timestep MLP and output heads, else bf16."""
    return torch.float32 if published_name.startswith(formats.PUBLISHED_FP32_PREFIXES) else torch.bfloat16


def write_single_file(model, path) -> Path:
    """One ``.safetensors`` in the published layout and precision (what Comfy-Org's ``*_bf16`` files hold)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(_stored_dtype(k)).contiguous() for k, v in published_state_dict(model).items()}
    save_file(state, str(path), metadata={"format": "pt"})
    return path


def quantize_q6_k(rows):
    """Q6_K blocks (ggml's layout: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 sub-block scales, one
    fp16 super-scale per 256 values) of a float32 ``[n, k]`` array, ``k`` a multiple of 256. A plain round-to-nearest
    quantizer (ggml's own searches its scales; any valid encoding dequantizes the same way)."""
    x = np.asarray(rows, dtype=np.float32).reshape(-1, 256)
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(axis=2) / 31.0  # per 16 values
    d = (np.abs(scale).max(axis=1) / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32[:, None] > 0, np.round(scale / d32[:, None]), 0).clip(-128, 127).astype(np.int8)
        eff = d32[:, None] * sc.astype(np.float32)
        q = np.where(eff[:, :, None] != 0, np.round(sub / eff[:, :, None]), 0).clip(-32, 31).astype(np.int16)
    u = (q + 32).astype(np.uint8).reshape(n, 2, 128)  # two halves of 128 values
    low, high = u & 0x0F, u >> 4
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(n, 128)
    hq = high.reshape(n, 2, 4, 32)
    qh = (hq[:, :, 0] | (hq[:, :, 1] << 2) | (hq[:, :, 2] << 4) | (hq[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(n, 1).view(np.uint8)], axis=1)


def write_gguf(model, path, qtype: str = "Q8_0") -> Path:
    """An unpruned GGUF of the transformer in the published layout: ``qtype`` where a row fits the block, F32 for 1-D
    tensors and the release's fp32 modules, BF16 for the rest (see ``formats.gguf_type_for``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "minimax_h3")
    writer.add_name("comfy-h3 tiny MiniMax-H3 transformer")
    writer.add_file_type({"Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                          "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K}[qtype])
    for name, value in published_state_dict(model).items():
        arr = value.float().numpy()
        kind = formats.gguf_type_for(name, arr.shape, qtype)
        qt = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            writer.add_tensor(name, arr.astype(np.float32))
        elif kind == "Q6_K":
            writer.add_tensor(name, quantize_q6_k(arr).reshape(*arr.shape[:-1], -1), raw_dtype=qt)
        else:
            writer.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)  # uint8 bytes, shape from the bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


#: Linear modules of the tiny transformer a tiny LoRA adapts: (module suffix, out_features, in_features).
_LORA_TARGETS = (("attn.to_q", 16, 24), ("attn.to_v", 16, 24), ("attn.to_out.0", 24, 16), ("ff.net.2", 24, 48))


def build_tiny_lora(out_path, seed: int = 0, rank: int = 4, steps: int | None = None, shift: float | None = None,
                    audio_shift: float | None = None) -> Path:
    """A random LoRA (diffusers layout, ``transformer.``-prefixed) for the tiny transformer, with an optional
    sidecar ``<stem>.json`` giving the schedule it was "trained" for (what turbo LoRAs ship)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    state = {}
    for block in range(TINY_SIZES["transformer_num_layers"]):
        for mod, out_f, in_f in _LORA_TARGETS:
            key = f"transformer.transformer_blocks.{block}.{mod}"
            state[f"{key}.lora_A.weight"] = (torch.randn(rank, in_f, generator=g) * 0.3).contiguous()
            state[f"{key}.lora_B.weight"] = (torch.randn(out_f, rank, generator=g) * 0.3).contiguous()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out))
    sidecar = {k: v for k, v in (("steps", steps), ("shift", shift), ("audio_shift", audio_shift)) if v is not None}
    side = out.with_suffix(".json")
    if sidecar:
        side.write_text(json.dumps(sidecar, indent=1) + "\n")
    elif side.exists():
        side.unlink()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m comfy_h3_nodes.engine.model.tiny",
        description="Write a tiny random MiniMax-H3 checkpoint (diffusers modular layout) for tests.",
    )
    parser.add_argument("out_dir", help="folder to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (same seed -> identical files)")
    parser.add_argument("--lora", metavar="FILE", help="also write a tiny random LoRA for the tiny transformer")
    parser.add_argument("--lora-steps", type=int, help="steps recorded in the LoRA's sidecar config")
    parser.add_argument("--lora-shift", type=float, help="video sigma shift recorded in the LoRA's sidecar config")
    args = parser.parse_args(argv)
    path = build_tiny_checkpoint(args.out_dir, seed=args.seed)
    print(path)
    if args.lora:
        print(build_tiny_lora(args.lora, seed=args.seed, steps=args.lora_steps, shift=args.lora_shift))
    return 0


if __name__ == "__main__":
    sys.exit(main())
