"""Live previews of B's denoise: the estimate B previews (against diffusers' own packing and H3's scheduler), the
colour map, the wire contract, and previews reaching H3RemoteDenoise's progress bar on the two-node cluster."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.model import preview
from conftest import PROMPT

RNG = np.random.default_rng(7)
FACTORS = tuple(tuple(float(v) for v in row) for row in RNG.uniform(-0.3, 0.3, (24, 3)))


def spec(**kw) -> wire.PreviewSpec:
    return wire.PreviewSpec("latent2rgb", kw.pop("factors", FACTORS), (0.1, -0.1, 0.0), **kw)


def test_x0_frame_unpacks_diffusers_rows_and_follows_h3s_scheduler():
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents as pack_latents

    torch.manual_seed(0)
    x_t = torch.randn(1, 24, 5, 8, 12)
    v = torch.randn(1, 24, 5, 8, 12)
    cond = torch.randn(7, 24 * 4)  # condition rows in front of the generated ones
    rows_t = torch.cat([cond, pack_latents(x_t, (1, 2, 2))])
    rows_v = torch.cat([torch.zeros_like(cond), pack_latents(v, (1, 2, 2))])
    sched = MiniMaxH3Scheduler()
    sched.set_timesteps(6)
    i = 2
    t, t_next = sched.timesteps[i], sched.timesteps[i + 1]
    sched._step_index = i
    rows_next = rows_t.clone()
    rows_next[7:] = sched.step(rows_v[7:], t, rows_t[7:], return_dict=False)[0]
    sigma, sigma_next = 1.0 - float(t), 1.0 - float(t_next)
    for frame in (0, 2, 4):
        got = preview.x0_frame(rows_next, rows_v[None], sigma_next, condition_rows=7, grid=(5, 8, 12),
                               patch=(1, 2, 2), frame=frame)
        want = (x_t + sigma * v)[0, :, frame]  # H3's data-ward velocity: x0 = x_t + sigma * v
        assert got.shape == (24, 8, 12)
        assert torch.allclose(got, want, atol=1e-5), (frame, (got - want).abs().max())


def test_rgb_is_comfyuis_linear_map_and_jpeg_is_small():
    frame = torch.from_numpy(RNG.standard_normal((24, 6, 10)).astype(np.float32))
    rgb = preview.to_rgb(frame, spec())
    w, b = np.array(FACTORS), np.array([0.1, -0.1, 0.0])
    want = np.clip(((np.einsum("chw,ck->hwk", frame.numpy(), w) + b) + 1) / 2, 0, 1) * 255
    assert rgb.dtype == torch.uint8 and rgb.shape == (6, 10, 3)
    assert np.abs(rgb.numpy().astype(int) - want.astype(int)).max() <= 1
    jpeg, width, height = preview.encode_jpeg(rgb, 512)
    assert (width, height) == (80, 48)  # a tiny grid is enlarged by a whole factor (at most 8x)
    assert Image.open(io.BytesIO(jpeg)).size == (width, height) and len(jpeg) < 8000
    big = torch.zeros(48, 84, 3, dtype=torch.uint8)  # the default canvas 1344x768: 84 x 48 latents
    jpeg, width, height = preview.encode_jpeg(big, 64)
    assert (width, height) == (64, 37)


@pytest.mark.parametrize("bad, words", [
    (dict(factors=FACTORS[:23]), "23 rows"),
    (dict(every=-1), "preview.every"),
    (dict(max_side=4), "preview.max_side"),
    (dict(factors=((0.1, 0.2),) * 24), "(r, g, b)"),
    (dict(factors=((float("nan"), 0.0, 0.0),) * 24), "finite"),
])
def test_preview_spec_is_checked_on_arrival(bad, words):
    with pytest.raises(wire.WireError, match=words.replace("(", r"\(").replace(")", r"\)")):
        spec(**bad).validate(latent_channels=24)


def test_preview_payload_is_checked_on_arrival():
    ok = wire.Preview("r", 0, 3, b"\xff\xd8" + b"0" * 10, 64, 64).validate()
    assert ok.step == 0
    with pytest.raises(wire.WireError, match="not a JPEG"):
        wire.Preview("r", 0, 3, b"PNG", 64, 64).validate()
    with pytest.raises(wire.WireError, match="over the"):
        wire.Preview("r", 0, 3, b"\xff\xd8" + b"0" * wire.PREVIEW_MAX_BYTES, 64, 64).validate()
    with pytest.raises(wire.WireError, match="version 2"):
        wire.Preview("r", 0, 3, b"\xff\xd8", 64, 64, schema_version=2).validate()


@pytest.fixture
def previewing(local_host):
    local_host.preview, local_host.factors = "latent2rgb", ([list(r) for r in FACTORS], [0.1, -0.1, 0.0], "test")
    yield local_host
    local_host.preview, local_host.factors = "none", None


def _graph(executor, tiny_ckpt):
    import comfy_h3_nodes.nodes as N

    encoders = N.H3LoadEncoders().load(str(tiny_ckpt), "float32", "sdpa")["result"][0]
    dit = N.H3RemoteDiT().connect("local", executor.b_config.name, executor.b_config.namespace, str(tiny_ckpt),
                                  "transformer", "float32", "sdpa")["result"][0]
    cond = N.H3TextEncode().encode(encoders, PROMPT, 64, 64, 124)["result"][0]
    return N, encoders, dit, cond


def test_previews_reach_the_denoise_nodes_bar_every_step_and_change_nothing(previewing, executor, tiny_ckpt):
    N, _enc, dit, cond = _graph(executor, tiny_ckpt)
    start = len(previewing.events)
    out = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 5, 40, unique_id="5"))
    events = previewing.events[start:]
    shown = [d for e, d in events if e == "h3.preview"]
    # 40 sigma points = 39 forwards; A shows the newest preview of each poll, the final step's always
    steps = [d["step"] for d in shown]
    assert len(steps) >= 2 and steps == sorted(set(steps)) and steps[-1] == 38, steps
    assert all(d["node"] == "5" and (d["width"], d["height"]) == (32, 32) and 200 < d["bytes"] < 8000
               for d in shown)
    progress = [d for e, d in events if e == "h3.progress"]
    assert [p["preview"]["step"] - 1 for p in progress if "preview" in p] == steps
    assert "images" not in out["ui"]  # the frontend keeps the last live preview on the node, as for its samplers
    summary = out["ui"]["h3_timing"][0]["summary"]["preview"]
    assert len(steps) <= summary["count"] <= 39 and summary["size"] == [32, 32] and summary["source"] == "test"
    # B previews every k-th step, k re-chosen as it goes so previews cost <= 1 % of a step (on a loaded machine k
    # changes during the run, so the count is only bounded by the final k from above)
    assert 2 <= summary["count"] <= 39 and summary["every"] >= 1
    assert 0 < summary["cost_s"] and summary["share_of_step"] > 0
    # previews read B's state and change nothing: the same seed without them gives the same latents
    with_pv = out["result"][0][0].latents().latents.to_torch()
    previewing.preview = "none"
    out = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 5, 40, unique_id="5"))
    assert torch.equal(out["result"][0][0].latents().latents.to_torch(), with_pv)
    assert out["ui"]["h3_timing"][0]["summary"]["preview"]["note"].startswith("previews off")


def test_preview_method_none_sends_none(local_host, executor, tiny_ckpt):
    N, _enc, dit, cond = _graph(executor, tiny_ckpt)
    local_host.factors = ([list(r) for r in FACTORS], [0.0, 0.0, 0.0], "test")
    try:
        start = len(local_host.events)
        asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 5, 3, unique_id="7"))
        assert not [e for e, _ in local_host.events[start:] if e == "h3.preview"]
    finally:
        local_host.factors = None


def test_factors_for_other_channels_are_not_sent(previewing, executor, tiny_ckpt):
    from comfy_h3_nodes.nodes.common import preview_spec

    previewing.factors = ([[0.0, 0.0, 0.0]] * 16, [0.0, 0.0, 0.0], "another model")
    got, note = preview_spec(24)
    assert got is None and "16-channel factors of another model" in note


def test_b_refuses_previews_it_cannot_make_without_failing_the_denoise(executor, tiny_ckpt):
    """A DenoiseCall with factors for 16 channels: B denoises and says why there are no previews."""
    import dataclasses

    from comfy_h3_nodes.engine.contract.request import H3Request

    req = H3Request(prompt=PROMPT, height=64, width=64, num_frames=124, steps=3, seed=1)
    bad = wire.PreviewSpec("latent2rgb", ((0.0, 0.0, 0.0),) * 16)
    job = executor.submit_denoise(executor.encode(req), dataclasses.replace(req.params(), preview=bad))
    job.result()
    den = next(r for r in job.records if r.stage == "denoise")
    assert "no previews" in den.note and "16 rows" in den.note


# ------------------------------------------------------------------------------------------------ latent previews
def test_latent_preview_payload_is_checked_on_arrival():
    frame = np.zeros((24, 4, 6), np.float16)
    ok = wire.Preview("r", 0, 3, b"", 6, 4, latent=frame).validate()
    assert ok.latent.shape == (24, 4, 6)
    for bad, words in ((frame.astype(np.float32), "expected a float16"), (frame[0], "expected a float16"),
                       (np.zeros((24, 5, 6), np.float16), "has shape"), (np.zeros((80, 4, 6), np.float16), "has shape"),
                       (np.full((24, 4, 6), np.nan, np.float16), "NaN")):
        with pytest.raises(wire.WireError, match=words):
            wire.Preview("r", 0, 3, b"", 6, 4, latent=bad).validate()
    big = np.zeros((64, 130, 130), np.float16)  # over PREVIEW_MAX_LATENT_BYTES
    with pytest.raises(wire.WireError, match="over the"):
        wire.Preview("r", 0, 3, b"", 130, 130, latent=big).validate()


def test_b_sends_its_latent_frame_when_a_decodes_previews():
    """Method ``latent``: B's preview is the float16 estimate of the frame latent2rgb would have drawn."""
    grid, patch = (3, 4, 6), (1, 2, 2)
    rows = 2 + 3 * (4 // 2) * (6 // 2)
    lat = torch.randn(rows, 24 * 4, generator=torch.Generator().manual_seed(1))
    vel = torch.randn(rows, 24 * 4, generator=torch.Generator().manual_seed(2))
    pv = preview.Previewer(wire.PreviewSpec("latent", FACTORS), "r").make(
        0, 3, lat, vel, 0.5, condition_rows=2, grid=grid, patch=patch, step_s=1.0).validate()
    x0 = preview.x0_frame(lat, vel, 0.5, condition_rows=2, grid=grid, patch=patch, frame=1)
    assert pv.jpeg == b"" and (pv.width, pv.height) == (6, 4) and pv.latent.dtype == np.float16
    assert np.array_equal(pv.latent, x0.half().numpy())


def test_taesd_without_taeh3_says_on_the_node_that_latent2rgb_ran_and_why(previewing, executor, tiny_ckpt):
    """``--preview-method taesd`` and no taeh3 file in vae_approx: B sends latent2rgb previews, and the summary the
    node shows carries the fallback (what ran, what was asked, the missing file) beside the count, not only a note."""
    previewing.preview = "taesd"
    try:
        N, _enc, dit, cond = _graph(executor, tiny_ckpt)
        out = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 5, 6, unique_id="5"))
    finally:
        previewing.preview = "latent2rgb"
    summary = out["ui"]["h3_timing"][0]["summary"]["preview"]
    assert summary["count"] >= 1 and summary["size"] == [32, 32]
    assert summary["fallback"] == ("previews: latent2rgb (taesd asked, no taeh3.safetensors in ComfyUI's "
                                   "vae_approx)") == summary["note"]
    # latent2rgb asked for: no fallback to explain
    out = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 5, 6, unique_id="5"))
    assert "fallback" not in out["ui"]["h3_timing"][0]["summary"]["preview"]


@pytest.fixture
def decoding(previewing):
    """The local host with a preview decoder (what ComfyHost finds as taeh3 in vae_approx): latent2rgb of the frame
    it gets, 4x larger, so what reaches the bar is visibly the decoder's."""
    got = []

    def decode(latent):
        got.append(latent)
        rgb = preview.to_rgb(torch.from_numpy(latent.astype(np.float32)), spec())
        img = Image.fromarray(rgb.numpy(), "RGB")
        img = img.resize((img.width * 4, img.height * 4))
        buf = io.BytesIO()
        img.save(buf, format="JPEG")
        return buf.getvalue(), img.width, img.height

    previewing.preview, previewing.decoder = "taesd", (decode, "test decoder")
    yield previewing, got
    previewing.decoder = None


def test_taesd_previews_are_decoded_on_a_by_the_hosts_decoder(decoding, executor, tiny_ckpt):
    host, got = decoding
    N, _enc, dit, cond = _graph(executor, tiny_ckpt)
    start = len(host.events)
    out = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 5, 6, unique_id="5"))
    shown = [d for e, d in host.events[start:] if e == "h3.preview"]
    # a 64x64 canvas is a 4x4 latent frame: the decoder got it as it is and drew it 4x larger (16x16)
    assert shown and all((d["width"], d["height"]) == (16, 16) for d in shown), shown
    assert got and all(x.dtype == np.float16 and x.shape == (24, 4, 4) for x in got)
    summary = out["ui"]["h3_timing"][0]["summary"]["preview"]
    assert "A decodes it with test decoder" in summary["note"] and summary["source"] == "test decoder"


def test_a_decoder_that_fails_costs_the_preview_not_the_denoise(decoding, executor, tiny_ckpt):
    host, _ = decoding

    def broken(latent):
        raise RuntimeError("decoder file is damaged")

    host.decoder = (broken, "broken decoder")
    N, _enc, dit, cond = _graph(executor, tiny_ckpt)
    start = len(host.events)
    out = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 5, 4, unique_id="5"))
    assert out["result"][0][0].latents().latents.to_torch().isfinite().all()
    assert not [d for e, d in host.events[start:] if e == "h3.preview"]
    assert [d for e, d in host.events[start:] if e == "h3.progress"]  # the steps still show
