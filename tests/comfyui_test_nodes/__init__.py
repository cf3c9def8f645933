"""Test-only ComfyUI nodes: ComfyUI's own H3 text encoder and VAEs at a tiny size, for ComfyUI-native H3 graphs.

Loaded only by the real-ComfyUI suite (``tests/test_comfyui_integration.py`` links this folder into the test's
``custom_nodes`` beside the pack); never shipped, never imported by the pack. Why it exists: ComfyUI's ``CLIPLoader``
builds the Qwen3-VL text encoder at its fixed 32B size and ``VAELoader`` the H3 VAEs at their released sizes, so a
tiny file cannot come through them. These nodes build **ComfyUI's own classes** (``comfy.sd.CLIP`` around
``comfy.text_encoders.minimax``'s tokenizer and text model, ``comfy.sd.VAE`` around ``comfy.ldm.minimax``'s video and
audio VAEs) with the constructor sizes changed, random weights from a fixed seed, and hand them to the graph as CLIP
and VAE values: everything after them (``MiniMaxH3ImageToVideo``'s tokenizing and encoding, the sampler, ``VAEDecode``,
``VAEDecodeAudio``, ``CreateVideo``, ``SaveVideo``) is ComfyUI's unchanged code. The DiT is the one real file: the
pack's tiny builder writes it in Comfy-Org's layout and ComfyUI's ``UNETLoader`` detects its size from its keys.

The text model's width (32) is the tiny DiT's ``text_dim``; its vocabulary is ComfyUI's real Qwen one (151,936 ids,
so ComfyUI's tokenizer runs as it does for users), its 50 layers are what H3 reads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

import comfy.ldm.minimax.audio_vae as c_avae
import comfy.ldm.minimax.vae as c_vae
import comfy.model_management
import comfy.sd
import comfy.supported_models_base
import comfy.text_encoders.llama as c_llama
import comfy.text_encoders.minimax as c_minimax
import comfy.text_encoders.qwen3vl as c_qwen3vl

TINY_TEXT = "h3_test_tiny"  # the model type under which the tiny text model's sizes are registered


@dataclasses.dataclass
class TinyQwen3VLConfig(c_llama.Qwen3VL_32BConfig):
    """Qwen3-VL 32B's H3 config (50 layers, no final norm) at the tiny DiT's text width."""
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 50
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim = 16
    rope_dims = [4, 2, 2]  # sums to head_dim / 2


c_qwen3vl.QWEN3VL_CONFIGS.setdefault(TINY_TEXT, TinyQwen3VLConfig)
c_qwen3vl.QWEN3VL_VISION.setdefault(TINY_TEXT, dict(hidden_size=32, intermediate_size=48, depth=1, num_heads=2,
                                                    num_position_embeddings=16, deepstack_visual_indexes=[0]))


class TinyMiniMaxQwen3VL(c_minimax.MiniMaxQwen3VL):
    model_type = TINY_TEXT


#: the buffers ComfyUI allocates with ``torch.empty`` and fills only from a checkpoint, and the value a tiny model
#: gets instead: left as they are they hold whatever that memory held (finite garbage as often as not), so the audio
#: VAE's ``latents_std`` once scaled the waveform to inf and FFmpeg's AAC encoder refused it in SaveVideo
EMPTY_BUFFERS = {"mask_token": 0.0, "zero_k_bias": 0.0, "latents_mean": 0.0, "latents_std": 1.0}


def _randomize(module: torch.nn.Module, seed: int, scale: float) -> None:
    """Fill ComfyUI's uninitialised tensors (its ops skip torch's init) from ``seed``: norm scales near 1, the other
    weights small normals, the buffers ComfyUI allocates empty (:data:`EMPTY_BUFFERS`) their neutral value. Raises if
    a floating buffer is not finite afterwards (a new ``torch.empty`` buffer in ComfyUI this list does not know)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(1 + 0.1 * noise if "norm" in name or name.endswith(("scale1", "scale2")) else noise * scale)
        for name, b in module.named_buffers():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in EMPTY_BUFFERS:
                b.fill_(EMPTY_BUFFERS[leaf])
            elif b.is_floating_point() and not torch.isfinite(b).all():
                raise RuntimeError(f"{type(module).__name__}.{name} is not finite after init: ComfyUI allocates it "
                                   "empty; add its neutral value to EMPTY_BUFFERS in tests/comfyui_test_nodes")


@contextlib.contextmanager
def _swapped(module, name: str, value):
    """``module.name`` is ``value`` inside the block: how ComfyUI's own loader builds our size of its class."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


class H3TestTinyCLIP:
    """ComfyUI's MiniMax-H3 CLIP (tokenizer and text model) at the tiny size, random weights."""
    CATEGORY = "h3_test"
    RETURN_TYPES = ("CLIP",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2 ** 31})}}

    def load(self, seed):
        target = comfy.supported_models_base.ClipTarget(c_minimax.MiniMaxH3Tokenizer, c_minimax.MiniMaxH3TEModel)
        with _swapped(c_minimax, "MiniMaxQwen3VL", TinyMiniMaxQwen3VL):
            clip = comfy.sd.CLIP(target=target, model_options={"dtype": torch.float32})
        _randomize(clip.cond_stage_model, seed, 0.1)
        return (clip,)


#: per kind: ComfyUI's module, the class ``comfy.sd.VAE`` builds for it, and the sizes of each class it builds with
#: (tests/comfyui_crosscheck.py's tiny sizes: the video VAE's ViT decoder at 2 layers of 2 x 64, not 36 of 32 x 64)
TINY_VAES = {"video": (c_vae, "MiniMaxH3VideoVAE", {"MiniMaxH3VideoVAE": dict(ch=32, ch_mult=(1, 2, 2, 2, 2, 2)),
                                                     "ViT3DDecoder": dict(num_layers=2, heads=2, dim_head=64)}),
             "audio": (c_avae, "MiniMaxH3AudioVAE", {"MiniMaxH3AudioVAE": dict(
                 encoder_dim=4, latent_dim=64, decoder_dim=256, vae_latent_channels=32)})}


class H3TestTinyVAE:
    """ComfyUI's MiniMax-H3 video or audio VAE (``comfy.sd.VAE`` and its H3 module) at a tiny size, random weights."""
    CATEGORY = "h3_test"
    RETURN_TYPES = ("VAE",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"kind": (list(TINY_VAES),), "seed": ("INT", {"default": 0, "min": 0, "max": 2 ** 31})}}

    def load(self, kind, seed):
        module, top, sizes = TINY_VAES[kind]
        with contextlib.ExitStack() as stack:
            for name, kw in sizes.items():
                stack.enter_context(_swapped(module, name, functools.partial(getattr(module, name), **kw)))
            tiny = getattr(module, top)()
            _randomize(tiny, seed, 0.05)
            # ComfyUI's VAE recognises the H3 module by its keys and builds it (our size of it) with these weights
            vae = comfy.sd.VAE(sd=tiny.state_dict())
        return (vae,)


class H3TestSaveLatent:
    """A sampler's LATENT as it is (float32, every stream of a packed H3 latent) in ``output/<name>.safetensors``,
    so that the real-ComfyUI suite compares two samplings to a tolerance (a video file would quantise them)."""
    CATEGORY = "testing"
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "name": ("STRING", {"default": "latent"})}}

    def save(self, samples, name):
        import os

        import folder_paths
        from safetensors.torch import save_file

        x = samples["samples"]
        streams = x.unbind() if getattr(x, "is_nested", False) else [x]
        save_file({f"stream{i}": s.float().contiguous() for i, s in enumerate(streams)},
                  os.path.join(folder_paths.get_output_directory(), f"{name}.safetensors"))
        return {}


NODE_CLASS_MAPPINGS = {"H3TestTinyCLIP": H3TestTinyCLIP, "H3TestTinyVAE": H3TestTinyVAE,
                       "H3TestSaveLatent": H3TestSaveLatent}
NODE_DISPLAY_NAME_MAPPINGS = {"H3TestTinyCLIP": "H3 test: tiny MiniMax-H3 CLIP",
                              "H3TestTinyVAE": "H3 test: tiny MiniMax-H3 VAE"}
