"""The in-process A/B split over the wire contract is bit-identical to diffusers' single-process pipeline."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from comfy_h3_nodes.engine.contract import wire
from conftest import call_of, denoise, single_process_reference, workflow_request

WORKFLOWS = ("t2va", "fl2va", "ref2va")


@pytest.fixture(scope="module")
def sides(tiny_ckpt):
    from comfy_h3_nodes.engine.a_side.side import ASide
    from remote_worker.b_side import BSide

    return ASide(tiny_ckpt, dtype="float32"), BSide(tiny_ckpt, dtype="float32")


def _over_the_wire(payload):
    """Serialise the way Ray does (pickle 5, numpy buffers out of band) and read back."""
    buffers = []
    data = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=[b.raw() for b in buffers])


@pytest.mark.parametrize("workflow", WORKFLOWS)
def test_split_bit_exact(sides, tiny_ckpt, media, workflow):
    a, b = sides
    req, _ = workflow_request(workflow, media)
    enc = _over_the_wire(a.encode(req))
    assert enc.workflow == workflow
    res = b.denoise(enc.validate(text_dim=b.text_dim), call_of(req, enc))
    latents = _over_the_wire(res.latents)
    out = a.decode_raw(latents, "np")
    expected = single_process_reference(tiny_ckpt, workflow, media)
    assert np.array_equal(out["videos"], expected["videos"])
    assert torch.equal(out["audio"], expected["audio"])
    assert len(res.steps) == 2  # 3 sigma points = 2 transformer forwards
    # the seed matters: a different seed is a different video
    other = denoise(b, a, workflow_request(workflow, media, seed=8)[0])
    assert not np.array_equal(other.latents.latents.data, res.latents.latents.data)


def test_split_bit_exact_bf16(tiny_ckpt, media):
    from comfy_h3_nodes.engine.a_side.side import ASide
    from remote_worker.b_side import BSide

    a, b = ASide(tiny_ckpt, dtype="bfloat16"), BSide(tiny_ckpt, dtype="bfloat16")
    req, _ = workflow_request("t2va", media)
    enc = _over_the_wire(a.encode(req))
    assert enc.prompt_embeds.dtype == "bfloat16" and enc.prompt_embeds.data.dtype == np.uint16
    out = a.decode_raw(_over_the_wire(b.denoise(enc, call_of(req, enc)).latents), "np")
    expected = single_process_reference(tiny_ckpt, "t2va", media, dtype="bfloat16")
    assert np.array_equal(out["videos"], expected["videos"])
    assert torch.equal(out["audio"], expected["audio"])


def test_decode_returns_comfy_ready_media(sides, media):
    a, b = sides
    req, _ = workflow_request("t2va", media)
    decoded = a.decode(denoise(b, a, req).latents)
    assert decoded.frames.shape == (124, 64, 64, 3) and decoded.frames.dtype == np.float32
    assert 0.0 <= decoded.frames.min() and decoded.frames.max() <= 1.0
    assert decoded.audio.shape[0] == 2 and decoded.sample_rate == 160 and decoded.fps == 24


def test_t2va_without_size_gets_default_canvas(sides, media):
    a, b = sides
    req, _ = workflow_request("t2va", media, height=None, width=None)
    enc = a.encode(req)
    assert (enc.height, enc.width) == a.default_canvas()
    assert enc.width > enc.height  # 16:9


def test_b_rejects_payload_for_other_text_dim(sides, media):
    a, b = sides
    enc = a.encode(workflow_request("t2va", media)[0])
    with pytest.raises(wire.WireError, match="prompt_embeds has shape"):
        enc.validate(text_dim=b.text_dim * 2)


def test_b_cancel_between_steps(sides, media):
    from comfy_h3_nodes.engine.contract.errors import DenoiseCancelled

    a, b = sides
    req = workflow_request("t2va", media, steps=6)[0]
    enc = a.encode(req)
    seen = []
    with pytest.raises(DenoiseCancelled, match="before step 3/5"):
        b.denoise(enc, call_of(req, enc), on_step=seen.append, should_cancel=lambda: len(seen) >= 2)
    assert len(seen) == 2
    # B keeps serving after a cancel
    assert len(b.denoise(enc, call_of(req, enc)).steps) == 5


def test_b_swaps_partition_and_records_it(tiny_ckpt, media):
    from comfy_h3_nodes.engine.a_side.side import ASide
    from remote_worker.b_side import BSide

    # residency "one": the tiny model's plan would keep both partitions resident (no swap at all)
    a, b = ASide(tiny_ckpt, dtype="float32"), BSide(tiny_ckpt, dtype="float32", partition="transformer",
                                                    residency="one")
    res = denoise(b, a, workflow_request("ref2va", media)[0])
    assert b.partition == "transformer_ref" and res.swap_s > 0
    assert [r.reason for r in b.load_records][-1] == "swap transformer -> transformer_ref"
    fixed = BSide(tiny_ckpt, dtype="float32", partition="transformer", allow_swap=False)
    with pytest.raises(RuntimeError, match="--partition transformer_ref"):
        denoise(fixed, a, workflow_request("ref2va", media)[0])


def test_receivers_validate_once(sides, media, monkeypatch):
    """The actors validate a received payload (timed apart from the transfer) and tell the side not to repeat it."""
    a, b = sides
    req = workflow_request("t2va", media)[0]
    enc = a.encode(req)
    calls = []
    real = wire.EncodedRequest.validate
    monkeypatch.setattr(wire.EncodedRequest, "validate", lambda self, *x, **k: (calls.append(1), real(self, *x, **k))[1])
    b.denoise(enc, call_of(req, enc), validated=True)
    assert calls == []
    b.denoise(enc, call_of(req, enc))
    assert calls == [1]
