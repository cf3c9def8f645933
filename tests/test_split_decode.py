"""Split decode: B decodes the last clips of a request's video from the latents it holds, A the rest and blends them;
the frames are bit-identical to diffusers' own decode (torch pinned to one thread on both sides, conftest.py)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

from comfy_h3_nodes.engine.executor import decode_plan as dp
from comfy_h3_nodes.engine.model import split_decode as sd
from comfy_h3_nodes.engine.contract import wire
from conftest import single_process_reference, workflow_request


def _latents(frames: int, height: int = 64, width: int = 96, seed: int = 0) -> wire.DenoisedLatents:
    g = torch.Generator().manual_seed(seed)
    lat_f = wire.video_latent_frames(frames)
    return wire.DenoisedLatents(
        f"unit-{frames}-{seed}", "t2va", height, width, frames,
        wire.WireTensor.from_torch(torch.randn(1, 24, lat_f, height // 16, width // 16, generator=g)),
        wire.WireTensor.from_torch(torch.randn(2, 32, wire.audio_latent_frames(frames), generator=g)))


@pytest.fixture(scope="module")
def a_side(tiny_ckpt):
    from comfy_h3_nodes.engine.a_side.side import ASide

    return ASide(str(tiny_ckpt), dtype="float32")


# ---------------------------------------------------------------------------------------------------- no cluster
@pytest.mark.parametrize("frames,b_clips", [(39, 1), (124, 1), (124, 3), (124, 6), (124, 7)])
def test_split_decode_shares_blend_bit_exact(a_side, frames, b_clips):
    """Clips [n-k, n) decoded as a share, the rest decoded in the blend: the frames diffusers' decode gives."""
    lat = _latents(frames)
    expected = a_side.decode(lat)
    n = a_side.num_clips(lat)
    assert n == {39: 2, 124: 7}[frames]
    share = a_side.decode_share(lat, n - b_clips, n)
    clips = {share.start + j: c for j, c in enumerate(share.clips)}
    media, log = a_side.decode_split(lat, clips.get)
    assert np.array_equal(media.frames, expected.frames) and np.array_equal(media.audio, expected.audio)
    assert log.served == list(range(n - b_clips, n)) and log.decoded == list(range(n - b_clips))


@pytest.fixture
def small_tiles(a_side):
    """The tiny VAE tiled in 48-pixel tiles (16 of overlap): 2 x 3 tiles per clip of a 64x96 canvas."""
    vae = a_side.vae
    names = ("tile_sample_min_height", "tile_sample_min_width", "tile_sample_min_overlap_height",
             "tile_sample_min_overlap_width")
    saved = [getattr(vae, k) for k in names]
    for k, v in zip(names, (48, 48, 16, 16)):
        setattr(vae, k, v)
    yield vae
    for k, v in zip(names, saved):
        setattr(vae, k, v)


@pytest.mark.parametrize("first_tile", [1, 4, 5])
def test_split_decode_share_from_a_tile_blends_bit_exact(a_side, small_tiles, first_tile):
    """B's share starting inside a clip (its tiles from ``first_tile`` on, then the later clips whole), A decoding
    the tiles before it and stitching them with diffusers' own code: the frames diffusers' decode gives."""
    lat = _latents(124)
    expected = a_side.decode(lat)
    n = a_side.num_clips(lat)
    tiles = sd.tiles_for(sd.geometry(small_tiles), 64, 96)
    assert tiles == 6 == len(sd.tile_inputs(small_tiles, sd.clip_inputs(small_tiles, lat.latents.to_torch())[3]))
    share = a_side.decode_share(lat, 3, n, first_tile=first_tile)
    part = share.clips[0]
    assert isinstance(part, sd.Tiles) and part.first == first_tile and part.tiles.shape[0] == tiles - first_tile
    clips = {share.start + j: c for j, c in enumerate(share.clips)}
    media, log = a_side.decode_split(lat, clips.get)
    assert np.array_equal(media.frames, expected.frames) and np.array_equal(media.audio, expected.audio)
    assert log.served == [4, 5, 6] and log.decoded == [0, 1, 2, 3] and log.partial == {3: first_tile}
    # A tiling its clips otherwise than B did (64-pixel columns: 2 x 2 tiles) refuses B's tiles, never stitches them
    small_tiles.tile_sample_min_width = 64
    with pytest.raises(sd.SplitDecodeError, match=r"B's tiles of clip 3 (\(from tile \d, \d of them\) do not fit the "
                                                  r"clip's 4 tiles|start at tile \d; the clip has 4)"):
        a_side.decode_split(lat, clips.get)
    small_tiles.tile_sample_min_width = 48
    with pytest.raises(sd.SplitDecodeError, match="the clip has 6 tiles"):
        a_side.decode_share(lat, 3, n, first_tile=6)
    assert "forward" not in small_tiles.decoder.__dict__  # the decoder is the VAE's own again
    # B's tiles are asked for only once A decoded its own tiles of the clip; when they never come (B's share lost)
    # A decodes them too, and the frames are still diffusers'
    order = []
    hook = small_tiles.decoder.register_forward_pre_hook(lambda m, a: order.append("tile"))
    try:
        late = {**clips, 3: sd.Tiles(first_tile, lambda: order.append("B's tiles") or time.sleep(1.0) or part.tiles)}
        media, log = a_side.decode_split(lat, late.get)
        assert np.array_equal(media.frames, expected.frames)
        assert order.index("B's tiles") == 3 * 6 + first_tile + 1, order  # right after the call for B's first
        assert log.decoded_s[3] < 1.0, log.decoded_s  # A's own time in the clip, without the 1 s wait for B's
        lost = {**clips, 3: sd.Tiles(first_tile, lambda: None)}
        media, log = a_side.decode_split(lat, lost.get)
    finally:
        hook.remove()
    assert np.array_equal(media.frames, expected.frames) and log.partial == {} and log.decoded == [0, 1, 2, 3]


def test_split_decode_refuses_a_foreign_clip_window(a_side):
    """A clip whose input differs from diffusers' own slice is refused, never blended."""
    lat, other = _latents(124, seed=1), _latents(124, seed=2)
    media_ref = a_side.decode(lat)
    with pytest.raises(sd.SplitDecodeError, match="another latent window"):
        with sd.serve_clips(a_side.vae, other.latents.to_torch(), lambda i: None):
            a_side.decode_raw(lat)
    assert np.array_equal(a_side.decode(lat).frames, media_ref.frames)  # the override is gone afterwards


def test_split_decode_share_policy():
    assert dp.choose_b_clips(7, 1.0, 1.0) == 3  # equal machines: A 4, B 3 (a tie goes to fewer B clips)
    assert dp.choose_b_clips(7, 1.0, 1.0, fetch_clip_s=0.2) == 3  # B's 3.6 s hide behind A's 4 s
    assert dp.choose_b_clips(20, 1.0, 1.0) == 10
    assert dp.choose_b_clips(7, 1.0, 2.0) == 2  # a slower B gets fewer clips
    assert dp.choose_b_clips(7, 2.0, 1.0) == 5  # a slower A gives more to B (A 2 x 2 s, B 5 x 1 s)
    assert dp.choose_b_clips(7, 1.0, 50.0) == 0  # far slower: A alone
    # B's frames cross while A decodes its own: dear frames still pay while they hide behind A's clips (B 2 clips
    # + 3 s of frames = A's 5 clips), and never once they cost more than the clips themselves
    assert dp.choose_b_clips(7, 1.0, 1.0, fetch_clip_s=1.5) == 2
    assert dp.predicted_s(7, 2, 1.0, 1.0, fetch_clip_s=1.5) == pytest.approx(5.0)
    assert dp.choose_b_clips(7, 1.0, 1.0, fetch_clip_s=7.0) == 0  # frames dearer than A alone: A alone
    clock = dp.ClipClock()
    clock.add("A", 4, 2.0, 100, 100)
    assert clock.clip_s("A", 200, 100) == pytest.approx(1.0)  # scales with the canvas
    assert clock.clip_s("B", 100, 100) is None


# ---------------------------------------------------------------------------------------------------- cluster
@pytest.mark.parametrize("workflow", ["t2va", "fl2va", "ref2va"])
def test_split_decode_two_node_bit_exact(executor, tiny_ckpt, media, workflow):
    """Every workflow, B with one clip, several clips, and all but A's one clip: diffusers' frames bit for bit."""
    req, _ = workflow_request(workflow, media)
    expected = single_process_reference(tiny_ckpt, workflow, media)
    den = executor.denoise(executor.encode(req), req.params())
    for b_clips in (1, 3, 6):
        out, records = executor.decode(den, decode_on="A+B", b_clips=b_clips)
        assert np.array_equal(out.frames, expected["videos"][0]), b_clips
        assert np.array_equal(out.audio, expected["audio"][0].numpy())
        a_rec = next(r for r in records if r.stage == "decode" and r.machine == "A")
        b_rec = next(r for r in records if r.stage == "decode" and r.machine == "B")
        assert a_rec.info["b_clips"] == [7 - b_clips, 7] and a_rec.info["a_decoded"] == list(range(7 - b_clips))
        assert b_rec.info["clips"] == [7 - b_clips, 7] and b_rec.node == executor.topology.b.ip
        assert b_rec.bytes["frames"] == a_rec.bytes["b_frames"] == b_clips * 28 * 64 * 64 * 3 * 4
        assert a_rec.fetch_s > 0 and b_rec.compute_s > 0 and "split decode" in a_rec.note
        assert [r.stage for r in records] == ["b_to_a", "decode", "decode"]


def _job(ex, req):
    return ex.denoise(ex.encode(req), req.params())


class _FixedClock(dp.ClipClock):
    """Clip times the test sets: the tiny model's clips take milliseconds, less than fetching their frames, so the
    measured clock rightly gives B no clip; the policy is tested on the times of a real decode instead."""

    def add(self, *a, **k):
        pass

    def add_fetch(self, *a, **k):
        pass


def test_split_decode_auto_policy(executor, media):
    """auto: A alone until A's clip time is measured, then split while B is free; with B's queue busy, A alone."""
    old = executor.planner.min_split_s, executor.planner.clock
    executor.planner.min_split_s, executor.planner.clock = 1.0, _FixedClock()
    try:
        first = executor.generate(workflow_request("t2va", media, seed=31)[0])
        dec = [r for r in first.records if r.stage == "decode"]
        assert [r.machine for r in dec] == ["A"] and "not measured yet" in dec[0].note
        per_mpx = 0.25 / (64 * 64 / 1e6)  # 0.25 s per clip at 64x64: 1.75 s for A alone, worth splitting
        executor.planner.clock.per_mpx.update({"A alone": per_mpx, "A": per_mpx, "B": per_mpx})
        second = executor.generate(workflow_request("t2va", media, seed=32)[0])
        dec = [r for r in second.records if r.stage == "decode"]
        assert sorted(r.machine for r in dec) == ["A", "B"]
        assert next(r for r in dec if r.machine == "A").info["b_clips"] == [4, 7]  # equal sides: A 4, B 3
        assert np.array_equal(second.media.frames, executor.decode(
            _job(executor, workflow_request("t2va", media, seed=32)[0]), decode_on="A")[0].frames)
        # two requests in flight: the first decodes while the second waits for B -> A alone; the second splits
        results = executor.run_many([workflow_request("t2va", media, seed=s)[0] for s in (33, 34)])
        first_dec = [r for r in results[0].records if r.stage == "decode"]
        assert [r.machine for r in first_dec] == ["A"] and "waiting" in first_dec[0].note
        last = [r for r in results[1].records if r.stage == "decode"]
        assert "B" in {r.machine for r in last}, [r.note for r in last]
        # a slower B gets fewer clips; a decode too short to pay for B stays on A
        executor.planner.clock.per_mpx["B"] = 2 * per_mpx
        assert executor.plan_decode(64, 64, 124).b_start == 5
        executor.planner.clock.per_mpx["A alone"] = 0.1 * per_mpx
        assert executor.plan_decode(64, 64, 124).mode == "A"
    finally:
        executor.planner.min_split_s, executor.planner.clock = old


def test_split_decode_shares_meet_inside_a_clip_across_the_cluster(executor, tiny_ckpt, media):
    """A 96x320 canvas is 2 tiles per clip (diffusers' 256-pixel tiles): with A and B equally fast the shares are
    balanced in tiles and meet inside clip 3 (A clips 0-2 and tile 0 of clip 3, B tile 1 of it and clips 4-6), its
    tiles crossing as one wire clip; the frames are diffusers' bit for bit and the clock learns half a clip."""
    old = executor.planner.min_split_s, executor.planner.clock
    executor.planner.min_split_s, executor.planner.clock = 1.0, dp.ClipClock()
    per_mpx = 0.25 / (96 * 320 / 1e6)
    executor.planner.clock.per_mpx.update({"A alone": per_mpx, "A": per_mpx, "B": per_mpx})
    try:
        plan = executor.plan_decode(96, 320, 124)
        assert (plan.mode, plan.b_start, plan.b_tile, plan.tiles) == ("A+B", 3, 1, 2), plan
        assert "clip 3 from tile 1 of 2" in plan.why
        req, _ = workflow_request("t2va", media, height=96, width=320, seed=36)
        expected = single_process_reference(tiny_ckpt, "t2va", media, height=96, width=320, seed=36)
        out, records = executor.decode(_job(executor, req))
        assert np.array_equal(out.frames, expected["videos"][0])
        a_rec = next(r for r in records if r.stage == "decode" and r.machine == "A")
        b_rec = next(r for r in records if r.stage == "decode" and r.machine == "B")
        assert (a_rec.info["b_tile"], a_rec.info["tiles"], a_rec.info["a_decoded"]) == (1, 2, [0, 1, 2, 3])
        assert "clip 3: A tiles 0-0, B tiles 1-1" in a_rec.note and "clip 3 from tile 1 of 2" in b_rec.note
        assert (b_rec.info["first_tile"], b_rec.info["clips"]) == (1, [3, 7])
        # clip 3's one tile (256 wide, 28 frames) and clips 4-6 whole crossed
        assert a_rec.bytes["b_frames"] == (28 * 96 * 256 + 3 * 28 * 96 * 320) * 3 * 4
        executor.planner.clock = dp.ClipClock()
        executor.planner.learn(records, 96, 320, 7)
        clip_b = b_rec.info["clip_s"]
        assert executor.planner.clock.clip_s("B", 96, 320) == pytest.approx(sum(clip_b) / 3.5)
    finally:
        executor.planner.min_split_s, executor.planner.clock = old


def test_split_decode_measured_clock_learns_both_sides(executor, media):
    """Every decode feeds the clock: A alone from A-only decodes, A and B (and the frames' fetch) from splits."""
    old = executor.planner.clock
    executor.planner.clock = dp.ClipClock()
    try:
        den = _job(executor, workflow_request("t2va", media, seed=35)[0])
        executor.decode(den, decode_on="A")
        assert set(executor.planner.clock.per_mpx) == {"A alone"}
        executor.decode(den, decode_on="A+B", b_clips=3)
        assert set(executor.planner.clock.per_mpx) == {"A alone", "A", "B"}
        assert executor.planner.clock.fetch_per_mpx > 0
    finally:
        executor.planner.clock = old


def test_split_decode_plan_without_b_decoder(executor):
    """A B that holds no video VAE (its plan said no) never gets a share, even with A+B: the record says why."""
    b = executor.last_health["B"]
    assert b["video_vae"]["resident"] and "resident" in b["video_vae"]["note"]
    assert b["memory_plan"]["video_vae"]["plan"]["fits"]
    saved = b["video_vae"]
    try:
        b["video_vae"] = {"resident": False, "note": "not loaded, it does not fit: B plan (...)"}
        plan = executor.plan_decode(64, 64, 124, "A+B")
        assert plan.mode == "A" and "does not fit" in plan.why
        b["video_vae"] = {**saved, "dtype": "bfloat16"}
        plan = executor.plan_decode(64, 64, 124, "A+B")
        assert plan.mode == "A" and "would differ" in plan.why
    finally:
        b["video_vae"] = saved


def test_split_decode_b_plan_refuses_decoder_that_does_not_fit(tiny_ckpt):
    """B's memory plan decides: with room for the transformer but not the VAE's decoder, B loads no decoder."""
    from remote_worker.b_side import BSide

    fits = BSide(str(tiny_ckpt), dtype="float32", device="cpu")
    assert fits.vae is not None and "vae" in fits.resident() and fits.vae.encoder is None
    need = fits.decoder_plan.need_bytes
    base = fits.memory_plan.need_bytes
    assert need > base
    tight = BSide(str(tiny_ckpt), dtype="float32", device="cpu", residency="both",
                  memory_limit_bytes=int((base + (need - base) // 2) / 0.97))
    assert tight.vae is None and "does not fit" in tight.decoder_note
    assert not tight.memory_report()["video_vae"]["resident"]


# ---------------------------------------------------------------------------------------------------- A in this process
@pytest.fixture(scope="module")
def local_split(ray_cluster, tiny_ckpt, a_side):
    """A in this process (as inside ComfyUI), a B of its own whose decode share first waits 2 s (the timed stand-in
    of the benchmarks), so it can be killed or cancelled during its share."""
    import ray

    from comfy_h3_nodes.engine.contract.configs import BConfig, Timeouts
    from comfy_h3_nodes.engine.executor import H3Executor
    from comfy_h3_nodes.tools.bench import substitutes

    stages = {"decode_share": 2.0}
    ex = H3Executor(a_side, BConfig(str(tiny_ckpt), dtype="float32", threads=1, name="h3_dit_split_test",
                                    max_restarts=0),
                    timeouts=Timeouts(start=120, health=10, encode=60, handoff=60, stall=60, decode=60, poll=0.05),
                    actors=substitutes.actors(stages), env=substitutes.env(stages))
    ex.start()
    yield ex
    if ex.b is not None:
        ray.kill(ex.b, no_restart=True)
    ex.shutdown()


def _denoised(ex, media, seed):
    """A job of ``ex`` whose latents are on A (received in this process) and still held by B."""
    req, _ = workflow_request("t2va", media, seed=seed)
    return ex.denoise(ex.encode(req), req.params())


def test_split_decode_node_path_bit_exact(local_split, a_side, tiny_ckpt, media):
    """ComfyUI's H3Decode: the DiT that denoised the request splits its decode (A+B), frames as diffusers'."""
    import comfy_h3_nodes.nodes as N

    job = _denoised(local_split, media, seed=7)
    out = N.H3Decode().decode(a_side, job, decode_on="A+B", unique_id="6")
    (images,), (audio,), (fps,) = out["result"]  # H3Decode returns lists (OUTPUT_IS_LIST: batches)
    expected = single_process_reference(tiny_ckpt, "t2va", media)
    assert np.array_equal(images.numpy(), expected["videos"][0])
    assert np.array_equal(audio["waveform"][0].numpy(), expected["audio"][0].numpy())
    stages = out["ui"]["h3_timing"][0]["stages"]
    assert [(s["stage"], s["machine"]) for s in stages] == [("decode", "B"), ("decode", "A")]
    assert "B decodes clips" in out["ui"]["h3_timing"][0]["summary"]["decode_on"]
    # the latents were handed over: a second decode of them is A's alone, and says why
    again = N.H3Decode().decode(a_side, job, decode_on="A+B")
    assert [s["machine"] for s in again["ui"]["h3_timing"][0]["stages"]] == ["A"]
    assert "B no longer holds" in again["ui"]["h3_timing"][0]["summary"]["decode_on"]
    assert np.array_equal(again["result"][0][0].numpy(), expected["videos"][0])


def test_split_decode_cancel_stops_both_sides(local_split, media):
    import ray

    from comfy_h3_nodes.engine.contract.errors import H3Cancelled

    job = _denoised(local_split, media, seed=41)
    captured = []
    start = local_split.bclient.start_share
    local_split.bclient.start_share = lambda *a: captured.append(start(*a)) or captured[-1]
    try:
        timer = threading.Timer(0.5, job.cancel)
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(H3Cancelled, match="cancelled"):
            job.decode(decode_on="A+B", b_clips=3)
        assert time.monotonic() - t0 < 1.9  # A stopped while B's share still slept
        with pytest.raises(ray.exceptions.RayTaskError, match="cancelled"):
            ray.get(captured[0][-1], timeout=30)  # B stopped before its first clip
    finally:
        local_split.bclient.start_share = start


def _share_task():
    """B's share as a plain Ray task on the B node: clips 4-6 of a 7-clip request (each a (1, 3, 2, 32, 48) clip
    whose value is its index), then B's record; the clips come after ``delay`` seconds."""
    import ray

    from comfy_h3_nodes.cluster.ray_cluster import ROLE_B

    @ray.remote(num_cpus=0, resources={ROLE_B: 0.01}, num_returns=4, max_retries=0)
    def share(request_id: str, delay: float):
        time.sleep(delay)
        clips = [wire.DecodedClip(request_id, i, 7, wire.WireTensor.from_torch(torch.full((1, 3, 2, 32, 48), float(i))))
                 for i in (4, 5, 6)]
        return (*clips, {"clip_s": [0.0, 0.0, 0.0]})

    return share


def test_split_decode_b_frames_cross_while_a_decodes_its_own(ray_cluster):
    """B's share done while A still decodes clips 0-3: its frames are pulled into A's store in the background, so
    the blend finds each one there and waits for none of them; the transfer is still timed (``fetch_s``)."""
    from comfy_h3_nodes.engine.executor.handoff import ShareReceiver

    refs = list(_share_task().remote("pre-1", 0.0))
    share = ShareReceiver(refs, 4, 32, 48, timeout=30, request_id="pre-1")
    try:
        assert [share(i) for i in range(4)] == [None] * 4  # A's own clips
        deadline = time.monotonic() + 30  # "A decodes its clips": until the pull is over, bounded
        while len(share.prefetched) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert share.prefetched == [4, 5, 6] and not share.failure
        assert share.record == {"clip_s": [0.0, 0.0, 0.0]}
        for i in (4, 5, 6):
            assert torch.equal(share(i), torch.full((1, 3, 2, 32, 48), float(i)))
        assert share.fetch_wait_s == 0.0 and share.fetch_s > 0  # crossed in the background, before it was asked
        assert share.received == [4, 5, 6] and share.bytes == 3 * 3 * 2 * 32 * 48 * 4
    finally:
        share.close()
    assert not share._thread.is_alive()


def test_split_decode_share_receiver_stops_on_close_and_on_cancel(ray_cluster):
    """A decode that ends (or is cancelled) while B's share is still running stops the background pull at once,
    however long the bound; a cancel makes the blend's wait return for the cancel to be raised."""
    from comfy_h3_nodes.engine.executor.handoff import ShareReceiver

    share = ShareReceiver(list(_share_task().remote("pre-2", 20.0)), 4, 32, 48, timeout=600, request_id="pre-2")
    share.close()  # its join is bounded (5 s): a pull that ignored the stop would still be alive
    assert not share._thread.is_alive() and not share.failure
    cancelled = threading.Event()
    share = ShareReceiver(list(_share_task().remote("pre-3", 20.0)), 4, 32, 48, timeout=600, request_id="pre-3",
                          should_cancel=cancelled.is_set)
    threading.Timer(0.3, cancelled.set).start()
    try:
        assert share(4) is None and not share.failure  # returned for the cancel, not a lost share
    finally:
        share.close()
    assert not share._thread.is_alive()


def test_split_decode_b_killed_during_share_a_decodes_its_clips(local_split, tiny_ckpt, media):
    """B's actor dies during its share: A decodes B's clips itself, the frames are unchanged, the note says so."""
    import ray

    job = _denoised(local_split, media, seed=7)
    pid = ray.get(local_split.b.health.remote(), timeout=10)["pid"]
    threading.Timer(0.8, os.kill, args=(pid, signal.SIGKILL)).start()
    out, records, plan = job.decode(decode_on="A+B", b_clips=3)
    assert plan.mode == "A+B"
    expected = single_process_reference(tiny_ckpt, "t2va", media)
    assert np.array_equal(out.frames, expected["videos"][0])
    assert [r.machine for r in records] == ["A"]
    note = records[0].note
    assert "B's share was lost" in note and "A decoded B's clips 4-6 itself" in note, note
    assert records[0].info["a_decoded"] == list(range(7))


def test_split_decode_bench_quick_json(ray_cluster, capsys):
    """``bench decode --quick --json``: the last line is exactly {"frames": {"124": {...}, "345": {...}}}."""
    import json

    from comfy_h3_nodes.tools import bench

    assert bench.main(["decode", "--quick", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert list(out) == ["frames"] and list(out["frames"]) == ["124", "345"]
    for row in out["frames"].values():
        assert list(row) == ["a_only_s", "split_s", "ratio"]
        assert row["ratio"] == pytest.approx(row["split_s"] / row["a_only_s"], abs=6e-4)
    text = "\n".join(lines[:-1])
    assert "larger random video VAE" in text and "identical" in text and " True" in text
