"""``bench remote-model``: the round trip of one forward of ComfyUI's sampler on A through B's DiT (issue #28's
per-forward path), with a forward that costs nothing, so what is timed is only the hand-offs and Ray.

A is this driver (the embedded cluster's A node), B the real DiT actor (:class:`remote_worker.actor.DiTActorImpl`'s
``forward``: the sampling context fetched once and kept by object id, the call checked against it, the result built)
around a stand-in side (:class:`.substitutes.NullForwardSide`) that echoes the target rows at once. A's client is the
real :class:`~...engine.executor.remote_forward.RemoteSampling`. Payloads at real shapes, CFG batch 2:

* per forward A->B (:class:`ForwardCall`): video rows ``latent_frames x (h/16/2) x (w/16/2)`` of 24 x (1x2x2) =
  96, audio rows ``2 x audio_latent_frames`` of 32, both batch 2, in bf16 (the dtype ComfyUI's sampler hands the
  released model, which computes in bf16: the rows cross in it); 2 timestep values and one uint8
  index per sequence row; B->A (:class:`ForwardResult`) the same video and audio rows;
* once per sampling (:class:`ForwardContext`, reported apart as ``context_s``): 512 text rows of 5120 (bf16,
  batch 2), the packed layout (text + video + audio rows), every video/audio row a target (no guide rows).

With CFG batch 2 one sampler step is one forward, so the share of a step is ``round_trip_s / 31.4`` (vLLM-Omni's
public step on two GB10s); the goal is <= 0.3 %.
"""

from __future__ import annotations

import os
import statistics
import time

import ray
import torch

from ...engine.contract import wire
from ...engine.contract.forward_payloads import TOKEN_AUDIO, TOKEN_TEXT, TOKEN_VIDEO, ForwardContext
from ...engine.executor.health import measure_clock
from ...engine.executor.remote_forward import RemoteSampling
from .preview import PUBLIC_STEP_S  # 31.4 s per step, vLLM-Omni on two GB10s (shared/design.md section 8)

#: s per denoise step of vLLM-Omni's public run on two GB10s (1344x768, 5 s; shared/design.md section 8); with CFG
#: batch 2 that step is one forward of batch 2
VLLM_OMNI_STEP_S = PUBLIC_STEP_S
GOAL_SHARE = 0.003  # one forward's round trip <= 0.3 % of a step
SHAPES = ("1344x768x124", "1344x768x345")
QUICK_SHAPES = ("256x128x22",)
CFG_BATCH = 2
TEXT_ROWS, TEXT_DIM = 512, 5120
PATCH = (1, 2, 2)
VIDEO_DIM = wire.VIDEO_LATENT_CHANNELS * PATCH[0] * PATCH[1] * PATCH[2]  # 96
AUDIO_DIM = wire.AUDIO_LATENT_CHANNELS  # 32


def parse_canvas(text: str) -> tuple[int, int, int]:
    """``WIDTHxHEIGHTxFRAMES`` -> (width, height, frames); sides multiples of 32 (patch 2 over /16 latents), frames
    17n+5."""
    try:
        w, h, f = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: {text!r} is not WIDTHxHEIGHTxFRAMES, e.g. 1344x768x124") from None
    if w <= 0 or h <= 0 or w % 32 or h % 32 or f < 5 or (f - 5) % 17:
        raise SystemExit(f"--shapes: {text!r} needs width and height multiples of 32 and frames of the form 17n+5")
    return w, h, f


def rows(width: int, height: int, frames: int) -> dict:
    """Row counts of one canvas's packed sequence (patch 1x2x2)."""
    video = wire.video_latent_frames(frames) * (height // 16 // PATCH[1]) * (width // 16 // PATCH[2])
    audio = wire.AUDIO_CHANNELS * wire.audio_latent_frames(frames)
    return {"text": TEXT_ROWS, "video": video, "audio": audio, "seq": TEXT_ROWS + video + audio}


#: the rows' dtype: the sampler's latent as ComfyUI hands it to a model computing in bf16
ROW_DTYPE = torch.bfloat16


def build(sampling_id: str, n: dict, seed: int = 0) -> tuple:
    """The context (a ``make`` for :meth:`RemoteSampling.context_ref`) and one forward's tensors at ``n``'s rows."""
    g = torch.Generator().manual_seed(seed)
    s, nt, nv, na = n["seq"], n["text"], n["video"], n["audio"]
    text = torch.randn((CFG_BATCH, nt, TEXT_DIM), generator=g).to(torch.bfloat16)
    tags = torch.cat([torch.full((nt,), TOKEN_TEXT), torch.full((nv,), TOKEN_VIDEO),
                      torch.full((na,), TOKEN_AUDIO)]).long()
    pos = torch.zeros((s, 3), dtype=torch.float32)
    pos[:, 0] = torch.arange(s, dtype=torch.float32)

    def make():
        W = wire.WireTensor.from_torch
        return ForwardContext(sampling_id, W(text), W(tags), W(pos), W(torch.arange(nt, nt + nv)),
                                   W(torch.arange(nt + nv, s)), W(torch.arange(nt)),
                                   W(torch.ones(nv, dtype=torch.bool)), W(torch.ones(na, dtype=torch.bool)),
                                   W(torch.zeros(0, VIDEO_DIM)), W(torch.zeros(0, AUDIO_DIM)))

    video = torch.randn((CFG_BATCH, nv, VIDEO_DIM), generator=g).to(ROW_DTYPE)
    audio = torch.randn((CFG_BATCH, na, AUDIO_DIM), generator=g).to(ROW_DTYPE)
    timestep = torch.tensor([0.5, 0.62], dtype=torch.float32)  # video's and audio's level
    t_idx = torch.zeros(s, dtype=torch.uint8)
    t_idx[nt + nv:] = 1
    return make, (video, audio, timestep, t_idx)


def _med(xs) -> float:
    return round(float(statistics.median(xs)), 6)


def measure_shape(handle, name: str, forwards: int, warmup: int, clock_offset_s: float, log) -> dict:
    w, h, f = parse_canvas(name)
    n = rows(w, h, f)
    sampling = RemoteSampling(handle, "bench-remote-model", clock_offset_s=clock_offset_s, forward_timeout=300.0,
                              poll=0.05)
    make, (video, audio, timestep, t_idx) = build(sampling.sampling_id, n)
    t0 = time.perf_counter()
    ctx_ref = sampling.context_ref(("bench", name), make)  # validated, put once in A's object store
    put_s = time.perf_counter() - t0
    ctx_bytes = ray.get(ctx_ref).nbytes  # local: A's own store
    for _ in range(warmup + forwards):
        v, a = sampling.forward(ctx_ref, video, audio, timestep, t_idx)
        assert v.shape == video.shape and a.shape == audio.shape
        del v, a
    recs = sampling.records
    timed = recs[warmup:]
    rt = _med([r.round_trip_s for r in timed])
    out = {"round_trip_s": rt, "share_of_step": round(rt / VLLM_OMNI_STEP_S, 8),
           "met": rt / VLLM_OMNI_STEP_S <= GOAL_SHARE,
           "a_to_b_s": _med([r.a_to_b_s for r in timed]), "b_to_a_s": _med([r.b_to_a_s for r in timed]),
           "compute_s": _med([r.compute_s for r in timed]),
           "bytes_a_to_b": timed[0].bytes_a_to_b, "bytes_b_to_a": timed[0].bytes_b_to_a,
           "min_round_trip_s": round(min(r.round_trip_s for r in timed), 6),
           "max_round_trip_s": round(max(r.round_trip_s for r in timed), 6),
           "context_s": round(put_s + recs[0].context_s, 6), "context_put_s": round(put_s, 6),
           "context_fetch_s": recs[0].context_s, "context_bytes": ctx_bytes,
           "rows": n, "forwards": forwards, "warmup": warmup, "a_records": len(recs)}
    log(f"{name:14} {n['seq']:>8} {out['bytes_a_to_b'] / 2**20:8.2f} {out['bytes_b_to_a'] / 2**20:8.2f} "
        f"{rt * 1e3:9.2f} {out['a_to_b_s'] * 1e3:8.2f} {out['b_to_a_s'] * 1e3:8.2f} {out['compute_s'] * 1e3:8.3f} "
        f"{out['share_of_step'] * 100:8.4f} {out['context_s'] * 1e3:9.2f}")
    return out


def run_remote_model(shapes, forwards: int, warmup: int, log) -> dict:
    """Each canvas of ``shapes`` (``WIDTHxHEIGHTxFRAMES``): ``warmup`` then ``forwards`` timed forwards through B's
    DiT actor on the B node with the echoing stand-in side. Needs the two-node cluster (:func:`.common.cluster`)."""
    from remote_worker.actor import start_dit  # noqa: PLC0415 - B's package, as the executor places it

    from .substitutes import NullForwardDiTActor  # noqa: PLC0415

    for s in shapes:
        parse_canvas(s)
    config = {"name": f"h3_dit_bench_remote_model_{os.getpid()}", "model_dir": "tiny-random", "threads": 1,
              "max_restarts": 0, "text_dim": TEXT_DIM}
    handle = start_dit(config, impl=NullForwardDiTActor, detached=False, get_if_exists=False)
    try:
        b_ip = ray.get(handle.ping.remote(), timeout=300)
        offset, rtt = measure_clock(handle, 60.0)
        log(f"B's DiT actor (stand-in forward: echoes the rows) on {b_ip}; A = this driver on "
            f"{ray.util.get_node_ip_address()}; clock B-A {offset * 1e3:+.3f} ms (rtt {rtt * 1e3:.2f} ms)")
        log(f"one forward's round trip, CFG batch {CFG_BATCH}, medians of {forwards} after {warmup} warm-up; share "
            f"of vLLM-Omni's {VLLM_OMNI_STEP_S} s step (goal <= {GOAL_SHARE * 100:.1f} %)")
        head = (f"{'canvas':14} {'seq rows':>8} {'A->B MiB':>8} {'B->A MiB':>8} {'round ms':>9} {'A->B ms':>8} "
                f"{'B->A ms':>8} {'B fwd ms':>8} {'% step':>8} {'context ms':>9}")
        log(head)
        log("-" * len(head))
        per, ran = {}, 0
        for s in shapes:
            per[s] = measure_shape(handle, s, forwards, warmup, offset, log)
            now = ray.get(handle.stand_in_forwards.remote(), timeout=60)  # B's own count: the forwards really ran
            per[s]["b_forwards"], ran = now - ran, now
    finally:
        ray.kill(handle)
    worst = max(r["share_of_step"] for r in per.values())
    met = worst <= GOAL_SHARE
    log(f"context (text {TEXT_ROWS} x {TEXT_DIM} bf16 + layout) is sent once per sampling, not per forward; B ran "
        f"{ran} stand-in forwards")
    log(f"worst share of a step {worst * 100:.4f} % (goal <= {GOAL_SHARE * 100:.1f} %): {'met' if met else 'NOT met'}")
    return {"shapes": per, "worst_share_of_step": worst, "_b_forwards": ran, "_met": met}


def main_json(res: dict) -> dict:
    """The last line: exactly ``{"shapes": {...}, "worst_share_of_step": ...}``."""
    return {"shapes": res["shapes"], "worst_share_of_step": res["worst_share_of_step"]}
