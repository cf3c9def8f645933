"""ComfyUI's nodes (classic V1 API: plain classes, no ComfyUI import). Thin: they translate ComfyUI values to the
engine and back and report each node's timing record; everything else is the engine's.

Graph: H3LoadEncoders -> H3TextEncode (+ H3Keyframes | H3References | H3PromptList) -> H3RemoteDenoise
(+ H3RemoteDiT [-> H3LoRA]) -> H3Decode -> H3SaveVideo (or ComfyUI's own CreateVideo/SaveVideo: H3Decode returns
standard IMAGE and AUDIO). The values they pass are described in :mod:`.values`.
"""

from .common import plain_errors
from .generate import H3Decode, H3RemoteDenoise, H3TextEncode
from .inputs import H3Keyframes, H3PromptList, H3References
from .loaders import H3LoadEncoders, H3LoRA, H3RemoteDiT
from .save import H3SaveVideo
from .values import DiT, Keyframes, References

NODE_CLASS_MAPPINGS = {
    "H3LoadEncoders": H3LoadEncoders,
    "H3RemoteDiT": H3RemoteDiT,
    "H3LoRA": H3LoRA,
    "H3Keyframes": H3Keyframes,
    "H3References": H3References,
    "H3PromptList": H3PromptList,
    "H3TextEncode": H3TextEncode,
    "H3RemoteDenoise": H3RemoteDenoise,
    "H3Decode": H3Decode,
    "H3SaveVideo": H3SaveVideo,
}

for _cls in NODE_CLASS_MAPPINGS.values():
    plain_errors(_cls)

NODE_DISPLAY_NAME_MAPPINGS = {
    "H3LoadEncoders": "H3 Load Encoders (A)",
    "H3RemoteDiT": "H3 Remote DiT (B)",
    "H3LoRA": "H3 LoRA (B)",
    "H3Keyframes": "H3 Keyframes",
    "H3References": "H3 References",
    "H3PromptList": "H3 Prompt List (batch)",
    "H3TextEncode": "H3 Text Encode (A)",
    "H3RemoteDenoise": "H3 Remote Denoise (B)",
    "H3Decode": "H3 Decode (A)",
    "H3SaveVideo": "H3 Save Video",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "DiT", "Keyframes", "References", *NODE_CLASS_MAPPINGS]
