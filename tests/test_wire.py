"""The A<->B wire contract (comfy_h3_nodes.engine.contract.wire): bit-exact transport and refusal of every bad payload.

Fast and self-contained: no Ray, no model. Pickle protocol 5 with out-of-band buffers stands in for Ray's object store.
"""

import dataclasses
import json
import pickle
import re
import warnings

import numpy as np
import pytest
import torch

from comfy_h3_nodes.engine.contract.wire import (SCHEMA_VERSION, AdapterSpec, DenoiseCall, DenoisedLatents, EncodedRequest,
                                                 ReferenceMeta, WireError, WireTensor, summarize)

H, W, FRAMES = 64, 64, 124  # 124 = 17 * 7 + 5 -> 37 video latent frames, 207 audio latents


# ----------------------------------------------------------------------------------------------- helpers
def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def wt(t: torch.Tensor) -> WireTensor:
    return WireTensor.from_torch(t)


def randn(*shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


_BIT_VIEW = {
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.int64: torch.int64,
    torch.int32: torch.int32,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw words: equal bits means equal tensors, NaN payloads and -0.0 included."""
    return t.contiguous().view(_BIT_VIEW[t.dtype])


def assert_bit_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.equal(bits(a), bits(b))


def assert_one_sentence(msg: str) -> None:
    assert msg.rstrip().endswith("."), msg
    assert not re.search(r"\.\s+[A-Z]", msg.rstrip()[:-1]), f"more than one sentence: {msg}"


def call(**kw) -> DenoiseCall:
    fields = dict(request_id="req-call", conditioning_id="req-t2va", seed=1234, num_inference_steps=4)
    fields.update(kw)
    return DenoiseCall(**fields)


def t2va(dtype=torch.float32, **kw) -> EncodedRequest:
    fields = dict(
        request_id="req-t2va", workflow="t2va", height=H, width=W, num_frames=FRAMES,
        prompt_embeds=wt(randn(1, 15, 32, dtype=dtype, seed=1)), text_token_tags=wt(torch.arange(15) % 3),
    )
    fields.update(kw)
    return EncodedRequest(**fields)


def fl2va(**kw) -> EncodedRequest:
    fields = dict(
        request_id="req-fl2va", workflow="fl2va", keyframe_anchors=("first", "last"),
        condition_latents=(wt(randn(1, 24, 1, 4, 4, seed=2)), wt(randn(1, 24, 1, 4, 4, seed=3))),
    )
    fields.update(kw)
    return t2va(**fields)


def ref2va(**kw) -> EncodedRequest:
    fields = dict(
        request_id="req-ref2va", workflow="ref2va",
        references=(ReferenceMeta("image", False), ReferenceMeta("audio", True)),
        condition_latents=(wt(randn(1, 24, 1, 4, 6, seed=4)),),
        audio_condition_latents=(wt(randn(240, 32, seed=5)),),
    )
    fields.update(kw)
    return t2va(**fields)


def denoised(**kw) -> DenoisedLatents:
    fields = dict(
        request_id="req-t2va", workflow="t2va", height=H, width=W, num_frames=FRAMES,
        latents=wt(randn(1, 24, 37, 4, 4, seed=6)), audio_latents=wt(randn(2, 32, 207, seed=7)),
    )
    fields.update(kw)
    return DenoisedLatents(**fields)


def with_value(t: WireTensor, index, value) -> WireTensor:
    """A copy of ``t`` with one element set to ``value`` (in the tensor's own dtype)."""
    x = t.to_torch().clone()
    x[index] = value
    return wt(x)


# ----------------------------------------------------------------------------------------------- round trips
def _special_bit_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every 16-bit pattern for half types; a spread of specials plus random words for float32."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    specials = np.array(
        [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
         0x7F800000, 0xFF800000, 0x3F800000, 0xBF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF],
        dtype=np.uint32,
    )
    rng = np.random.default_rng(0)
    words = np.concatenate([specials, rng.integers(0, 2**32, 24 * 37 * 16, dtype=np.uint32)])
    return torch.from_numpy(words.view(np.int32)).view(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_round_trip_random_values_is_exact(dtype):
    x = randn(3, 5, 7, dtype=dtype, seed=11)
    assert torch.isfinite(x.float()).all()
    w = wt(x)
    assert w.dtype == str(dtype).removeprefix("torch.")
    assert w.shape == (3, 5, 7)
    y = w.to_torch()
    assert torch.equal(x, y)
    assert_bit_equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_round_trip_special_values_is_bit_exact(dtype):
    x = _special_bit_patterns(dtype)
    y = wt(x).to_torch()
    assert_bit_equal(x, y)
    # The specials really are in there: -0.0 and a subnormal survive with their sign and magnitude.
    f = y.float()
    assert (torch.signbit(f) & (f == 0)).any()
    tiny = torch.finfo(dtype).tiny
    assert ((f != 0) & (f.abs() < tiny)).any()


def test_round_trip_named_special_values():
    values = [-0.0, 0.0, 1e-40, -1e-40, 1e-45, float("inf"), float("-inf"), 3.4e38, -1.0]
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.tensor(values, dtype=dtype)
        assert_bit_equal(x, wt(x).to_torch())
    x16 = torch.tensor([-0.0, 6e-8, -6e-8, 65504.0, float("inf")], dtype=torch.float16)
    assert_bit_equal(x16, wt(x16).to_torch())


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_round_trip_integers(dtype):
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, -1, 0, 1, info.max], dtype=dtype)
    y = wt(x).to_torch()
    assert y.dtype == dtype
    assert torch.equal(x, y)


def test_bf16_travels_as_uint16_words():
    x = randn(4, 4, dtype=torch.bfloat16)
    w = wt(x)
    assert w.dtype == "bfloat16"
    assert w.data.dtype == np.uint16
    assert np.array_equal(w.data, x.view(torch.int16).numpy().view(np.uint16))


def test_from_torch_and_to_torch_share_memory():
    x = randn(8, 8)
    w = wt(x)
    assert w.data.ctypes.data == x.data_ptr()
    assert w.to_torch().data_ptr() == x.data_ptr()
    xb = randn(8, 8, dtype=torch.bfloat16)
    assert wt(xb).to_torch().data_ptr() == xb.data_ptr()


def test_from_torch_non_contiguous_and_grad_tensors():
    x = randn(6, 4).t()
    assert not x.is_contiguous()
    w = wt(x)
    assert w.data.flags["C_CONTIGUOUS"]
    assert torch.equal(w.to_torch(), x)
    g = randn(3).requires_grad_(True)
    assert torch.equal(wt(g * 2).to_torch(), (g * 2).detach())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool], ids=str)
def test_row_masks_and_timestep_indices_cross_as_bytes(dtype):
    """Schema 5: the per-forward calls carry bool row masks and uint8 timestep indices, one byte per row."""
    x = torch.tensor([0, 1, 1, 0], dtype=dtype)
    w = wt(x)
    assert w.dtype == str(dtype).removeprefix("torch.") and w.nbytes == 4
    assert torch.equal(w.to_torch(), x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.int16, torch.int8], ids=str)
def test_from_torch_refuses_dtypes_the_wire_cannot_carry(dtype):
    with pytest.raises(WireError) as err:
        wt(torch.zeros(2, dtype=dtype))
    msg = str(err.value)
    assert str(dtype).removeprefix("torch.") in msg
    assert "float32" in msg and "bfloat16" in msg  # names what would cross
    assert_one_sentence(msg)


def _ship(payload):
    """Pickle protocol 5 with out-of-band buffers handed back read-only, the way Ray's object store does."""
    buffers = []
    stream = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    frozen = [memoryview(bytes(b.raw())) for b in buffers]  # read-only copies, like object-store views
    return stream, buffers, pickle.loads(stream, buffers=frozen)


PAYLOADS = {
    "t2va-fp32": lambda: t2va(),
    "t2va-bf16": lambda: t2va(dtype=torch.bfloat16),
    "t2va-fp16": lambda: t2va(dtype=torch.float16),
    "fl2va": fl2va,
    "ref2va": ref2va,
    "denoised": denoised,
}


@pytest.mark.parametrize("make", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_pickle5_out_of_band_preserves_every_bit(make):
    sent = make().validate()
    stream, buffers, got = _ship(sent)
    # Every tensor left the stream as its own out-of-band buffer: the pickle carries no tensor bytes.
    assert len(buffers) == len(sent.tensors())
    assert sum(memoryview(b).nbytes for b in buffers) == sent.nbytes
    for name, t in sent.tensors().items():
        assert t.data.tobytes() not in stream or t.nbytes < 16, name
    assert type(got) is type(sent)
    got.validate()
    for f in dataclasses.fields(sent):
        a, b = getattr(sent, f.name), getattr(got, f.name)
        if not isinstance(a, (WireTensor, tuple)) or (isinstance(a, tuple) and a and not isinstance(a[0], WireTensor)):
            assert a == b, f.name
    assert sent.tensors().keys() == got.tensors().keys()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read-only arrays must not trip torch's non-writable warning
        for name, t in sent.tensors().items():
            r = got.tensors()[name]
            assert r.dtype == t.dtype and r.shape == t.shape, name
            assert not r.data.flags.writeable, name  # a view of the received buffer, not a copy
            assert_bit_equal(t.to_torch(), r.to_torch())


def test_pickle5_keeps_special_bf16_and_fp32_bits():
    pe = _special_bit_patterns(torch.bfloat16)[: 15 * 32].reshape(1, 15, 32)
    sent = t2va(prompt_embeds=wt(pe))  # not validated: holds NaN/inf on purpose, transport alone is under test
    _, _, got = _ship(sent)
    assert_bit_equal(pe, got.prompt_embeds.to_torch())
    lat = _special_bit_patterns(torch.float32)[: 24 * 37 * 16].reshape(1, 24, 37, 4, 4)
    sent = denoised(latents=wt(lat))
    _, _, got = _ship(sent)
    assert_bit_equal(lat, got.latents.to_torch())


# ----------------------------------------------------------------------------------------------- valid payloads
@pytest.mark.parametrize("make", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_valid_payloads_pass(make):
    p = make()
    assert p.schema_version == SCHEMA_VERSION
    assert p.validate() is p


def test_validate_with_matching_text_dim_passes():
    assert t2va().validate(text_dim=32)


def test_payload_size_cap_is_inclusive():
    p = ref2va()
    assert p.nbytes == sum(t.nbytes for t in p.tensors().values()) > 0
    p.validate(max_bytes=p.nbytes)
    with pytest.raises(WireError):
        p.validate(max_bytes=p.nbytes - 1)


def test_pipeline_inputs_per_workflow():
    inp = fl2va().pipeline_inputs()
    assert inp["keyframe_anchors"] == ("first", "last")
    assert len(inp["condition_latents"]) == 2 and inp["condition_latents"][0].shape == (1, 24, 1, 4, 4)
    inp = ref2va().pipeline_inputs()
    assert inp["normalized_references"][1] == ReferenceMeta("audio", True)
    assert inp["audio_condition_latents"][0].shape == (240, 32)
    inp = t2va(dtype=torch.bfloat16).pipeline_inputs()
    assert inp["prompt_embeds"].dtype == torch.bfloat16
    assert inp["text_token_tags"].dtype == torch.int64
    assert "condition_latents" not in inp
    assert (inp["height"], inp["width"], inp["num_frames"]) == (H, W, FRAMES)
    assert "num_inference_steps" not in inp  # the run's own, from its DenoiseCall


# ----------------------------------------------------------------------------------------------- refusals
_LAT = (1, 24, 37, 4, 4)


def _truncated_latents():
    good = denoised().latents
    return WireTensor("float32", good.data[:, :, :30])  # a short read: 30 of 37 latent frames arrived


def _flat_truncated_latents():
    good = denoised().latents
    return WireTensor("float32", good.data.reshape(-1)[:-7])


REFUSALS = [
    # (id, make payload, validate kwargs, words the message must contain)
    ("version-A->B", lambda: dataclasses.replace(t2va(), schema_version=1), {},
     ["A->B", f"version {SCHEMA_VERSION}", "version 1", "same comfy-h3 version"]),
    ("version-B->A", lambda: dataclasses.replace(denoised(), schema_version=SCHEMA_VERSION + 1), {},
     ["B->A", f"version {SCHEMA_VERSION + 1}", f"version {SCHEMA_VERSION}"]),
    ("version-missing", lambda: dataclasses.replace(denoised(), schema_version=None), {},
     ["version None", f"version {SCHEMA_VERSION}"]),
    ("latents-fp16", lambda: denoised(latents=wt(randn(*_LAT, dtype=torch.float16))), {},
     ["latents", "float16", "expected float32"]),
    ("latents-bf16", lambda: denoised(latents=wt(randn(*_LAT, dtype=torch.bfloat16))), {},
     ["latents", "bfloat16", "expected float32"]),
    ("audio-latents-fp16", lambda: denoised(audio_latents=wt(randn(2, 32, 207, dtype=torch.float16))), {},
     ["audio_latents", "float16", "float32"]),
    ("tags-float32", lambda: t2va(text_token_tags=wt(torch.zeros(15))), {},
     ["text_token_tags", "float32", "int64"]),
    ("prompt-embeds-int", lambda: t2va(prompt_embeds=wt(torch.zeros(1, 15, 32, dtype=torch.int64))), {},
     ["prompt_embeds", "int64", "float32 or float16 or bfloat16"]),
    ("latents-wrong-H", lambda: denoised(latents=wt(randn(1, 24, 37, 5, 4))), {},
     ["latents", "(1, 24, 37, 5, 4)", "(1, 24, 37, 4, 4)"]),
    ("latents-wrong-frames", lambda: denoised(latents=wt(randn(1, 24, 36, 4, 4))), {},
     ["latents", "(1, 24, 36, 4, 4)", "(1, 24, 37, 4, 4)"]),
    ("audio-latents-wrong-length", lambda: denoised(audio_latents=wt(randn(2, 32, 206))), {},
     ["audio_latents", "(2, 32, 206)", "(2, 32, 207)"]),
    ("prompt-embeds-text-dim", lambda: t2va(), {"text_dim": 64},
     ["prompt_embeds", "(1, 15, 32)", "(1, *, 64)"]),
    ("tags-wrong-length", lambda: t2va(text_token_tags=wt(torch.arange(14))), {},
     ["text_token_tags", "(14,)", "expected (15"]),
    ("prompt-embeds-no-tokens", lambda: t2va(prompt_embeds=wt(torch.zeros(1, 0, 32)),
                                             text_token_tags=wt(torch.zeros(0, dtype=torch.int64))), {},
     ["prompt_embeds", "no token rows"]),
    ("prompt-embeds-nan", lambda: t2va(prompt_embeds=with_value(t2va().prompt_embeds, (0, 3, 5), float("nan"))), {},
     ["prompt_embeds", "NaN or inf"]),
    ("prompt-embeds-inf", lambda: t2va(prompt_embeds=with_value(t2va().prompt_embeds, (0, 0, 0), float("inf"))), {},
     ["prompt_embeds", "NaN or inf"]),
    ("prompt-embeds-bf16-nan", lambda: t2va(prompt_embeds=with_value(
        t2va(dtype=torch.bfloat16).prompt_embeds, (0, 14, 31), float("nan"))), {},
     ["prompt_embeds", "NaN or inf"]),
    ("prompt-embeds-fp16-neg-inf", lambda: t2va(prompt_embeds=with_value(
        t2va(dtype=torch.float16).prompt_embeds, (0, 7, 1), float("-inf"))), {},
     ["prompt_embeds", "NaN or inf"]),
    ("latents-nan", lambda: denoised(latents=with_value(denoised().latents, (0, 23, 36, 3, 3), float("nan"))), {},
     ["latents", "NaN or inf"]),
    ("latents-inf", lambda: denoised(latents=with_value(denoised().latents, (0, 0, 0, 0, 0), float("inf"))), {},
     ["latents", "NaN or inf"]),
    ("audio-latents-neg-inf", lambda: denoised(audio_latents=with_value(
        denoised().audio_latents, (1, 31, 206), float("-inf"))), {},
     ["audio_latents", "NaN or inf"]),
    ("condition-latents-nan", lambda: fl2va(condition_latents=(
        fl2va().condition_latents[0], with_value(fl2va().condition_latents[1], (0, 1, 0, 2, 2), float("nan")))), {},
     ["condition_latents[1]", "NaN or inf"]),
    ("oversized-request", lambda: t2va(), {"max_bytes": 1000},
     ["req-t2va", "2040 bytes", "1000-byte cap", "H3_MAX_PAYLOAD_BYTES"]),
    ("oversized-latents", lambda: denoised(), {"max_bytes": 4096},
     ["req-t2va", f"{(24 * 37 * 16 + 2 * 32 * 207) * 4} bytes", "4096-byte cap"]),
    ("carrier-bf16-as-fp32", lambda: t2va(prompt_embeds=WireTensor("bfloat16", np.zeros((1, 15, 32), np.float32))), {},
     ["prompt_embeds", "claims dtype bfloat16", "float32 words", "uint16"]),
    ("carrier-fp32-as-fp64", lambda: denoised(latents=WireTensor("float32", np.zeros(_LAT, np.float64))), {},
     ["latents", "claims dtype float32", "float64 words"]),
    ("carrier-int64-as-int32", lambda: t2va(text_token_tags=WireTensor("int64", np.zeros(15, np.int32))), {},
     ["text_token_tags", "claims dtype int64", "int32 words"]),
    ("carrier-fp16-as-bf16", lambda: t2va(prompt_embeds=WireTensor("bfloat16", np.zeros((1, 15, 32), np.float16))), {},
     ["prompt_embeds", "claims dtype bfloat16", "float16 words", "uint16"]),
    ("carrier-int32-as-fp32", lambda: denoised(latents=WireTensor("float32", np.zeros(_LAT, np.int32))), {},
     ["latents", "claims dtype float32", "int32 words"]),
    ("carrier-not-numpy", lambda: t2va(prompt_embeds=WireTensor("float32", [[[0.0] * 32] * 15])), {},
     ["prompt_embeds", "list", "numpy array"]),
    ("truncated-latents", lambda: denoised(latents=_truncated_latents()), {},
     ["latents", "(1, 24, 30, 4, 4)", "(1, 24, 37, 4, 4)"]),
    ("truncated-flat-latents", lambda: denoised(latents=_flat_truncated_latents()), {},
     ["latents", f"({24 * 37 * 16 - 7},)", "(1, 24, 37, 4, 4)"]),
    ("frames-not-17n+5-request", lambda: t2va(num_frames=120), {}, ["num_frames", "120", "17 * n + 5"]),
    ("frames-not-17n+5-latents", lambda: denoised(num_frames=125), {}, ["num_frames", "125", "17 * n + 5"]),
    ("frames-negative", lambda: t2va(num_frames=-12), {}, ["num_frames", "-12", "17 * n + 5"]),
    ("frames-float", lambda: t2va(num_frames=124.0), {}, ["num_frames", "124.0", "17 * n + 5"]),
    ("height-not-32", lambda: t2va(height=80), {}, ["height", "80", "multiple of 32"]),
    ("width-not-32", lambda: denoised(width=48), {}, ["width", "48", "multiple of 32"]),
    ("height-zero", lambda: t2va(height=0), {}, ["height", "0", "positive multiple of 32"]),
    ("empty-request-id", lambda: t2va(request_id=""), {}, ["request_id", "''", "non-empty"]),
    ("request-id-not-str", lambda: denoised(request_id=7), {}, ["request_id", "7", "non-empty string"]),
    ("unknown-workflow", lambda: t2va(workflow="i2v"), {}, ["workflow", "'i2v'", "t2va", "fl2va", "ref2va"]),
    ("steps-zero", lambda: call(num_inference_steps=0), {}, ["num_inference_steps", "0", "positive integer"]),
    ("steps-bool", lambda: call(num_inference_steps=True), {}, ["num_inference_steps", "True", "positive integer"]),
    ("seed-negative", lambda: call(seed=-1), {}, ["seed", "-1", "2**64"]),
    ("seed-too-big", lambda: call(seed=2**64), {}, ["seed", str(2**64), "2**64"]),
    ("call-empty-request-id", lambda: call(request_id=""), {}, ["request_id", "''", "non-empty"]),
    ("call-adapter-weight", lambda: call(adapters=(AdapterSpec("/b/lora.safetensors", 11.0),)), {},
     ["adapters[0].weight", "11.0", "-10..10"]),
    ("call-for-another-payload", lambda: call(conditioning_id="other"), {"payload": t2va()},
     ["req-call", "other", "req-t2va"]),
    ("call-old-schema", lambda: call(schema_version=1), {}, ["A->B call", "version 1", f"version {SCHEMA_VERSION}"]),
    ("tensor-not-wiretensor", lambda: t2va(prompt_embeds=randn(1, 15, 32)), {},
     ["prompt_embeds", "Tensor", "WireTensor"]),
    ("fl2va-two-anchors-one-latent", lambda: fl2va(condition_latents=fl2va().condition_latents[:1]), {},
     ["fl2va", "1 condition_latents", "2 keyframe_anchors", "one to one"]),
    ("fl2va-one-anchor-two-latents", lambda: fl2va(keyframe_anchors=("first",)), {},
     ["2 condition_latents", "1 keyframe_anchors"]),
    ("fl2va-no-anchors", lambda: fl2va(keyframe_anchors=(), condition_latents=()), {},
     ["keyframe_anchors", "()", "1 or 2", "first", "last"]),
    ("fl2va-unknown-anchor", lambda: fl2va(keyframe_anchors=("first", "middle")), {},
     ["keyframe_anchors", "'middle'", "first", "last"]),
    ("fl2va-latent-wrong-size", lambda: fl2va(condition_latents=(
        wt(randn(1, 24, 1, 4, 6)), fl2va().condition_latents[1])), {},
     ["condition_latents[0]", "(1, 24, 1, 4, 6)", "(1, 24, *, 4, 4)"]),
    ("ref2va-no-references", lambda: ref2va(references=()), {}, ["ref2va", "no references", "t2va"]),
    ("ref2va-unknown-kind", lambda: ref2va(references=(ReferenceMeta("image", False), ReferenceMeta("text", True))),
     {}, ["references[1].kind", "'text'", "image", "video", "audio"]),
    ("ref2va-visual-count", lambda: ref2va(references=(ReferenceMeta("image", False), ReferenceMeta("video", True))), {},
     ["1 condition_latents", "2 image/video"]),
    ("ref2va-audio-count", lambda: ref2va(audio_condition_latents=()), {},
     ["0 audio_condition_latents", "1 audio-bearing"]),
    ("ref2va-audio-latent-channels", lambda: ref2va(audio_condition_latents=(wt(randn(240, 16)),)), {},
     ["audio_condition_latents[0]", "(240, 16)", "(*, 32)"]),
    ("t2va-with-condition-latents", lambda: t2va(condition_latents=fl2va().condition_latents), {},
     ["t2va", "keyframes or references", "fl2va or ref2va"]),
    ("t2va-with-references", lambda: t2va(references=(ReferenceMeta("image", False),)), {},
     ["t2va", "keyframes or references"]),
]


@pytest.mark.parametrize("make,kwargs,words", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals(make, kwargs, words):
    payload = make()
    with pytest.raises(WireError) as err:
        payload.validate(**kwargs)
    msg = str(err.value)
    for word in words:
        assert word in msg, f"{word!r} missing from: {msg}"
    assert_one_sentence(msg)


def test_refusals_are_value_errors():
    assert issubclass(WireError, ValueError)


# ----------------------------------------------------------------------------------------------- summarize
def test_summarize_is_json_and_has_no_tensor_data():
    s = summarize(ref2va())
    back = json.loads(json.dumps(s))
    assert back["workflow"] == "ref2va"
    assert back["prompt_embeds"] == {"dtype": "float32", "shape": [1, 15, 32]}
    assert back["text_token_tags"] == {"dtype": "int64", "shape": [15]}
    assert back["condition_latents"] == [{"dtype": "float32", "shape": [1, 24, 1, 4, 6]}]
    assert back["audio_condition_latents"] == [{"dtype": "float32", "shape": [240, 32]}]
    assert back["references"] == [{"kind": "image", "has_audio": False}, {"kind": "audio", "has_audio": True}]
    assert back["schema_version"] == SCHEMA_VERSION
    assert len(json.dumps(s)) < 1000


@pytest.mark.parametrize("make", list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_summarize_every_payload_is_json(make):
    p = make()
    s = summarize(p)
    text = json.dumps(s)
    for f in dataclasses.fields(p):  # tensor descriptions are plain lists, in one form for single and tuple fields
        v = getattr(p, f.name)
        for entry in ([s[f.name]] if isinstance(v, WireTensor) else s[f.name] if v and isinstance(v, tuple)
                      and isinstance(v[0], WireTensor) else []):
            assert type(entry["shape"]) is list and entry["shape"] == list(entry["shape"]), f.name
            assert entry["dtype"] in ("float32", "float16", "bfloat16", "int64")
    assert set(s) == {f.name for f in dataclasses.fields(p)}
    assert json.loads(text)["request_id"] == p.request_id
    for name in p.tensors():
        assert name.split("[")[0] in s


def test_decoded_clip_whole_or_its_tiles_from_one_on():
    """B's clip of a split decode: the whole clip (1, 3, F, H, W), or (where the shares meet) its tiles from
    ``first_tile`` on, each no larger than the canvas; anything else is refused in one sentence."""
    from comfy_h3_nodes.engine.contract.wire import DecodedClip, WireError

    def clip(shape, first=0):
        return DecodedClip("r", 3, 7, WireTensor("float32", np.zeros(shape, np.float32)), first)

    assert clip((1, 3, 28, 96, 320)).validate(96, 320)
    assert clip((1, 3, 28, 96, 256), first=1).validate(96, 320)
    with pytest.raises(WireError, match="clip 3 frames"):
        clip((1, 3, 28, 96, 256)).validate(96, 320)  # tiles where the whole clip was announced
    with pytest.raises(WireError, match=r"clip 3's tiles are 96x384, not tiles of the 96x320 canvas"):
        clip((1, 3, 28, 96, 384), first=1).validate(96, 320)
    with pytest.raises(WireError, match=r"clip 3's first tile is -1; expected an int >= 0"):
        clip((1, 3, 28, 96, 256), first=-1).validate(96, 320)
