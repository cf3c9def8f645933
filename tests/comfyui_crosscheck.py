"""Cross-implementation check of the pack's Comfy-Org file loading against ComfyUI's own MiniMax-H3 modules.

Run by ``tests/test_comfyui_integration.py`` (``COMFYUI_DIR``) in ComfyUI's Python, with ComfyUI's source and this
repository on ``sys.path``: ``python tests/comfyui_crosscheck.py OUT_DIR``. It builds ComfyUI's H3 transformer (pruned
and not), text encoder, video VAE and audio VAE at tiny sizes with random weights, saves their weights in each file
layout -- quantised layers quantised and written by ComfyUI's own mixed-precision ops (``comfy.ops``,
``comfy.quant_ops``, which run comfy-kitchen), i.e. exactly what its ``state_dict`` saves -- loads those files through
the pack (``comfy_dit.load``, ``comfy_files.load_part``) and compares with ComfyUI's forward on the same files (the
quantised ones loaded by ComfyUI's own loader): one transformer step, a video and an audio VAE decode, the text
encoder's conditioning hidden state. Everything in fp32 on CPU. Prints one JSON object: per check, the largest
absolute difference and the reference's largest magnitude; ``OUT_DIR`` keeps the files.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

COMFY = pathlib.Path(os.environ["COMFYUI_DIR"]).resolve()
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(COMFY), str(REPO)]
OUT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/h3_crosscheck")
sys.argv = [sys.argv[0], "--cpu"]  # ComfyUI's own argument parser reads these

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import comfy.ops  # noqa: E402
import comfy.quant_ops  # noqa: E402
from comfy.ldm.minimax import audio_vae as c_avae  # noqa: E402
from comfy.ldm.minimax import model as c_dit  # noqa: E402
from comfy.ldm.minimax import vae as c_vae  # noqa: E402

from comfy_h3_nodes.engine.model import comfy_dit, comfy_files, formats  # noqa: E402

torch.manual_seed(0)
OUT.mkdir(parents=True, exist_ok=True)
F32 = torch.float32
RESULTS: dict[str, dict] = {}
QUANT = {"fp8_scaled": ("float8_e4m3fn", "TensorCoreFP8E4M3Layout", {}),
         "int8_convrot": ("int8_tensorwise", "TensorWiseINT8Layout", {"per_channel": True, "convrot": True,
                                                                      "convrot_groupsize": 16}),
         "nvfp4": ("nvfp4", "TensorCoreNVFP4Layout", {})}


def record(name: str, ours: torch.Tensor, ref: torch.Tensor) -> None:
    RESULTS[name] = {"max_abs_diff": float((ours.float() - ref.float()).abs().max()),
                     "ref_max_abs": float(ref.float().abs().max()), "shape": list(ref.shape)}


def randomize(module, scale=0.2, keep=()):
    sd = {}
    for k, v in module.state_dict().items():
        if any(s in k for s in keep):
            sd[k] = v
        elif k.endswith(("norm.weight", "norm1.weight", "norm2.weight", "layernorm.weight")) or ".norm" in k and \
                k.endswith("weight"):
            sd[k] = 1 + 0.1 * torch.randn_like(v.float()).to(v.dtype)
        else:
            sd[k] = (torch.randn_like(v.float()) * scale).to(v.dtype)
    return sd


#: the formats ComfyUI emulates on a CPU (``comfy.ops.pick_operations`` without fp8/nvfp4/mxfp8 compute): their layers
#: dequantise per call; int8 runs kitchen's weight-only int8 linear
CPU_DISABLED = {"float8_e4m3fn", "float8_e5m2", "nvfp4", "mxfp8"}


def saved_reference(build, sd: dict, layers: list, variant: str, path):
    """ComfyUI's module with the weights ``sd``, saved at ``path`` as Comfy-Org ships ``variant`` (fp32 as it is,
    else quantised the way ComfyUI reads it back); the module is the reference the pack's load is compared with."""
    if variant == "fp32":
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
        ref = build()
        ref.load_state_dict(sd)
    else:
        ref, _ = quantized_file(build, sd, layers, variant, path)
    return ref.requires_grad_(False)


def quantized_file(build, sd: dict, layers, variant: str, path: pathlib.Path):
    """``sd`` with ``layers`` quantised by ComfyUI: a model of its mixed-precision ops (as ComfyUI builds them on a
    CPU) holding each as ComfyUI's QuantizedTensor, saved through ComfyUI's own ``state_dict`` to ``path``; returns
    ComfyUI's model (the reference) and that state dict."""
    fmt, layout, kw = QUANT[variant]
    ops = comfy.ops.mixed_precision_ops({}, compute_dtype=F32, disabled=CPU_DISABLED)
    qsd = dict(sd)
    for layer in layers:
        qt = comfy.quant_ops.QuantizedTensor.from_float(sd[f"{layer}.weight"].float(), layout, **kw)
        del qsd[f"{layer}.weight"]
        qsd.update(qt.state_dict(f"{layer}.weight"))
        qsd[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps(
            {"format": fmt, **({"convrot": True, "convrot_groupsize": kw["convrot_groupsize"]}
                               if kw.get("convrot") else {})}).encode()), dtype=torch.uint8)
    model = build(ops)
    model.load_state_dict(qsd, strict=False)
    saved = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(saved, str(path))
    return model, saved


def dequantised_reference(build, sd: dict, qmodel, layers):
    """ComfyUI's module holding ComfyUI's own dequantisation of the quantised layers it loaded (``QuantizedTensor
    .dequantize``): the reference of A, which dequantises at load, where ComfyUI's int8 kernels would also quantise
    the activations."""
    plain = dict(sd)
    for layer in layers:
        plain[f"{layer}.weight"] = qmodel.get_submodule(layer).weight.dequantize().float()
    model = build()
    model.load_state_dict(plain)
    return model.requires_grad_(False)


# ---------------------------------------------------------------------------------------------------- DiT
H, HEADS, HD, FFN, TD, L, G, K = 64, 2, 32, 96, 48, 5, 11, 8
DIT_KW = dict(hidden_size=H, num_layers=2, token_refiner_num_layers=1, num_attention_heads=HEADS,
              attention_head_dim=HD, ffn_hidden_size=FFN, text_dim=TD, timestep_input_dim=256,
              time_embed_hidden_size=H, time_embed_dim=32, rope_inv_freq_len=4)
DIFFUSERS_CFG = dict(num_attention_heads=HEADS, attention_head_dim=HD, hidden_size=H, num_layers=2,
                     num_refiner_layers=1, ffn_dim=FFN, text_dim=TD, freq_dim=256, time_embed_hidden_dim=H,
                     time_embed_dim=32, rope_freq_dim=4, in_channels=24, audio_in_channels=32, patch_size=[1, 2, 2],
                     rope_theta=10000.0, _class_name="MiniMaxH3Transformer3DModel")


def dit_model(pruned: bool, ops=comfy.ops.manual_cast):
    kw = dict(DIT_KW, **({"adaln_curve_grid": G, "time_embed_dim": K} if pruned else {}))
    return c_dit.MiniMaxH3Model(dtype=F32, device="cpu", operations=ops, **kw)


def dit_inputs():
    T, Hl, Wl, TA = 2, 4, 6, 3
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, 24, T, Hl, Wl, generator=g), torch.randn(1, 32, 2, TA, generator=g),
            torch.randn(1, L, TD, generator=g), 0.7)


def pack_forward(path: pathlib.Path, video, audio, ctx, sigma):
    """The pack's model of the file, one step in diffusers' conventions, returned as ComfyUI returns it."""
    src = formats.detect(path, "transformer")
    model = comfy_dit.load(src, F32) if src.comfy else None
    if model is None:  # the plain published layout: the pack's single-file path is diffusers' own
        from remote_worker.b_side import load_transformer_file

        model = load_transformer_file(src, "float32", "cpu")
    lay = c_dit.PackedLayout(L, video.shape[2], video.shape[3], video.shape[4], audio.shape[-1])
    t_v, t_a = 1 - sigma, float(1 - c_dit.time_shift_sigma(torch.tensor(sigma), 12.0, 3.0))
    S = lay.seq_len
    tags, tidx, idx = torch.empty(S, dtype=torch.long), torch.empty(S, dtype=torch.long), {}
    for a, b, kind in lay.segments:
        tags[a:b] = {"text": 1, "audio": 2, "video": 0}[kind]
        tidx[a:b] = 1 if kind == "audio" else 0
        idx[kind] = torch.arange(a, b)
    with torch.inference_mode():
        res = model(hidden_states=c_dit.patchify_video(video)[None], audio_hidden_states=c_dit.pack_audio(audio)[None],
                    encoder_hidden_states=ctx, timestep=torch.tensor([t_v, t_a]), timestep_indices=tidx,
                    token_tags=tags, position_ids=lay.position_ids.float(), video_indices=idx["video"],
                    audio_indices=idx["audio"], text_indices=idx["text"])
    return res.sample[0], res.audio_sample[0]


def check_dit():
    video, audio, ctx, sigma = dit_inputs()
    for pruned in (False, True):
        base = dit_model(pruned)
        sd = randomize(base)
        sd["rope.inv_freq"] = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=F32) / 8))
        folder = OUT / ("dit_pruned" if pruned else "dit")
        (folder / "transformer").mkdir(parents=True, exist_ok=True)
        cfg = dict(DIFFUSERS_CFG)
        (folder / "transformer" / "config.json").write_text(json.dumps(cfg))
        layers = [k[: -len(".weight")] for k in sd if k.endswith(".weight") and (
            ".attn.qkv_proj" in k or ".attn.out_proj" in k or ".mlp.fc" in k or k == "condition_proj.weight")]
        variants = ["bf16"] + (["fp8_scaled", "int8_convrot"] if pruned else ["int8_convrot"])
        for variant in variants:
            path = folder / f"minimax_h3_t2va_{'pruned_' if pruned else ''}{variant}.safetensors"
            if variant == "bf16":  # plain (fp32 here, to compare at full precision)
                save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
                ref_model = dit_model(pruned)
                ref_model.load_state_dict(sd)
            else:
                ref_model, _ = quantized_file(lambda ops: dit_model(pruned, ops), sd, layers, variant, path)
            ref_model.requires_grad_(False)
            with torch.inference_mode():
                out = ref_model.forward([video, audio], torch.tensor([sigma * 1000.0]), ctx)
            v, a = pack_forward(path, video, audio, ctx, sigma)
            name = f"dit_{'pruned_' if pruned else ''}{variant}"
            record(name + "_video", v, c_dit.patchify_video(-out[0]))
            record(name + "_audio", a, c_dit.pack_audio(-out[1]))


# ---------------------------------------------------------------------------------------------------- VAEs
def check_video_vae():
    from diffusers import AutoencoderKLMiniMaxH3

    def build(ops=comfy.ops.manual_cast):
        m = c_vae.MiniMaxH3VideoVAE(ch=32, ch_mult=(1, 2, 2, 2, 2, 2), operations=ops)
        m.decoder = c_vae.ViT3DDecoder(patch_size=16, patch_size_t=4, in_channels=24, out_channels=3, num_layers=2,
                                       heads=2, dim_head=64, operations=ops)
        return m

    base = build()
    sd = randomize(base, 0.05, keep=("latents_mean", "latents_std"))
    folder = OUT / "video_vae"
    cfg = dict(AutoencoderKLMiniMaxH3(block_out_channels=(32, 64, 64, 64, 64, 64), decoder_num_layers=2,
                                      decoder_num_attention_heads=2, decoder_attention_head_dim=64).config)
    (folder / "vae").mkdir(parents=True, exist_ok=True)
    (folder / "vae" / "config.json").write_text(json.dumps({k: (list(v) if isinstance(v, tuple) else v)
                                                            for k, v in cfg.items() if not k.startswith("_")}))
    layers = [k[: -len(".weight")] for k in sd if k.startswith("decoder.transformer_blocks.") and k.endswith(".weight")
              and (".attn.to_" in k or ".ff.w" in k)]
    z = torch.randn(1, 24, 3, 2, 2, generator=torch.Generator().manual_seed(2))
    x = torch.randn(1, 3, 17, 32, 32, generator=torch.Generator().manual_seed(3))
    for variant in ("fp32", "int8_convrot"):
        path = folder / f"minimax_h3_video_vae_{variant}.safetensors"
        ref = saved_reference(build, sd, layers, variant, path)
        ours = comfy_files.load_part(comfy_files.detect_part(path, "vae"), F32)
        with torch.inference_mode():
            record(f"video_vae_{variant}_decode", ours.decoder(ours.post_quant_conv(z)), ref._decode_pixels(z))
            if variant != "fp32":
                deq = dequantised_reference(build, sd, ref, layers)
                record(f"video_vae_{variant}_decode_vs_comfy_dequantised", ours.decoder(ours.post_quant_conv(z)),
                       deq._decode_pixels(z))
            if variant == "fp32":
                record("video_vae_fp32_encode", ours.quant_conv(ours.encoder(x)), ref._encode_moments(x))


def check_audio_vae():
    ref = c_avae.MiniMaxH3AudioVAE(encoder_dim=4, latent_dim=64, decoder_dim=256, vae_latent_channels=32)
    sd = {k: (v if k.endswith("filter") or k in ("latents_mean", "latents_std") else torch.randn_like(v) * 0.1)
          for k, v in ref.state_dict().items()}
    ref.load_state_dict(sd)
    ref.requires_grad_(False)
    folder = OUT / "audio_vae"
    (folder / "audio_vae").mkdir(parents=True, exist_ok=True)
    from diffusers import AutoencoderKLMiniMaxH3Audio

    cfg = dict(AutoencoderKLMiniMaxH3Audio(encoder_dim=4, latent_dim=64, decoder_dim=256, latent_channels=32).config)
    (folder / "audio_vae" / "config.json").write_text(json.dumps({k: (list(v) if isinstance(v, tuple) else v)
                                                                  for k, v in cfg.items() if not k.startswith("_")}))
    path = folder / "minimax_h3_audio_vae_fp32.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    ours = comfy_files.load_part(comfy_files.detect_part(path, "audio_vae"), F32)
    z = torch.randn(1, 32, 3, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        record("audio_vae_fp32_decode", ours.decoder(ours.dec_in_proj(z)), ref.decoder(ref.dec_in_proj(z)))


# ---------------------------------------------------------------------------------------------------- TE
def check_text_encoder():
    import comfy.text_encoders.llama as c_llama
    import comfy.text_encoders.qwen3vl as c_q3
    from comfy.text_encoders.minimax import MiniMaxQwen3VL

    saved = (dict(c_q3.QWEN3VL_VISION["qwen3vl_32b"]), dict(c_q3.QWEN3VL_VISION_COMMON),
             c_llama.Qwen3VL_32BConfig.head_dim, c_llama.Qwen3VL_32BConfig.rope_dims)
    c_q3.QWEN3VL_VISION["qwen3vl_32b"] = dict(hidden_size=32, intermediate_size=48, depth=3,
                                              deepstack_visual_indexes=[0, 1, 2])
    c_q3.QWEN3VL_VISION_COMMON["num_heads"] = 2
    c_q3.QWEN3VL_VISION_COMMON["num_position_embeddings"] = 16
    c_llama.Qwen3VL_32BConfig.head_dim = 16
    c_llama.Qwen3VL_32BConfig.rope_dims = [2, 3, 3]
    try:
        _check_text_encoder(MiniMaxQwen3VL)
    finally:  # the released-size check builds ComfyUI's own sizes
        c_q3.QWEN3VL_VISION["qwen3vl_32b"], common, c_llama.Qwen3VL_32BConfig.head_dim, \
            c_llama.Qwen3VL_32BConfig.rope_dims = saved
        c_q3.QWEN3VL_VISION_COMMON.clear()
        c_q3.QWEN3VL_VISION_COMMON.update(common)


def _check_text_encoder(MiniMaxQwen3VL):
    te_cfg = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=50, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128)

    def build(ops=comfy.ops.manual_cast):
        return MiniMaxQwen3VL(dict(te_cfg), F32, "cpu", ops)

    base = build()
    sd = randomize(base, 0.1)
    folder = OUT / "text_encoder"
    (folder / "text_encoder").mkdir(parents=True, exist_ok=True)
    hf_cfg = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
              "tie_word_embeddings": True,
              "text_config": dict(te_cfg, head_dim=16, rope_theta=5e6, rms_norm_eps=1e-6,
                                  rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                   "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
              "vision_config": dict(hidden_size=32, intermediate_size=48, depth=3, num_heads=2, out_hidden_size=64,
                                    deepstack_visual_indexes=[0, 1, 2], num_position_embeddings=16)}
    (folder / "text_encoder" / "config.json").write_text(json.dumps(hf_cfg))
    layers = [k[: -len(".weight")] for k in sd if k.startswith("model.layers.") and k.endswith("_proj.weight")]
    ids = torch.tensor([[3, 17, 99, 5, 42, 7]])
    vocab = [str(COMFY / "comfy" / "text_encoders" / "qwen25_tokenizer")]
    for variant in ("fp32", "int8_convrot", "nvfp4"):
        path = folder / f"qwen3vl_32b_minimax_h3_{variant}.safetensors"
        ref = saved_reference(build, sd, layers, variant, path)
        ours = comfy_files.load_part(comfy_files.detect_part(path, "text_encoder", tokenizer_dirs=vocab), F32)
        with torch.inference_mode():
            x, _ = ref(ids)
            hs = ours.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True,
                            use_cache=False).hidden_states[comfy_files.TEXT_LAYER]
            record(f"text_encoder_{variant}_hidden_states_50", hs, x)
            if variant != "fp32":
                x2, _ = dequantised_reference(build, sd, ref, layers)(ids)
                record(f"text_encoder_{variant}_hidden_states_50_vs_comfy_dequantised", hs, x2)


# ---------------------------------------------------------------------------------------------------- released size
def _header(module) -> dict:
    """A meta module's state dict as a file header would describe it (names, shapes; bytes left 0)."""
    return {k: formats.TensorInfo(k, tuple(v.shape), "BF16", 0) for k, v in module.state_dict().items()}


def check_released_layouts():
    """ComfyUI's own modules at the released size (on the meta device: shapes only) against the configs the pack
    ships: every tensor a Comfy-Org file of that part holds must fill exactly the model the shipped config builds.
    Records ``mismatch`` (empty when it fits)."""
    from comfy.text_encoders.minimax import MiniMaxQwen3VL

    from comfy_h3_nodes.engine.model import memory_plan

    full = dict(hidden_size=5376, num_layers=50, token_refiner_num_layers=2, num_attention_heads=56,
                attention_head_dim=128, ffn_hidden_size=14336, text_dim=5120, timestep_input_dim=256,
                time_embed_hidden_size=5376, time_embed_dim=2688, rope_inv_freq_len=16)
    for pruned in (False, True):
        with torch.device("meta"):
            kw = dict(full, **({"adaln_curve_grid": 1024, "time_embed_dim": 8} if pruned else {}))
            m = c_dit.MiniMaxH3Model(dtype=torch.bfloat16, device="meta", operations=comfy.ops.manual_cast, **kw)
        src = formats.TransformerSource("single_file", pathlib.Path("<comfy>"), _header(m), formats.SHIPPED_CONFIG_ROOT,
                                        "transformer", pruned=pruned)
        try:
            memory_plan.transformer_bytes(src, "bf16")
            why = ""
        except formats.FormatError as exc:
            why = str(exc)
        RESULTS[f"released_transformer{'_pruned' if pruned else ''}"] = {"mismatch": why}
    with torch.device("meta"):
        parts = {"vae": c_vae.MiniMaxH3VideoVAE(), "audio_vae": c_avae.MiniMaxH3AudioVAE(),
                 "text_encoder": MiniMaxQwen3VL({}, torch.bfloat16, "meta", comfy.ops.manual_cast)}
    for part, module in parts.items():
        src = comfy_files.PartSource(part, pathlib.Path(f"<comfy {part}>"), _header(module))
        RESULTS[f"released_{part}"] = {"mismatch": comfy_files._mismatch(src, json.loads(
            (comfy_files.SHIPPED / part / "config.json").read_text()))}


def check_tokenizer():
    """The pack's tokenizer for a text encoder file with the shipped configs (ComfyUI's vocabulary + the pack's
    tokenizer config) against ComfyUI's own H3 tokenizer: the same ids for a prompt, a label and a vision block."""
    from comfy.text_encoders.qwen3vl import Qwen3VLSDTokenizer
    from transformers import AutoTokenizer

    vocab = COMFY / "comfy" / "text_encoders" / "qwen25_tokenizer"
    src = comfy_files.PartSource("text_encoder", pathlib.Path("<released>"), config_root=comfy_files.SHIPPED,
                                 tokenizer_dir=vocab)
    tok_dir, proc_dir = comfy_files.tokenizer_folder(src, OUT / "cache")
    ours = AutoTokenizer.from_pretrained(str(tok_dir))
    theirs = Qwen3VLSDTokenizer().tokenizer
    texts = ["A red fox trots across a snowy meadow at dawn; soft wind and a distant crow call.", "<Picture 1>: ",
             "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>", "<2.5 seconds>"]
    a = [i for t in texts for i in ours(t, add_special_tokens=False)["input_ids"]]
    b = [i for t in texts for i in theirs(t, add_special_tokens=False)["input_ids"]]
    RESULTS["tokenizer_ids"] = {"max_abs_diff": float(len(a) != len(b) or max(abs(x - y) for x, y in zip(a, b))),
                                "ref_max_abs": float(max(b)), "shape": [len(b)]}
    from transformers import Qwen3VLProcessor

    from comfy_h3_nodes.engine.model.compat import ensure_processor_compat

    ensure_processor_compat()
    proc = Qwen3VLProcessor.from_pretrained(str(proc_dir))
    RESULTS["processor_vision_ids"] = {"max_abs_diff": float(abs(proc.tokenizer.convert_tokens_to_ids(
        "<|vision_start|>") - 151652) + abs(proc.image_token_id - 151655)), "ref_max_abs": 151655.0, "shape": [2]}


if __name__ == "__main__":
    for check in (check_dit, check_video_vae, check_audio_vae, check_text_encoder, check_released_layouts,
                  check_tokenizer):
        check()
    print(json.dumps(RESULTS))
