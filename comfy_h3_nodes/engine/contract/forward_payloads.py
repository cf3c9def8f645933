"""The per-forward payloads of ComfyUI's own samplers with the DiT on B (the pack's ``H3RemoteModel``): part of the
one wire contract (:mod:`.wire`: the same :class:`~.wire.WireTensor`, schema version and checks).

* :class:`ForwardContext` (A->B, once per sampling and conditioning, kept on B by the id of its object): the text
  states, the packed sequence's layout, the guide and reference rows;
* per forward :class:`ForwardCall` (A->B: the noisy target rows and their timesteps) and :class:`ForwardResult` (B->A:
  the model output of the target rows). The rows are diffusers' ``MiniMaxH3Transformer3DModel.forward`` arguments,
  so B runs diffusers' module unchanged;
* :class:`ComfyLoraSet` (A->B, once per set of LoRA patches, kept on B by id): ComfyUI's LoRA patches of the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .wire import (_FLOAT_DTYPES, DEFAULT_MAX_PAYLOAD_BYTES, SCHEMA_VERSION, ParallelCall, WireError, WireTensor,
                   _check_version)


#: the modality of a row of the packed sequence, as diffusers' ``token_tags`` number them
TOKEN_VIDEO, TOKEN_TEXT, TOKEN_AUDIO = 0, 1, 2


@dataclass(frozen=True)
class ForwardContext:
    """A->B once per sampling and conditioning: what every forward of one sampler run shares. B keeps it by the id
    of the object that carries it (A puts it once and sends the reference with each :class:`ForwardCall`).

    ``text`` (batch, text rows, text_dim): the text encoder's states, before B's ``context_embedder`` and token
    refiner; ``token_tags``, ``position_ids`` (seq, 3), ``video_indices``, ``audio_indices``, ``text_indices``: the
    packed sequence as diffusers' forward takes it; ``video_target`` / ``audio_target`` (bool, one per video / audio
    row): the rows the sampler denoises, the others are guide or reference rows, given here once in ``cond_video`` /
    ``cond_audio`` (float32 patch rows; (0, channels) when there are none)."""

    sampling_id: str
    text: WireTensor
    token_tags: WireTensor
    position_ids: WireTensor
    video_indices: WireTensor
    audio_indices: WireTensor
    text_indices: WireTensor
    video_target: WireTensor
    audio_target: WireTensor
    cond_video: WireTensor
    cond_audio: WireTensor
    partition: str = "transformer"  # the DiT that runs it: transformer (t2va, fl2va) or transformer_ref (ref2va)
    schema_version: int = SCHEMA_VERSION

    def tensors(self) -> dict[str, WireTensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.type == "WireTensor"}

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors().values())

    @property
    def seq_len(self) -> int:
        return self.position_ids.shape[0]

    def validate(self, text_dim: int | None = None, video_dim: int | None = None, audio_dim: int | None = None,
                 max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> "ForwardContext":
        _check_version(self, "A->B sampling context")
        if not isinstance(self.sampling_id, str) or not self.sampling_id:
            raise WireError(f"sampling_id is {self.sampling_id!r}, expected a non-empty string.")
        if self.partition not in ("transformer", "transformer_ref"):
            raise WireError(f"partition is {self.partition!r}, expected 'transformer' or 'transformer_ref'.")
        for name, t in self.tensors().items():
            if not isinstance(t, WireTensor):
                raise WireError(f"sampling context {name} is a {type(t).__name__}, expected a WireTensor.")
        self.text.check("text", _FLOAT_DTYPES, (None, None, text_dim))
        self.position_ids.check("position_ids", ("float32",), (None, 3))
        s = self.seq_len
        self.token_tags.check("token_tags", ("int64",), (s,))
        if self.token_tags.data.size and (self.token_tags.data.min() < 0 or self.token_tags.data.max() > 2):
            raise WireError("token_tags holds a tag outside 0 (video), 1 (text), 2 (audio).")
        nv, na, nt = (self.video_target.shape[0] if self.video_target.data.ndim == 1 else -1,
                      self.audio_target.shape[0] if self.audio_target.data.ndim == 1 else -1, self.text.shape[1])
        self.video_target.check("video_target", ("bool",), (nv,))
        self.audio_target.check("audio_target", ("bool",), (na,))
        for name, n in (("video_indices", nv), ("audio_indices", na), ("text_indices", nt)):
            t = getattr(self, name)
            t.check(name, ("int64",), (n,))
            if t.data.size and (t.data.min() < 0 or t.data.max() >= s):
                raise WireError(f"{name} points outside the packed sequence of {s} rows.")
        if nv + na + nt != s:
            raise WireError(f"the packed sequence has {s} rows but its video, audio and text rows add up to "
                            f"{nv + na + nt}.")
        self.cond_video.check("cond_video", ("float32",), (int(nv - self.video_target.data.sum()), video_dim))
        self.cond_audio.check("cond_audio", ("float32",), (int(na - self.audio_target.data.sum()), audio_dim))
        if self.nbytes > max_bytes:
            raise WireError(f"sampling context {self.sampling_id} is {self.nbytes} bytes, over the {max_bytes}-byte "
                            "cap (H3_MAX_PAYLOAD_BYTES): raise the cap on both machines.")
        return self


@dataclass(frozen=True)
class ForwardCall:
    """A->B per forward of a sampler: the target rows (``video`` (batch, target video rows, patch dim), ``audio``
    (batch, target audio rows, channels)) in the dtype the sampler hands the model (bf16 when it computes in bf16:
    the rows are a permutation of its latent, so nothing is rounded on the way), the distinct ``timestep`` values
    (unscaled, in [0, 1]) and per row of the packed sequence the index of its value (``timestep_indices``, uint8).
    ``parallel``: this rank's place in the DiT group that runs the forward together (every rank gets the same call
    otherwise); None: one worker."""

    sampling_id: str
    index: int
    video: WireTensor
    audio: WireTensor
    timestep: WireTensor
    timestep_indices: WireTensor
    parallel: ParallelCall | None = None
    schema_version: int = SCHEMA_VERSION

    def tensors(self) -> dict[str, WireTensor]:
        return {"video": self.video, "audio": self.audio, "timestep": self.timestep,
                "timestep_indices": self.timestep_indices}

    def field_bytes(self) -> dict[str, int]:
        return {k: v.nbytes for k, v in self.tensors().items()}

    @property
    def nbytes(self) -> int:
        return sum(self.field_bytes().values())

    def validate(self, ctx: ForwardContext, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> "ForwardCall":
        _check_version(self, "A->B forward")
        if self.sampling_id != ctx.sampling_id:
            raise WireError(f"forward {self.index} of sampling {self.sampling_id!r} came with the context of "
                            f"{ctx.sampling_id!r}.")
        for name, t in self.tensors().items():
            if not isinstance(t, WireTensor):
                raise WireError(f"forward {name} is a {type(t).__name__}, expected a WireTensor.")
        batch = ctx.text.shape[0]
        self.video.check("video", _FLOAT_DTYPES, (batch, int(ctx.video_target.data.sum()), ctx.cond_video.shape[1]))
        self.audio.check("audio", _FLOAT_DTYPES, (batch, int(ctx.audio_target.data.sum()), ctx.cond_audio.shape[1]))
        self.timestep.check("timestep", ("float32",), (None,))
        self.timestep_indices.check("timestep_indices", ("uint8",), (ctx.seq_len,))
        if self.parallel is not None:
            if not isinstance(self.parallel, ParallelCall):
                raise WireError(f"forward parallel is a {type(self.parallel).__name__}, expected a ParallelCall.")
            self.parallel.validate()
        n = self.timestep.shape[0]
        if not 1 <= n <= 255 or int(self.timestep_indices.data.max()) >= n:
            raise WireError(f"timestep_indices points past the {n} timestep values of forward {self.index}.")
        if self.nbytes > max_bytes:
            raise WireError(f"forward {self.index} is {self.nbytes} bytes, over the {max_bytes}-byte cap "
                            "(H3_MAX_PAYLOAD_BYTES): raise the cap on both machines.")
        return self


@dataclass(frozen=True)
class ForwardResult:
    """B->A per forward: diffusers' video and audio velocity of the target rows, in the call's shapes and dtypes
    (ComfyUI's own model hands its output back in the dtype of its input too)."""

    sampling_id: str
    index: int
    video: WireTensor
    audio: WireTensor
    schema_version: int = SCHEMA_VERSION

    def tensors(self) -> dict[str, WireTensor]:
        return {"video": self.video, "audio": self.audio}

    @property
    def nbytes(self) -> int:
        return self.video.nbytes + self.audio.nbytes

    def validate(self, call: ForwardCall) -> "ForwardResult":
        _check_version(self, "B->A forward")
        if (self.sampling_id, self.index) != (call.sampling_id, call.index):
            raise WireError(f"B answered forward {self.index} of {self.sampling_id!r} to forward {call.index} of "
                            f"{call.sampling_id!r}.")
        self.video.check("video output", (call.video.dtype,), call.video.shape, finite=False)
        self.audio.check("audio output", (call.audio.dtype,), call.audio.shape, finite=False)
        return self


@dataclass(frozen=True)
class ComfyLora:
    """One LoRA patch of ComfyUI's model (``LoraLoaderModelOnly`` and friends) for B: the weight ``key`` in
    ComfyUI's names (``blocks.0.attn.qkv_proj.weight``), ``up`` (out, rank) and ``down`` (rank, in) and the factor
    ComfyUI multiplies them with (``strength * alpha / rank``). B adds ``scale * up @ down @ x`` to the layer's output:
    ComfyUI's own LoRA arithmetic in its bypass form (its ``h(x)``), which leaves B's resident weights untouched."""

    key: str
    scale: float
    up: WireTensor
    down: WireTensor

    def validate(self) -> "ComfyLora":
        if not isinstance(self.key, str) or not self.key.endswith(".weight"):
            raise WireError(f"LoRA key {self.key!r} is not a weight of ComfyUI's model.")
        if not isinstance(self.scale, float) or self.scale != self.scale:
            raise WireError(f"LoRA scale of {self.key} is {self.scale!r}, expected a number.")
        self.up.check(f"{self.key} up", _FLOAT_DTYPES, (None, None))
        self.down.check(f"{self.key} down", _FLOAT_DTYPES, (self.up.shape[1], None))
        return self


@dataclass(frozen=True)
class ComfyLoraSet:
    """A->B once per set of LoRA patches (kept on B by the id of the object that carries it): every patch of the
    sampler's model; several LoRAs on one key are several entries, applied together."""

    patches: tuple
    schema_version: int = SCHEMA_VERSION

    @property
    def nbytes(self) -> int:
        return sum(p.up.nbytes + p.down.nbytes for p in self.patches)

    def validate(self, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> "ComfyLoraSet":
        _check_version(self, "A->B LoRA set")
        for p in self.patches:
            if not isinstance(p, ComfyLora):
                raise WireError(f"a LoRA set holds a {type(p).__name__}, expected ComfyLora.")
            p.validate()
        if self.nbytes > max_bytes:
            raise WireError(f"the LoRA set is {self.nbytes} bytes, over the {max_bytes}-byte cap "
                            "(H3_MAX_PAYLOAD_BYTES): raise the cap on both machines.")
        return self
