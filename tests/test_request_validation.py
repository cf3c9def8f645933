"""What a user may ask for (comfy_h3_nodes.engine.contract.request): a catalogue of bad requests, each refused with a
message that names the bad value and the fix, plus the frame arithmetic and valid requests of every workflow."""

import numpy as np
import pytest
from PIL import Image

from comfy_h3_nodes.engine.contract.request import (MAX_SEED, AudioClip, H3Request, RequestError, ValidRequest,
                                                    check_frames, snap_frames, valid_frame_range, validate_encode,
                                                    validate_request)


# ----------------------------------------------------------------------------------------------- media helpers
def rgb(w=64, h=64, color=(200, 100, 50)) -> Image.Image:
    return Image.new("RGB", (w, h), color)


def float_image(h=64, w=64, batch=True, seed=0) -> np.ndarray:
    arr = np.random.default_rng(seed).random((h, w, 3), dtype=np.float32)
    return arr[None] if batch else arr


def audio(channels=2, samples=160, rate=160, dtype=np.float32) -> AudioClip:
    wf = np.random.default_rng(1).uniform(-1, 1, (channels, samples)).astype(dtype)
    return AudioClip(wf, rate)


def nan_image() -> np.ndarray:
    arr = float_image()
    arr[0, 10, 10, 1] = np.nan
    return arr


def nan_audio() -> AudioClip:
    clip = audio()
    clip.waveform[1, 5] = np.nan
    return clip


# ----------------------------------------------------------------------------------------------- the catalogue
# (id, H3Request keyword overrides, words the message must hold: the bad value and the fix / nearest valid value)
CATALOGUE = [
    # canvas
    ("height-500", dict(height=500, width=512), ["height 500", "multiple of 32", "480 or 512"]),
    ("width-100", dict(height=512, width=100), ["width 100", "96 or 128"]),
    ("width-33", dict(height=512, width=33), ["width 33", "32 or 64"]),
    ("height-below-32", dict(height=16, width=512), ["height 16", "too small", "32"]),
    ("width-zero", dict(height=512, width=0), ["width 0", "32"]),
    ("width-negative", dict(height=512, width=-64), ["width -64", "32"]),
    ("aspect-5:1", dict(height=64, width=320), ["320x64", "aspect ratio 5", "1:4 to 4:1", "width 256 at height 64"]),
    ("aspect-1:5", dict(height=320, width=64), ["64x320", "aspect ratio 0.2", "1:4 to 4:1", "height 256 at width 64"]),
    ("only-height", dict(height=512), ["height is 512", "width is None", "give both, or neither"]),
    ("only-width", dict(width=768), ["height is None", "width is 768", "give both, or neither"]),
    ("canvas-too-many-pixels", dict(height=2560, width=2560), ["2560x2560", "6553600 pixels", "4194304"]),
    ("height-float", dict(height=512.0, width=512), ["height is 512.0", "whole number", "multiple of 32"]),
    ("height-bool", dict(height=True, width=64), ["height is True", "whole number", "multiple of 32"]),
    ("width-str", dict(height=512, width="512"), ["width is '512'", "whole number"]),
    # frames
    ("frames-too-few-100", dict(num_frames=100), ["num_frames 100", "107 frames", "124..345", "nearest valid: 124"]),
    ("frames-zero", dict(num_frames=0), ["num_frames 0", "nearest valid: 124"]),
    ("frames-too-many-400", dict(num_frames=400), ["num_frames 400", "413 frames", "124..345", "nearest valid: 345"]),
    ("frames-346", dict(num_frames=346), ["num_frames 346", "362 frames", "nearest valid: 345"]),
    ("frames-float", dict(num_frames=124.0), ["num_frames is 124.0", "whole number of frames"]),
    ("frames-str", dict(num_frames="124"), ["num_frames is '124'", "whole number of frames"]),
    ("frames-bool", dict(num_frames=True), ["num_frames is True", "whole number of frames"]),
    # steps
    ("steps-0", dict(steps=0), ["steps 0", "below 1", "nearest valid: 1"]),
    ("steps-negative", dict(steps=-3), ["steps -3", "below 1", "nearest valid: 1"]),
    ("steps-10000", dict(steps=10000), ["steps 10000", "above 200", "nearest valid: 200"]),
    ("steps-float", dict(steps=4.5), ["steps is 4.5", "whole number between 1 and 200"]),
    ("steps-none", dict(steps=None), ["steps is None", "between 1 and 200"]),
    ("steps-bool", dict(steps=True), ["steps is True", "between 1 and 200"]),
    # prompt
    ("prompt-empty", dict(prompt=""), ["prompt is empty", "describe the video"]),
    ("prompt-whitespace", dict(prompt="  \n\t "), ["prompt is empty", "describe the video"]),
    ("prompt-oversized", dict(prompt="a" * 20_001), ["20001 characters", "20000 limit", "shorten it"]),
    ("prompt-int", dict(prompt=42), ["prompt is a int", "text"]),
    ("prompt-none", dict(prompt=None), ["prompt is a NoneType", "text"]),
    # seed
    ("seed-negative", dict(seed=-1), ["seed is -1", f"0..{MAX_SEED}"]),
    ("seed-huge", dict(seed=2**64), [f"seed is {2**64}", f"0..{MAX_SEED}"]),
    ("seed-float", dict(seed=1.5), ["seed is 1.5", "whole number"]),
    ("seed-bool", dict(seed=False), ["seed is False", "whole number"]),
    # request id
    ("request-id-empty", dict(request_id=""), ["request_id is ''", "non-empty string"]),
    ("request-id-long", dict(request_id="r" * 129), ["request_id is 'rrr", "at most 128 characters"]),
    # keyframe images
    ("image-rgba-pil", dict(first_image=Image.new("RGBA", (64, 64))), ["first_image", "RGBA", "convert it to RGB"]),
    ("image-grayscale-pil", dict(last_image=Image.new("L", (64, 64))), ["last_image", "is a L image", "RGB"]),
    ("image-4-channels", dict(first_image=np.zeros((64, 64, 4), np.float32)),
     ["first_image", "(64, 64, 4)", "[H,W,3]"]),
    ("image-2d", dict(first_image=np.zeros((64, 64), np.uint8)), ["first_image", "(64, 64)", "[H,W,3]"]),
    ("image-batch-of-2", dict(first_image=np.zeros((2, 64, 64, 3), np.float32)),
     ["first_image", "(2, 64, 64, 3)", "one image of a batch"]),
    ("image-float-above-1", dict(first_image=float_image() * 2), ["first_image", "has values ", "..2;", "0..1"]),
    ("image-float-negative", dict(last_image=float_image() - 0.5), ["last_image", "values -0.5", "0..1"]),
    ("image-float-0-255", dict(first_image=float_image() * 255), ["first_image", "..255", "0..1"]),
    ("image-nan", dict(first_image=nan_image()), ["first_image", "NaN", "fix the node"]),
    ("image-int32", dict(first_image=np.zeros((64, 64, 3), np.int32)), ["first_image", "int32", "uint8 0..255"]),
    ("image-tiny", dict(first_image=np.zeros((8, 12, 3), np.uint8)), ["first_image", "12x8 pixels", "16x16"]),
    ("image-narrow", dict(last_image=np.zeros((64, 8, 3), np.uint8)), ["last_image", "8x64 pixels", "16x16"]),
    ("image-short", dict(last_image=np.zeros((1, 8, 64, 3), np.float32)), ["last_image", "64x8 pixels", "16x16"]),
    ("image-list", dict(first_image=[[0, 0, 0]]), ["first_image", "is a list", "PIL image or an [H,W,3] array"]),
    # references
    ("ten-image-references", dict(reference_images=[rgb()] * 10), ["10 image references", "at most 9", "drop 1"]),
    ("reference-rgba", dict(reference_images=[rgb(), Image.new("RGBA", (64, 64))]),
     ["reference_images[1]", "RGBA", "RGB"]),
    ("reference-tiny", dict(reference_images=[np.zeros((1, 8, 8, 3), np.float32)]),
     ["reference_images[0]", "8x8", "16x16"]),
    ("audio-alone", dict(reference_audio=audio()), ["audio reference", "alone", "at least one image reference"]),
    ("audio-nan", dict(reference_images=[rgb()], reference_audio=nan_audio()),
     ["reference_audio", "NaN", "fix the node"]),
    ("audio-3-channels", dict(reference_images=[rgb()], reference_audio=audio(channels=3)),
     ["reference_audio", "(3, 160)", "[channels (1 or 2), samples]"]),
    ("audio-4d", dict(reference_images=[rgb()], reference_audio=AudioClip(np.zeros((1, 1, 2, 160), np.float32), 160)),
     ["reference_audio", "(1, 1, 2, 160)", "[channels (1 or 2), samples]"]),
    ("audio-int16", dict(reference_images=[rgb()], reference_audio=AudioClip(np.zeros((1, 160), np.int16), 160)),
     ["reference_audio", "int16", "float samples in -1..1"]),
    ("audio-rate-zero", dict(reference_images=[rgb()], reference_audio=audio(rate=0)),
     ["sample_rate is 0", "positive rate in Hz"]),
    ("audio-rate-negative", dict(reference_images=[rgb()], reference_audio=audio(rate=-16000)),
     ["sample_rate is -16000", "positive rate in Hz"]),
    ("audio-rate-too-high", dict(reference_images=[rgb()], reference_audio=audio(rate=500_000)),
     ["sample_rate is 500000", "at most 384000"]),
    ("audio-rate-float", dict(reference_images=[rgb()], reference_audio=audio(rate=44100.0)),
     ["sample_rate is 44100.0", "positive rate in Hz"]),
    ("audio-rate-bool", dict(reference_images=[rgb()], reference_audio=audio(rate=True)),
     ["sample_rate is True", "positive rate in Hz"]),
    ("audio-too-short", dict(reference_images=[rgb()], reference_audio=audio(samples=10, rate=16000)),
     ["reference_audio is 0.001 s", "at least 0.1 s"]),
    ("audio-not-clip", dict(reference_images=[rgb()], reference_audio=np.zeros((2, 160), np.float32)),
     ["reference_audio is a ndarray", "AudioClip"]),
    # workflow mix
    ("keyframes-and-references", dict(first_image=rgb(), reference_images=[rgb()]),
     ["keyframes and references", "fl2va", "ref2va", "disconnect one"]),
    ("keyframes-and-audio", dict(last_image=rgb(), reference_audio=audio()),
     ["keyframes and references", "disconnect one"]),
]


@pytest.mark.parametrize("overrides,words", [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
def test_catalogue_of_refusals(overrides, words):
    fields = dict(prompt="a red fox runs through snow, wind howling")
    fields.update(overrides)
    with pytest.raises(RequestError) as err:
        validate_request(H3Request(**fields))
    msg = str(err.value)
    for word in words:
        assert word in msg, f"{word!r} missing from: {msg}"


def test_request_error_is_a_value_error():
    assert issubclass(RequestError, ValueError)


# ----------------------------------------------------------------------------------------------- frame arithmetic
@pytest.mark.parametrize(
    "asked,snapped",
    [(121, 124), (124, 124), (125, 141), (107, 107), (5, 5), (0, 5), (-40, 5), (345, 345), (346, 362)],
    ids=lambda v: str(v),
)
def test_snap_frames(asked, snapped):
    got = snap_frames(asked)
    assert got == snapped
    assert got % 17 == 5 and got >= asked


def test_valid_frame_range():
    lo, hi = valid_frame_range()
    assert (lo, hi) == (124, 345)
    assert lo / 24 >= 5.0 and (lo - 17) / 24 < 5.0
    assert hi / 24 <= 15.0 and (hi + 17) / 24 > 15.0


@pytest.mark.parametrize("asked,snapped", [(345, 345), (124, 124), (121, 124), (np.int64(130), 141)], ids=str)
def test_check_frames_accepts_and_snaps(asked, snapped):
    got = check_frames(asked)
    assert got == snapped and type(got) is int


# ----------------------------------------------------------------------------------------------- valid requests
def test_t2va_request_is_valid_with_defaults():
    r = validate_request(H3Request(prompt="rain on a tin roof", num_frames=121, steps=8, seed=MAX_SEED))
    assert isinstance(r, ValidRequest)
    v, params = r.encode, r.params
    assert r.workflow == v.workflow == "t2va"
    assert (v.height, v.width, v.num_frames, params.steps, params.seed) == (None, None, 124, 8, MAX_SEED)
    assert v.first_image is None and v.reference_images == [] and v.reference_audio is None
    assert not hasattr(v, "steps") and not hasattr(v, "seed")  # the encode part carries no denoise parameters


def test_t2va_canvas_at_the_aspect_limits_is_valid():
    assert validate_encode(H3Request(prompt="p", height=64, width=256)).width == 256
    assert validate_encode(H3Request(prompt="p", height=256, width=64)).height == 256
    v = validate_encode(H3Request(prompt="p", height=np.int64(768), width=np.int64(1344)))
    assert (v.height, v.width) == (768, 1344) and type(v.height) is int


def test_fl2va_request_gives_pil_keyframes():
    last = float_image(seed=3)
    v = validate_encode(H3Request(prompt="a door opens", height=64, width=64, first_image=rgb(), last_image=last))
    assert v.workflow == "fl2va"
    for im in (v.first_image, v.last_image):
        assert isinstance(im, Image.Image) and im.mode == "RGB" and im.size == (64, 64)
    assert v.first_image.getpixel((0, 0)) == (200, 100, 50)
    expected = np.round(last[0] * 255).astype(np.uint8)
    assert np.array_equal(np.asarray(v.last_image), expected)


def test_fl2va_with_only_a_first_frame_and_uint8_array():
    arr = np.full((32, 48, 3), 7, np.uint8)
    v = validate_encode(H3Request(prompt="p", first_image=arr))
    assert v.workflow == "fl2va" and v.last_image is None
    assert v.first_image.size == (48, 32) and v.first_image.getpixel((1, 1)) == (7, 7, 7)


def test_ref2va_request_with_two_images_and_audio_at_160_hz():
    clip = audio(channels=2, samples=160, rate=160, dtype=np.float64)
    v = validate_encode(H3Request(
        prompt="she sings along", reference_images=[rgb(), float_image(batch=False)], reference_audio=clip,
    ))
    assert v.workflow == "ref2va"
    assert len(v.reference_images) == 2
    assert all(isinstance(im, Image.Image) and im.mode == "RGB" for im in v.reference_images)
    assert v.reference_audio.sample_rate == 160
    assert v.reference_audio.waveform.shape == (2, 160) and v.reference_audio.waveform.dtype == np.float32
    assert np.allclose(v.reference_audio.waveform, clip.waveform)


def test_ref2va_mono_1d_audio_and_nine_references():
    clip = AudioClip(np.zeros(1600, np.float32), 16000)
    v = validate_encode(H3Request(prompt="p", reference_images=[rgb()] * 9, reference_audio=clip))
    assert v.workflow == "ref2va" and len(v.reference_images) == 9
    assert v.reference_audio.waveform.shape == (1, 1600)
