"""What a user asks for, checked before any model runs.

:class:`H3Request` is the engine's request; :func:`validate_request` turns it into a :class:`ValidRequest` or raises
:class:`RequestError` whose message names the bad value and the nearest valid one. The numbers are MiniMax-H3's own
(diffusers ``minimax_h3.modular_pipeline``): 24 fps, 5-15 s after snapping to ``17n+5`` frames, canvases in
multiples of 32 with an aspect ratio between 1:4 and 4:1, at most 9 image references.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from PIL import Image

from .configs import TINY
from .wire import AdapterSpec, DenoiseCall, PreviewSpec

FPS = 24
MIN_SECONDS, MAX_SECONDS = 5.0, 15.0
CANVAS_MULTIPLE = 32
MIN_ASPECT, MAX_ASPECT = 1 / 4, 4.0
MAX_CANVAS_PIXELS = 2048 * 2048
MAX_STEPS = 200
MAX_PROMPT_CHARS = 20_000
MAX_IMAGE_REFERENCES = 9
MAX_SEED = 2**64 - 1


class RequestError(ValueError):
    """A request a user can fix; the message says what is wrong and what would be valid. ``about`` names the one
    input the message is about, where there is one (``None``: it is about several together)."""

    def __init__(self, message: str, about: str | None = None):
        super().__init__(message)
        self.about = about


@dataclass
class AudioClip:
    """A soundtrack: float waveform ``[channels, samples]`` in -1..1 at ``sample_rate``."""

    waveform: np.ndarray
    sample_rate: int


@dataclass
class EncodeRequest:
    """What A encodes: the prompt, the canvas and frames, and keyframes or references (the workflow follows)."""

    prompt: str
    height: int | None = None
    width: int | None = None
    num_frames: int = 124
    first_image: Any = None
    last_image: Any = None
    reference_images: list = field(default_factory=list)
    reference_audio: AudioClip | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def workflow(self) -> str:
        if self.reference_images or self.reference_audio is not None:
            return "ref2va"
        if self.first_image is not None or self.last_image is not None:
            return "fl2va"
        return "t2va"


@dataclass
class H3Request(EncodeRequest):
    """A whole request: what A encodes, and how B denoises it (its seed, steps and LoRA adapters)."""

    steps: int = 50
    seed: int = 0
    adapters: list = field(default_factory=list)  # (path on B, weight) pairs: LoRA adapters active for this request

    def params(self) -> "DenoiseParams":
        """How B denoises it (checked)."""
        return validate_params(self.steps, self.seed, self.adapters)


# ----------------------------------------------------------------------------------------------- numbers
def snap_frames(num_frames: int) -> int:
    """Round a frame count up to the next ``17n+5`` (what the video VAE decodes)."""
    n = max(0, math.ceil((num_frames - 5) / 17))
    return 17 * n + 5


def valid_frame_range() -> tuple[int, int]:
    """Smallest and largest snapped frame counts inside 5-15 s: (124, 345)."""
    lo = snap_frames(math.ceil(MIN_SECONDS * FPS))
    hi = snap_frames(int(MAX_SECONDS * FPS))
    if hi / FPS > MAX_SECONDS:
        hi -= 17
    return lo, hi


def check_frames(num_frames: Any, name: str = "num_frames") -> int:
    if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)):
        raise RequestError(f"{name} is {num_frames!r}; it must be a whole number of frames at {FPS} fps.")
    lo, hi = valid_frame_range()
    snapped = snap_frames(int(num_frames))
    if not lo <= snapped <= hi:
        nearest = lo if snapped < lo else hi
        raise RequestError(
            f"{name} {num_frames} gives {snapped} frames ({snapped / FPS:.2f} s at {FPS} fps) after snapping to 17n+5; "
            f"MiniMax-H3 makes {MIN_SECONDS:g}-{MAX_SECONDS:g} s, so use {lo}..{hi} frames "
            f"(nearest valid: {nearest})."
        )
    return snapped


def _nearest_multiples(v: int, m: int = CANVAS_MULTIPLE) -> str:
    lo = max(m, (v // m) * m)
    hi = lo + m if lo < v else lo
    return f"{lo}" if lo == hi else f"{lo} or {hi}"


def check_canvas(height: Any, width: Any) -> tuple[int | None, int | None]:
    """``(height, width)`` checked; a RequestError's ``about`` names the side that is wrong (``None`` for what is
    about both: the aspect ratio, the pixel count, one side given without the other)."""
    if height is None and width is None:
        return None, None
    if (height is None) != (width is None):
        raise RequestError(
            f"height is {height!r} and width is {width!r}: give both, or neither for the default 1344x768 canvas."
        )
    for name, v in (("height", height), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise RequestError(
                f"{name} is {v!r}; it must be a whole number of pixels, a multiple of {CANVAS_MULTIPLE}.", about=name
            )
        if v < CANVAS_MULTIPLE:
            raise RequestError(f"{name} {v} is too small; the smallest canvas edge is {CANVAS_MULTIPLE}.", about=name)
        if v % CANVAS_MULTIPLE:
            raise RequestError(
                f"{name} {v} is not a multiple of {CANVAS_MULTIPLE}; nearest valid: {_nearest_multiples(int(v))}.",
                about=name,
            )
    ratio = width / height
    if not MIN_ASPECT <= ratio <= MAX_ASPECT:
        if ratio > MAX_ASPECT:
            fix = f"width {int(height * MAX_ASPECT) // CANVAS_MULTIPLE * CANVAS_MULTIPLE} at height {height}"
        else:
            fix = f"height {int(width / MIN_ASPECT) // CANVAS_MULTIPLE * CANVAS_MULTIPLE} at width {width}"
        raise RequestError(
            f"canvas {width}x{height} has aspect ratio {ratio:.3g}; MiniMax-H3 supports 1:4 to 4:1 (nearest valid: {fix})."
        )
    if width * height > MAX_CANVAS_PIXELS:
        raise RequestError(
            f"canvas {width}x{height} has {width * height} pixels, over the {MAX_CANVAS_PIXELS} limit; the model was "
            "trained up to 1344x768 (1,032,192 pixels)."
        )
    return int(height), int(width)


def check_cluster_address(address: Any) -> str:
    """``local`` or ``host:port``, stripped."""
    addr = address.strip() if isinstance(address, str) else ""
    if addr != "local" and (":" not in addr or not addr.rsplit(":", 1)[1].isdigit() or not addr.rsplit(":", 1)[0]):
        raise RequestError(f"cluster_address {address!r} must be 'local' or host:port (e.g. 192.168.100.1:6379).")
    return addr


#: how actor_name asks for another DiT worker on B in so many words ("new:h3_dit_2"): a name that matches no worker
#: while B holds one is refused otherwise (a typo would load a second copy of the DiT)
NEW_WORKER = "new:"


def parse_actor_spec(spec: str) -> tuple[str, ...]:
    """``"a, b*"`` -> ``("a", "b*")``; an empty spec is an error."""
    spec = (spec or "").strip()
    parts = tuple(p.strip() for p in spec.removeprefix(NEW_WORKER).split(",") if p.strip())
    if not parts:
        raise ValueError("actor_name is empty; give a name, a comma-separated list or a prefix with '*' "
                         "(default h3_dit*).")
    for p in parts:
        if "*" in p.rstrip("*") or any(c in p for c in "?[]"):
            raise ValueError(f"actor_name part {p!r}: only a trailing '*' is a wildcard (e.g. h3_dit*).")
    return parts


def check_actor_name(spec: Any) -> tuple[str, ...]:
    """``H3RemoteDiT.actor_name``: a name, a comma-separated list or prefixes with ``*``."""
    try:
        return parse_actor_spec(spec if isinstance(spec, str) else "")
    except ValueError as exc:
        raise RequestError(f"{exc} Use the name `remote_worker setup` printed.") from None


def check_steps(steps: Any) -> int:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
        raise RequestError(f"steps is {steps!r}; it must be a whole number between 1 and {MAX_STEPS}.")
    if steps < 1:
        raise RequestError(f"steps {steps} is below 1; nearest valid: 1 (50 for the base model, 4 or 8 with a turbo LoRA).")
    if steps > MAX_STEPS:
        raise RequestError(f"steps {steps} is above {MAX_STEPS}; nearest valid: {MAX_STEPS} (the base model needs 50).")
    return int(steps)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise RequestError(f"seed is {seed!r}; it must be a whole number in 0..{MAX_SEED}.")
    return int(seed)


def check_prompt(prompt: Any) -> str:
    if not isinstance(prompt, str):
        raise RequestError(f"prompt is a {type(prompt).__name__}; it must be text.")
    if not prompt.strip():
        raise RequestError("prompt is empty; describe the video and its sound in a sentence or more.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise RequestError(
            f"prompt has {len(prompt)} characters, over the {MAX_PROMPT_CHARS} limit; shorten it "
            f"(about 256 tokens is typical)."
        )
    return prompt


# ----------------------------------------------------------------------------------------------- media
def to_pil_rgb(image: Any, name: str):
    """PIL RGB from a PIL image, or an ``[H,W,3]`` / ``[1,H,W,3]`` array or tensor (uint8, or float in 0..1)."""
    if isinstance(image, Image.Image):
        if image.mode != "RGB":
            raise RequestError(f"{name} is a {image.mode} image; convert it to RGB (3 channels).")
        return image
    if hasattr(image, "detach"):  # torch tensor
        image = image.detach().cpu().numpy()
    if not isinstance(image, np.ndarray):
        raise RequestError(f"{name} is a {type(image).__name__}; give a PIL image or an [H,W,3] array.")
    arr = image
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3 or arr.shape[-1] != 3:
        raise RequestError(
            f"{name} has shape {tuple(image.shape)}; expected [H,W,3] (RGB, 3 channels) or one image of a batch."
        )
    if arr.shape[0] < 16 or arr.shape[1] < 16:
        raise RequestError(f"{name} is {arr.shape[1]}x{arr.shape[0]} pixels; give at least 16x16.")
    if arr.dtype == np.uint8:
        return Image.fromarray(np.ascontiguousarray(arr), "RGB")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise RequestError(f"{name} holds NaN or inf pixels; fix the node that made it.")
        if arr.min() < -1e-3 or arr.max() > 1 + 1e-3:
            raise RequestError(
                f"{name} has values {float(arr.min()):.3g}..{float(arr.max()):.3g}; float images must be in 0..1."
            )
        return Image.fromarray(np.round(np.clip(arr, 0, 1) * 255).astype(np.uint8), "RGB")
    raise RequestError(f"{name} has dtype {arr.dtype}; give uint8 0..255 or float 0..1 pixels.")


def check_audio(clip: Any, name: str = "reference_audio") -> AudioClip:
    if not isinstance(clip, AudioClip):
        raise RequestError(f"{name} is a {type(clip).__name__}; give an AudioClip(waveform [C,L], sample_rate).")
    wf = clip.waveform
    if hasattr(wf, "detach"):
        wf = wf.detach().cpu().numpy()
    wf = np.asarray(wf)
    if wf.ndim == 3 and wf.shape[0] == 1:
        wf = wf[0]
    if wf.ndim == 1:
        wf = wf[None]
    if wf.ndim != 2 or wf.shape[0] not in (1, 2):
        raise RequestError(f"{name} waveform has shape {tuple(np.shape(clip.waveform))}; expected [channels (1 or 2), samples].")
    if wf.dtype.kind != "f":
        raise RequestError(f"{name} waveform has dtype {wf.dtype}; give float samples in -1..1.")
    if not np.isfinite(wf).all():
        raise RequestError(f"{name} waveform holds NaN or inf samples; fix the node that made it (samples in -1..1).")
    if (isinstance(clip.sample_rate, bool) or not isinstance(clip.sample_rate, (int, np.integer))
            or not 1 <= clip.sample_rate <= 384000):
        raise RequestError(f"{name} sample_rate is {clip.sample_rate!r}; give a positive rate in Hz (at most 384000).")
    if wf.shape[1] < clip.sample_rate // 10:
        raise RequestError(f"{name} is {wf.shape[1] / clip.sample_rate:.3f} s long; give at least 0.1 s.")
    return AudioClip(np.ascontiguousarray(wf, dtype=np.float32), int(clip.sample_rate))


MAX_ADAPTERS = 8


def check_adapters(adapters: Any) -> tuple:
    """``(path, weight)`` pairs -> a tuple of them, checked (the files themselves are checked on B)."""
    out = []
    for i, item in enumerate(adapters or ()):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise RequestError(f"adapters[{i}] is {item!r}; give (path on B, weight) pairs.")
        path, weight = item
        if not isinstance(path, str) or not path.strip():
            raise RequestError(f"adapters[{i}] path is {path!r}; give the LoRA file's path on machine B.")
        if path.strip() != TINY and not path.endswith(".safetensors"):
            raise RequestError(f"adapter {path!r} is not a .safetensors file; LoRA adapters load from safetensors only.")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or abs(weight) > 10:
            raise RequestError(f"adapter {path} has strength {weight!r}; use a number in -10..10 (1.0 = as trained).")
        out.append((path.strip(), float(weight)))
    if len(out) > MAX_ADAPTERS:
        raise RequestError(f"{len(out)} LoRA adapters were stacked; at most {MAX_ADAPTERS} are supported.")
    return tuple(out)


@dataclass
class ValidEncode:
    """An encode request that passed every check, with frames snapped and media normalised."""

    request_id: str
    workflow: str
    prompt: str
    height: int | None
    width: int | None
    num_frames: int
    first_image: Any = None
    last_image: Any = None
    reference_images: list = field(default_factory=list)
    reference_audio: AudioClip | None = None

    def with_canvas(self, height: int, width: int) -> "ValidEncode":
        return replace(self, height=height, width=width)


@dataclass(frozen=True)
class DenoiseParams:
    """How B denoises one run of an encoded request, checked: these travel with the denoise call
    (:class:`~.wire.DenoiseCall`), never inside the encoded payload."""

    steps: int = 50
    seed: int = 0
    adapters: tuple = ()  # ((path on B, weight), ...)
    preview: PreviewSpec | None = None  # live previews of B's estimate (the host's preview method decides)

    def call(self, request_id: str, conditioning_id: str) -> DenoiseCall:
        return DenoiseCall(request_id, conditioning_id, int(self.seed), int(self.steps),
                           tuple(AdapterSpec(p, float(w)) for p, w in self.adapters), preview=self.preview)


@dataclass
class ValidRequest:
    """A whole request that passed every check: what A encodes and how B denoises it."""

    encode: ValidEncode
    params: DenoiseParams

    @property
    def request_id(self) -> str:
        return self.encode.request_id

    @property
    def workflow(self) -> str:
        return self.encode.workflow


def validate_params(steps: Any = 50, seed: Any = 0, adapters: Any = ()) -> DenoiseParams:
    return DenoiseParams(check_steps(steps), check_seed(seed), check_adapters(adapters))


def validate_encode(req: EncodeRequest) -> ValidEncode:
    if not isinstance(req.request_id, str) or not req.request_id or len(req.request_id) > 128:
        raise RequestError(f"request_id is {req.request_id!r}; give a non-empty string of at most 128 characters.")
    prompt = check_prompt(req.prompt)
    height, width = check_canvas(req.height, req.width)
    frames = check_frames(req.num_frames)
    has_keyframes = req.first_image is not None or req.last_image is not None
    refs = list(req.reference_images or [])
    if has_keyframes and (refs or req.reference_audio is not None):
        raise RequestError(
            "keyframes and references were both given; MiniMax-H3 conditions on either keyframes (fl2va) or "
            "references (ref2va): disconnect one of them."
        )
    first = to_pil_rgb(req.first_image, "first_image") if req.first_image is not None else None
    last = to_pil_rgb(req.last_image, "last_image") if req.last_image is not None else None
    if len(refs) > MAX_IMAGE_REFERENCES:
        raise RequestError(
            f"{len(refs)} image references were given; MiniMax-H3 reads at most {MAX_IMAGE_REFERENCES}: drop "
            f"{len(refs) - MAX_IMAGE_REFERENCES}."
        )
    images = [to_pil_rgb(im, f"reference_images[{i}]") for i, im in enumerate(refs)]
    audio = check_audio(req.reference_audio) if req.reference_audio is not None else None
    if audio is not None and not images:
        raise RequestError(
            "an audio reference was given alone; MiniMax-H3 needs at least one image reference beside it."
        )
    return ValidEncode(
        request_id=req.request_id, workflow=req.workflow, prompt=prompt, height=height, width=width,
        num_frames=frames, first_image=first, last_image=last, reference_images=images, reference_audio=audio,
    )


def validate_request(req: H3Request) -> ValidRequest:
    """Every check of a whole request, before anything runs: the encode part, then the denoise parameters."""
    encode = validate_encode(req)
    return ValidRequest(encode, validate_params(req.steps, req.seed, req.adapters))
