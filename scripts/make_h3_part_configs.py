"""Write the configs of A's parts shipped with the pack (``comfy_h3_nodes/engine/model/h3_configs/released/``):
``text_encoder/config.json`` (Qwen3-VL-32B as MiniMax-H3 uses it: 50 decoder layers, no final norm or lm_head in
Comfy-Org's file, tied embeddings so none is allocated), ``vae/config.json`` and ``audio_vae/config.json`` (diffusers'
class defaults, the released model's; the files' own latent statistics replace the defaults on load),
``tokenizer/tokenizer_config.json`` (Qwen2's special tokens, ids 151643..151668) and ``processor/processor_config.json``
(Qwen3-VL's image geometry: 16 px patches, 2x2 merge, temporal patch 2, mean/std 0.5).

The text values are the released Qwen3-VL-32B's (hidden 5120, FFN 25600, 64 heads x 128, 8 KV heads, vocab 151936,
RoPE theta 5e6 with mrope sections 24/20/20 interleaved; vision: 27 blocks, 1152 wide, 16 heads, deepstack at 8/16/24).
Run from the repository root: ``python scripts/make_h3_part_configs.py``.
"""

from __future__ import annotations

import json
import pathlib

from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

ROOT = pathlib.Path(__file__).resolve().parents[1] / "comfy_h3_nodes" / "engine" / "model" / "h3_configs" / "released"

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
            "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
            "</tool_response>", "<think>", "</think>"]
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def ids():
    return {t: 151643 + i for i, t in enumerate(SPECIALS)}


def text_encoder() -> dict:
    i = ids()
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "image_token_id": i["<|image_pad|>"], "video_token_id": i["<|video_pad|>"],
        "vision_start_token_id": i["<|vision_start|>"], "vision_end_token_id": i["<|vision_end|>"],
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 25600,
            "num_hidden_layers": 50, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
            "tie_last_hidden_states": False, "pad_token_id": i["<|endoftext|>"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                                "mrope_interleaved": True},
        },
        "vision_config": {
            "model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
            "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
            "out_hidden_size": 5120, "deepstack_visual_indexes": [8, 16, 24], "num_position_embeddings": 2304,
            "hidden_act": "gelu_pytorch_tanh",
        },
    }


def tokenizer() -> dict:
    added = {str(v): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": t not in NOT_SPECIAL} for t, v in ids().items()}
    return {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added, "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>", "unk_token": None, "bos_token": None, "model_max_length": 262144,
            "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False}


def processor() -> dict:
    return {"processor_class": "Qwen3VLProcessor",
            "image_processor": {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16,
                                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                                "image_std": [0.5, 0.5, 0.5], "do_resize": True, "do_rescale": True,
                                "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255, "resample": 3,
                                "size": {"shortest_edge": 65536, "longest_edge": 16777216}}}


def main() -> None:
    out = {"text_encoder/config.json": text_encoder(), "tokenizer/tokenizer_config.json": tokenizer(),
           "processor/processor_config.json": processor(),
           "vae/config.json": dict(AutoencoderKLMiniMaxH3().config),
           "audio_vae/config.json": dict(AutoencoderKLMiniMaxH3Audio().config)}
    for rel, data in out.items():
        path = ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {k: (list(v) if isinstance(v, tuple) else v) for k, v in data.items() if k != "_use_default_values"}
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print("wrote", path)


if __name__ == "__main__":
    main()
