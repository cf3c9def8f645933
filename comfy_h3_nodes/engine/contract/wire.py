"""The one wire contract between A (encoders, VAEs) and B (the DiT), shared by both ends.

Frozen dataclasses cross the machines, and nothing else:

* :class:`EncodedRequest` (A->B): what diffusers' ``denoise.*`` blocks read from the encode blocks, minimal: the
  conditioning only, so one encode can be denoised many times (other seeds, steps, adapters);
* :class:`DenoiseCall` (A->B, with the call): one denoise run of an encoded request: its seed, steps and adapters;
* :class:`DenoisedLatents` (B->A): what the ``decode.*`` blocks read back.
* :class:`DecodedClip` (B->A, split decode only): one video VAE clip B decoded from the latents it holds.
* :class:`PreviewSpec` (A->B, with the call) and :class:`Preview` (B->A, with the step events): live previews of
  B's current estimate, a small JPEG of a few KB.
* ComfyUI's own samplers on A with the DiT on B (a ``MODEL`` whose forwards run on B): the per-forward payloads of
  :mod:`.forward_payloads`, built of the same :class:`WireTensor` and checked the same way.

Tensors travel as :class:`WireTensor`, a numpy array plus its torch dtype name. Ray serialises numpy arrays
out-of-band (pickle protocol 5), so the receiver gets a zero-copy, read-only view of the object store; bf16, which
numpy lacks, travels as its raw 16-bit words. Pickled torch tensors measured 2.5-3.5x slower across two Ray nodes.

Every payload is validated on arrival (:meth:`EncodedRequest.validate`, :meth:`DenoisedLatents.validate`): schema
version, dtypes, shapes consistent with the canvas and frame count, finite values and a size cap. A failure raises
:class:`WireError` with one sentence that names the field, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .configs import PARALLEL_METHODS, WORKFLOWS

#: 2: the denoise parameters (seed, steps, adapters) left the encoded payload for :class:`DenoiseCall`
#: 3: :class:`DenoiseCall` carries a :class:`PreviewSpec`; B's progress answers carry a :class:`Preview`
#: 4: a :class:`Preview` may carry its latent frame instead of a JPEG (method ``latent``: A decodes it with ComfyUI's
#:    tiny preview decoder for H3)
#: 5: per-forward calls of ComfyUI's samplers (:class:`ForwardContext`, :class:`ForwardCall`, :class:`ForwardResult`)
#: 6: a :class:`ForwardCall` may carry a :class:`ParallelCall` (one forward of ComfyUI's sampler on a DiT group)
#: 7: a :class:`DecodedClip` may carry only the tiles of its clip from ``first_tile`` on (a share meeting mid-clip)
SCHEMA_VERSION = 7

#: Largest payload either side accepts, in bytes (A->B with nine image references is about 0.7 GB at real scale).
DEFAULT_MAX_PAYLOAD_BYTES = int(os.environ.get("H3_MAX_PAYLOAD_BYTES", str(1 << 30)))

REFERENCE_KINDS = ("image", "video", "audio")
KEYFRAME_ANCHORS = ("first", "last")

# Geometry of the released checkpoint that B falls back to (it has no VAE): 24 video / 32 audio latent channels.
VIDEO_LATENT_CHANNELS = 24
AUDIO_LATENT_CHANNELS = 32
AUDIO_CHANNELS = 2
SPATIAL_COMPRESSION = 16

# torch dtype name -> numpy dtype of the words that carry it.
_CARRIERS = {
    "float32": np.dtype("float32"),
    "float16": np.dtype("float16"),
    "bfloat16": np.dtype("uint16"),
    "int64": np.dtype("int64"),
    "int32": np.dtype("int32"),
    "uint8": np.dtype("uint8"),
    "bool": np.dtype("bool"),
}
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_FINITE_CHUNK = 1 << 18  # elements per pass of the NaN/inf check: its temporaries stay in cache


class WireError(ValueError):
    """A payload that does not satisfy the wire contract. The message is one sentence naming field and fix."""


@dataclass(frozen=True)
class WireTensor:
    """A tensor on the wire: the dtype it has in torch, and a C-contiguous numpy array of the words that carry it."""

    dtype: str
    data: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    # -- producer side -------------------------------------------------------------------------------------------
    @classmethod
    def from_torch(cls, tensor) -> "WireTensor":
        """Wrap a torch tensor without copying when it is already a contiguous CPU tensor."""
        import torch  # noqa: PLC0415 - tensors convert only when a payload is made or read; the contract loads with ComfyUI

        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _CARRIERS:
            raise WireError(f"dtype {name} cannot cross the wire; use one of {sorted(_CARRIERS)}.")
        if name == "bfloat16":
            t = t.view(torch.uint16)
        return cls(name, t.numpy())

    # -- receiver side -------------------------------------------------------------------------------------------
    def to_torch(self):
        """A torch tensor over the same memory (no copy). Read-only on the receiver: clone before in-place work."""
        import torch  # noqa: PLC0415 - tensors convert only when a payload is made or read; the contract loads with ComfyUI

        arr = self.data
        with warnings.catch_warnings():
            # Arrays out of Ray's object store are read-only; torch warns once per process about that.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(arr)
        if self.dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t

    def check(self, name: str, dtypes: tuple[str, ...], shape: tuple[int | None, ...] | None = None,
              finite: bool = True) -> None:
        """Validate dtype, carrier, shape (``None`` = any extent) and finiteness; raise :class:`WireError`."""
        if not isinstance(self.data, np.ndarray):
            raise WireError(f"{name} carries a {type(self.data).__name__}, expected a numpy array.")
        if self.dtype not in dtypes:
            raise WireError(f"{name} has dtype {self.dtype}, expected {' or '.join(dtypes)}.")
        if self.data.dtype != _CARRIERS[self.dtype]:
            raise WireError(
                f"{name} claims dtype {self.dtype} but carries {self.data.dtype} words "
                f"(expected {_CARRIERS[self.dtype]}): the payload is corrupt or from another schema."
            )
        if shape is not None:
            ok = len(shape) == self.data.ndim and all(e is None or e == s for e, s in zip(shape, self.data.shape))
            if not ok:
                want = "(" + ", ".join("*" if e is None else str(e) for e in shape) + ")"
                raise WireError(f"{name} has shape {tuple(self.data.shape)}, expected {want}.")
        if finite and self.dtype in _FLOAT_DTYPES and self.data.size:
            if not _all_finite(self.dtype, self.data):
                raise WireError(f"{name} holds NaN or inf values; the producer's computation diverged.")


def _all_finite(dtype: str, data: np.ndarray) -> bool:
    """No NaN or inf, in cache-sized chunks and without a float copy: bf16 words are read by their exponent bits
    (all ones = inf or NaN), which is 25x faster than widening 74 MiB of ref2va embeddings to fp32 first."""
    flat = data.reshape(-1)
    n = flat.size
    if dtype == "bfloat16":
        buf = np.empty(min(_FINITE_CHUNK, n), np.uint16)
        for start in range(0, n, _FINITE_CHUNK):
            b = buf[: min(_FINITE_CHUNK, n - start)]
            np.bitwise_and(flat[start:start + _FINITE_CHUNK], 0x7FFF, out=b)
            if b.max() >= 0x7F80:
                return False
        return True
    buf = np.empty(min(_FINITE_CHUNK, n), bool)
    for start in range(0, n, _FINITE_CHUNK):
        b = buf[: min(_FINITE_CHUNK, n - start)]
        np.isfinite(flat[start:start + _FINITE_CHUNK], out=b)
        if not b.all():
            return False
    return True


@dataclass(frozen=True)
class ReferenceMeta:
    """All B reads of a normalised ref2va reference: its kind and whether it brings a soundtrack."""

    kind: str
    has_audio: bool


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter the request wants active on B: a file on B (inside its model roots) and its weight."""

    path: str
    weight: float = 1.0


@dataclass(frozen=True)
class EncodedRequest:
    """A->B: the conditioning of one request, as diffusers' ``denoise.*`` blocks read it."""

    request_id: str
    workflow: str
    height: int
    width: int
    num_frames: int
    prompt_embeds: WireTensor
    text_token_tags: WireTensor
    keyframe_anchors: tuple[str, ...] = ()
    condition_latents: tuple[WireTensor, ...] = ()
    audio_condition_latents: tuple[WireTensor, ...] = ()
    references: tuple[ReferenceMeta, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def tensors(self) -> dict[str, WireTensor]:
        out = {"prompt_embeds": self.prompt_embeds, "text_token_tags": self.text_token_tags}
        out.update({f"condition_latents[{i}]": t for i, t in enumerate(self.condition_latents)})
        out.update({f"audio_condition_latents[{i}]": t for i, t in enumerate(self.audio_condition_latents)})
        return out

    def field_bytes(self) -> dict[str, int]:
        return {k: v.nbytes for k, v in self.tensors().items()}

    @property
    def nbytes(self) -> int:
        return sum(self.field_bytes().values())

    def validate(self, text_dim: int | None = None, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> "EncodedRequest":
        """Check everything B relies on; ``text_dim`` is B's transformer ``text_dim`` when known."""
        _check_version(self, "A->B")
        _check_common(self, max_bytes)
        self.prompt_embeds.check("prompt_embeds", _FLOAT_DTYPES, (1, None, text_dim))
        num_tokens = self.prompt_embeds.shape[1]
        if num_tokens < 1:
            raise WireError("prompt_embeds has no token rows; the prompt encoded to nothing.")
        self.text_token_tags.check("text_token_tags", ("int64",), (num_tokens,))
        lat_h, lat_w = self.height // SPATIAL_COMPRESSION, self.width // SPATIAL_COMPRESSION
        if self.workflow == "t2va":
            if self.keyframe_anchors or self.condition_latents or self.audio_condition_latents or self.references:
                raise WireError("a t2va payload carries keyframes or references; send it as fl2va or ref2va.")
        elif self.workflow == "fl2va":
            if not 1 <= len(self.keyframe_anchors) <= 2 or any(a not in KEYFRAME_ANCHORS for a in self.keyframe_anchors):
                raise WireError(f"keyframe_anchors is {self.keyframe_anchors!r}, expected 1 or 2 of {KEYFRAME_ANCHORS}.")
            if len(self.condition_latents) != len(self.keyframe_anchors):
                raise WireError(
                    f"fl2va carries {len(self.condition_latents)} condition_latents for "
                    f"{len(self.keyframe_anchors)} keyframe_anchors; they must pair one to one."
                )
            for i, t in enumerate(self.condition_latents):
                t.check(f"condition_latents[{i}]", ("float32",), (1, VIDEO_LATENT_CHANNELS, None, lat_h, lat_w))
        else:
            if not self.references:
                raise WireError("a ref2va payload carries no references; send it as t2va.")
            for i, ref in enumerate(self.references):
                if ref.kind not in REFERENCE_KINDS:
                    raise WireError(f"references[{i}].kind is {ref.kind!r}, expected one of {REFERENCE_KINDS}.")
            n_visual = sum(r.kind in ("image", "video") for r in self.references)
            n_audio = sum(bool(r.has_audio) for r in self.references)
            if len(self.condition_latents) != n_visual:
                raise WireError(
                    f"ref2va carries {len(self.condition_latents)} condition_latents for {n_visual} image/video "
                    "references; they must pair one to one."
                )
            if len(self.audio_condition_latents) != n_audio:
                raise WireError(
                    f"ref2va carries {len(self.audio_condition_latents)} audio_condition_latents for {n_audio} "
                    "audio-bearing references; they must pair one to one."
                )
            for i, t in enumerate(self.condition_latents):
                t.check(f"condition_latents[{i}]", ("float32",), (1, VIDEO_LATENT_CHANNELS, None, None, None))
            for i, t in enumerate(self.audio_condition_latents):
                t.check(f"audio_condition_latents[{i}]", ("float32",), (None, AUDIO_LATENT_CHANNELS))
        return self

    def pipeline_inputs(self) -> dict[str, Any]:
        """The keyword inputs of diffusers' denoise blocks from the conditioning (tensors as zero-copy torch views);
        the run's own (steps; the generator from the seed) come from its :class:`DenoiseCall`."""
        inputs: dict[str, Any] = {
            "prompt_embeds": self.prompt_embeds.to_torch(),
            "text_token_tags": self.text_token_tags.to_torch(),
            "height": self.height,
            "width": self.width,
            "num_frames": self.num_frames,
        }
        if self.workflow == "fl2va":
            inputs["keyframe_anchors"] = tuple(self.keyframe_anchors)
            inputs["condition_latents"] = [t.to_torch() for t in self.condition_latents]
        elif self.workflow == "ref2va":
            inputs["condition_latents"] = [t.to_torch() for t in self.condition_latents]
            inputs["audio_condition_latents"] = [t.to_torch() for t in self.audio_condition_latents]
            inputs["normalized_references"] = list(self.references)
        return inputs


@dataclass(frozen=True)
class ParallelCall:
    """With a denoise call to one rank of a DiT group: the group (as its ranks joined it), this rank's place in it
    and how attention is split. Every rank gets the same payload, seed and steps."""

    group_id: str
    rank: int
    world: int
    method: str = "ulysses"

    def validate(self) -> "ParallelCall":
        if not isinstance(self.group_id, str) or not self.group_id:
            raise WireError(f"parallel.group_id is {self.group_id!r}, expected a non-empty string.")
        if isinstance(self.world, bool) or not isinstance(self.world, int) or self.world < 2:
            raise WireError(f"parallel.world is {self.world!r}, expected a group of at least 2 ranks.")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.world:
            raise WireError(f"parallel.rank is {self.rank!r}, expected 0..{self.world - 1}.")
        if self.method not in PARALLEL_METHODS:
            raise WireError(f"parallel.method is {self.method!r}, expected one of {PARALLEL_METHODS}.")
        return self


PREVIEW_METHODS = ("latent2rgb", "latent")
PREVIEW_MAX_SIDE = 1024  # pixels, the longest side a preview may have
PREVIEW_MAX_BYTES = 256 << 10
#: a latent preview frame: float16 ``[channels, height, width]``, at most this many bytes (H3's 24 channels at
#: 1344x768 are 84 x 48: 189 KiB) and this many channels
PREVIEW_MAX_LATENT_BYTES = 2 << 20
PREVIEW_MAX_CHANNELS = 64


@dataclass(frozen=True)
class PreviewSpec:
    """A->B with the denoise call: how B previews its current estimate (the ``x0`` of each step, one latent frame)
    for the user. ``latent2rgb``: a linear map of the latent channels to RGB (``factors``: one ``(r, g, b)`` row per
    latent channel, ``bias``), the method ComfyUI's samplers use, with ComfyUI's factors for H3. ``latent``: B sends
    the latent frame itself and A decodes it (ComfyUI's tiny preview decoder for H3, ``taeh3`` in ``vae_approx``);
    the factors stay required, they are what a host without the decoder falls back to. ``every``: a
    preview each that many steps; 0 lets B choose so previews cost under ``budget`` of a step. ``max_side``: the
    longest side in pixels (the latent grid is upscaled to it with nearest neighbours, never above 8x)."""

    method: str
    factors: tuple[tuple[float, float, float], ...]
    bias: tuple[float, float, float] = (0.0, 0.0, 0.0)
    every: int = 0
    max_side: int = 512
    budget: float = 0.01
    source: str = ""  # where the factors come from, for the node's readout

    def validate(self, latent_channels: int | None = None) -> "PreviewSpec":
        if self.method not in PREVIEW_METHODS:
            raise WireError(f"preview.method is {self.method!r}, expected one of {PREVIEW_METHODS}.")
        rows = self.factors if isinstance(self.factors, tuple) else ()
        if not rows or any(not isinstance(r, tuple) or len(r) != 3 for r in rows):
            raise WireError("preview.factors must be one (r, g, b) tuple per latent channel.")
        if not all(isinstance(v, (int, float)) and np.isfinite(v) for r in rows + (self.bias,) for v in r) \
                or len(self.bias) != 3:
            raise WireError("preview.factors and preview.bias must be finite numbers, bias three of them.")
        if latent_channels is not None and len(rows) != latent_channels:
            raise WireError(f"preview.factors has {len(rows)} rows but the model's latents have {latent_channels} "
                            "channels; give one (r, g, b) row per channel.")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise WireError(f"preview.every is {self.every!r}, expected 0 (B chooses) or a positive integer.")
        if isinstance(self.max_side, bool) or not isinstance(self.max_side, int) \
                or not 16 <= self.max_side <= PREVIEW_MAX_SIDE:
            raise WireError(f"preview.max_side is {self.max_side!r}, expected 16..{PREVIEW_MAX_SIDE} pixels.")
        if not isinstance(self.budget, (int, float)) or not 0 < self.budget <= 1:
            raise WireError(f"preview.budget is {self.budget!r}, expected a share of a step in (0, 1].")
        return self


@dataclass(frozen=True)
class Preview:
    """B->A with the step events: B's estimate after step ``step`` (0-based) of ``total``, as a JPEG, or (method
    ``latent``) as its latent frame ``latent`` (float16 ``[channels, height, width]``, ``jpeg`` empty; ``width`` and
    ``height`` the latent grid's) for A to decode. ``cost_s``: what making it cost B (on B's clock); ``frame``: the
    latent frame shown."""

    request_id: str
    step: int
    total: int
    jpeg: bytes
    width: int
    height: int
    cost_s: float = 0.0
    frame: int = 0
    latent: Any = None
    schema_version: int = SCHEMA_VERSION

    def validate(self) -> "Preview":
        _check_version(self, "B->A preview")
        if self.latent is not None:
            self._check_latent()
        elif not isinstance(self.jpeg, bytes) or not self.jpeg.startswith(b"\xff\xd8"):
            raise WireError(f"the preview of request {self.request_id} is not a JPEG.")
        if len(self.jpeg) > PREVIEW_MAX_BYTES:
            raise WireError(f"the preview of request {self.request_id} is {len(self.jpeg)} bytes, over the "
                            f"{PREVIEW_MAX_BYTES} limit.")
        for name in ("width", "height"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= PREVIEW_MAX_SIDE:
                raise WireError(f"preview.{name} is {v!r}, expected 1..{PREVIEW_MAX_SIDE} pixels.")
        if not isinstance(self.step, int) or not isinstance(self.total, int) or not 0 <= self.step < self.total:
            raise WireError(f"preview.step is {self.step!r} of {self.total!r}, expected 0..total-1.")
        return self

    def _check_latent(self) -> None:
        x = self.latent
        if not isinstance(x, np.ndarray) or x.dtype != np.float16 or x.ndim != 3:
            raise WireError(f"the latent preview of request {self.request_id} is "
                            f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}, expected a float16 "
                            "[channels, height, width] array.")
        if not 1 <= x.shape[0] <= PREVIEW_MAX_CHANNELS or (x.shape[1], x.shape[2]) != (self.height, self.width):
            raise WireError(f"the latent preview of request {self.request_id} has shape {tuple(x.shape)}, expected "
                            f"[<= {PREVIEW_MAX_CHANNELS} channels, {self.height}, {self.width}].")
        if x.nbytes > PREVIEW_MAX_LATENT_BYTES:
            raise WireError(f"the latent preview of request {self.request_id} is {x.nbytes} bytes, over the "
                            f"{PREVIEW_MAX_LATENT_BYTES} limit.")
        if not np.isfinite(x).all():
            raise WireError(f"the latent preview of request {self.request_id} holds NaN or infinite values.")


@dataclass(frozen=True)
class DenoiseCall:
    """A->B with the denoise call: one run of an encoded request. ``request_id`` names this run (its records, its
    latents); ``conditioning_id`` the :class:`EncodedRequest` it denoises (the first run of an encode shares its id,
    later ones are ``<id>.2``, ...), so B refuses a payload that is not the one the call is about."""

    request_id: str
    conditioning_id: str
    seed: int
    num_inference_steps: int
    adapters: tuple[AdapterSpec, ...] = ()
    parallel: ParallelCall | None = None  # one rank of a DiT group; None: this worker alone
    preview: PreviewSpec | None = None  # live previews of B's estimate; None: none
    schema_version: int = SCHEMA_VERSION

    def validate(self, payload: "EncodedRequest | None" = None) -> "DenoiseCall":
        _check_version(self, "A->B call")
        for name in ("request_id", "conditioning_id"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise WireError(f"{name} is {v!r}, expected a non-empty string.")
        if isinstance(self.num_inference_steps, bool) or not isinstance(self.num_inference_steps, int) \
                or self.num_inference_steps < 1:
            raise WireError(f"num_inference_steps is {self.num_inference_steps!r}, expected a positive integer.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise WireError(f"seed is {self.seed!r}, expected an integer in [0, 2**64).")
        for i, a in enumerate(self.adapters):
            if not isinstance(a, AdapterSpec) or not isinstance(a.path, str) or not a.path:
                raise WireError(f"adapters[{i}] is {a!r}, expected AdapterSpec(path, weight) with a file path.")
            if isinstance(a.weight, bool) or not isinstance(a.weight, (int, float)) or not np.isfinite(a.weight) \
                    or abs(a.weight) > 10:
                raise WireError(f"adapters[{i}].weight is {a.weight!r}, expected a finite number in -10..10.")
        if self.parallel is not None:
            if not isinstance(self.parallel, ParallelCall):
                raise WireError(f"parallel is a {type(self.parallel).__name__}, expected a ParallelCall.")
            self.parallel.validate()
        if self.preview is not None:
            if not isinstance(self.preview, PreviewSpec):
                raise WireError(f"preview is a {type(self.preview).__name__}, expected a PreviewSpec.")
            self.preview.validate()
        if payload is not None and payload.request_id != self.conditioning_id:
            raise WireError(f"the denoise call of request {self.request_id} is for the conditioning "
                            f"{self.conditioning_id}, but the payload is {payload.request_id}'s.")
        return self


@dataclass(frozen=True)
class DenoisedLatents:
    """B->A: the denoised, still normalised latents of one request."""

    request_id: str
    workflow: str
    height: int
    width: int
    num_frames: int
    latents: WireTensor
    audio_latents: WireTensor
    schema_version: int = SCHEMA_VERSION

    def tensors(self) -> dict[str, WireTensor]:
        return {"latents": self.latents, "audio_latents": self.audio_latents}

    def field_bytes(self) -> dict[str, int]:
        return {k: v.nbytes for k, v in self.tensors().items()}

    @property
    def nbytes(self) -> int:
        return sum(self.field_bytes().values())

    def validate(self, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> "DenoisedLatents":
        _check_version(self, "B->A")
        _check_common(self, max_bytes)
        lat_f = video_latent_frames(self.num_frames)
        self.latents.check(
            "latents", ("float32",),
            (1, VIDEO_LATENT_CHANNELS, lat_f, self.height // SPATIAL_COMPRESSION, self.width // SPATIAL_COMPRESSION),
        )
        self.audio_latents.check(
            "audio_latents", ("float32",), (AUDIO_CHANNELS, AUDIO_LATENT_CHANNELS, audio_latent_frames(self.num_frames))
        )
        return self


@dataclass(frozen=True)
class DecodedClip:
    """B->A in a split decode: one temporal clip of the video VAE, decoded on B (``split_decode``): the raw
    ``_decode_clip`` output (1, 3, frames, height, width) in the VAE's compute dtype, clip ``index`` of ``of``.
    With ``first_tile`` > 0 (where the two shares meet inside a clip) ``frames`` holds only the clip's spatial tiles
    from ``first_tile`` on, each the decoder's raw output: (tiles, 3, frames, tile height, tile width)."""

    request_id: str
    index: int
    of: int
    frames: WireTensor
    first_tile: int = 0
    schema_version: int = SCHEMA_VERSION

    def tensors(self) -> dict[str, WireTensor]:
        return {"frames": self.frames}

    @property
    def nbytes(self) -> int:
        return self.frames.nbytes

    def validate(self, height: int, width: int, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> "DecodedClip":
        """Shape, dtype and size; not finiteness (a decoded clip is large, and a NaN in it is no wire fault)."""
        _check_version(self, "B->A clip")
        if not isinstance(self.index, int) or not isinstance(self.of, int) or not 0 <= self.index < self.of:
            raise WireError(f"clip index {self.index!r} of {self.of!r} is not a clip of the request.")
        if not isinstance(self.first_tile, int) or self.first_tile < 0:
            raise WireError(f"clip {self.index}'s first tile is {self.first_tile!r}; expected an int >= 0.")
        if self.first_tile:
            self.frames.check(f"clip {self.index} tiles", _FLOAT_DTYPES, (None, 3, None, None, None), finite=False)
            tile_h, tile_w = self.frames.shape[3], self.frames.shape[4]
            if not (0 < tile_h <= height and 0 < tile_w <= width):
                raise WireError(f"clip {self.index}'s tiles are {tile_h}x{tile_w}, not tiles of the {height}x{width} "
                                "canvas.")
        else:
            self.frames.check(f"clip {self.index} frames", _FLOAT_DTYPES, (1, 3, None, height, width), finite=False)
        if self.nbytes > max_bytes:
            raise WireError(f"clip {self.index} of request {self.request_id} is {self.nbytes} bytes, over the "
                            f"{max_bytes}-byte cap (H3_MAX_PAYLOAD_BYTES): raise the cap on both machines.")
        return self


def video_latent_frames(num_frames: int) -> int:
    """Latent frames of a ``17n+5`` frame count (diffusers' own arithmetic, loaded when a payload is checked)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import video_latent_num_frames  # noqa: PLC0415

    try:
        return video_latent_num_frames(num_frames, 17, 5)
    except ValueError as exc:
        raise WireError(f"num_frames is {num_frames}, expected the form 17 * n + 5 (A snaps it before sending).") from exc


def audio_latent_frames(num_frames: int) -> int:
    """Audio latent frames of a clip (diffusers' own arithmetic, loaded when a payload is checked)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import audio_latent_num_frames  # noqa: PLC0415

    return audio_latent_num_frames(num_frames)


def _check_version(payload, direction: str) -> None:
    theirs = getattr(payload, "schema_version", None)
    if theirs != SCHEMA_VERSION:
        raise WireError(
            f"{direction} payload speaks wire schema version {theirs!r} but this side speaks version "
            f"{SCHEMA_VERSION}: install the same comfy-h3 version on both machines."
        )


def _check_common(payload, max_bytes: int) -> None:
    if not isinstance(payload.request_id, str) or not payload.request_id:
        raise WireError(f"request_id is {payload.request_id!r}, expected a non-empty string.")
    if payload.workflow not in WORKFLOWS:
        raise WireError(f"workflow is {payload.workflow!r}, expected one of {WORKFLOWS}.")
    for name in ("height", "width"):
        v = getattr(payload, name)
        if not isinstance(v, int) or v <= 0 or v % 32:
            raise WireError(f"{name} is {v!r}, expected a positive multiple of 32.")
    if not isinstance(payload.num_frames, int) or payload.num_frames < 5 or payload.num_frames % 17 != 5:
        raise WireError(f"num_frames is {payload.num_frames!r}, expected the form 17 * n + 5 with n >= 0.")
    for name, t in payload.tensors().items():
        if not isinstance(t, WireTensor):
            raise WireError(f"{name} is a {type(t).__name__}, expected a WireTensor.")
        if not isinstance(t.data, np.ndarray):
            raise WireError(f"{name} carries a {type(t.data).__name__}, expected a numpy array.")
    total = payload.nbytes
    if total > max_bytes:
        raise WireError(
            f"payload {payload.request_id} is {total} bytes ({total / 2**20:.1f} MiB), over the {max_bytes}-byte cap "
            f"({max_bytes / 2**20:.1f} MiB, H3_MAX_PAYLOAD_BYTES): use fewer or smaller references, or raise the cap "
            "on both machines."
        )


def summarize(payload) -> dict[str, Any]:
    """A JSON-able description (no tensor data) for logs and errors."""
    out = {}
    for f in dataclasses.fields(payload):
        v = getattr(payload, f.name)
        if isinstance(v, WireTensor):
            out[f.name] = {"dtype": v.dtype, "shape": list(v.shape)}
        elif isinstance(v, tuple) and v and isinstance(v[0], WireTensor):
            out[f.name] = [{"dtype": t.dtype, "shape": list(t.shape)} for t in v]
        elif isinstance(v, tuple) and v and isinstance(v[0], ReferenceMeta):
            out[f.name] = [dataclasses.asdict(r) for r in v]
        else:
            out[f.name] = v
    return out

