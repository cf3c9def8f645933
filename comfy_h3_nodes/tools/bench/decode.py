"""``bench decode``: one request's video decode by A alone versus split with B, with a larger random video VAE so
the decode is compute-bound like the released one."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import time

import numpy as np
import psutil
import torch
from diffusers import AutoencoderKLMiniMaxH3

from ...engine.contract.configs import BConfig, SideConfig, Timeouts
from ...engine.contract.request import H3Request
from ...engine.executor import H3Executor
from .common import _median, tiny_checkpoint

#: the bench's video VAE: the tiny checkpoint's encoder, a ViT decoder wide and deep enough that one clip takes about a
#: second on one CPU thread at DECODE_CANVAS (the released decoder is 36 layers x 2048; the tiny one 1 x 16)
DECODE_VAE = {"decoder_num_layers": 4, "decoder_num_attention_heads": 16, "decoder_attention_head_dim": 64,
              "decoder_ffn_mult": 4}
DECODE_VAE_QUICK = {"decoder_num_layers": 1, "decoder_num_attention_heads": 4, "decoder_attention_head_dim": 32,
                    "decoder_ffn_mult": 2}
DECODE_CANVAS = (128, 128)


def decode_checkpoint(quick: bool = False) -> pathlib.Path:
    """The tiny checkpoint with its ``vae/`` replaced by a larger random ``AutoencoderKLMiniMaxH3`` (same encoder and
    latent statistics, the decoder of ``DECODE_VAE``); every other component is the tiny one's, copied. Built once."""
    tiny = tiny_checkpoint()
    spec = DECODE_VAE_QUICK if quick else DECODE_VAE
    tag = "-".join(f"{v}" for v in spec.values())
    target = tiny.parent / f"bench-decode-h3-{tag}"
    if (target / ".complete").is_file():
        return target
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=tiny.parent))
    for item in tiny.iterdir():  # copies: B refuses component folders that resolve outside the model folder
        if item.name not in ("vae", ".complete"):
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
    config = {k: v for k, v in json.loads((tiny / "vae" / "config.json").read_text()).items()
              if not k.startswith("_")}
    config.update(spec)

    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3(**config).eval()
    vae.save_pretrained(str(tmp / "vae"))
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_decode(frames: tuple[int, ...] = (124, 345), repeats: int = 2, quick: bool = False, log=print) -> dict:
    """Per frame count: one request encoded and denoised once, then its decode timed ``repeats`` times by A alone and
    split (A+B), alternating, after one unmeasured round of each (it measures both sides' clip times)."""
    ckpt = decode_checkpoint(quick)
    spec = DECODE_VAE_QUICK if quick else DECODE_VAE
    height, width = (64, 64) if quick else DECODE_CANVAS
    log(f"decode: a larger random video VAE for this bench (diffusers' AutoencoderKLMiniMaxH3, random weights, ViT "
        f"decoder {spec['decoder_num_layers']} layers x {spec['decoder_num_attention_heads'] * spec['decoder_attention_head_dim']}"
        f" wide; the tiny model's decoder is 1 x 16), so the decode is compute-bound like the released one; "
        f"canvas {width}x{height}, each actor on one CPU thread, fp32")
    tag = f"decode_{os.getpid()}"
    ex = H3Executor(SideConfig(str(ckpt), dtype="float32", threads=1),
                    BConfig(str(ckpt), dtype="float32", threads=1, name=f"h3_dit_bench_{tag}"),
                    timeouts=Timeouts(start=600, health=30, encode=300, handoff=300, stall=300, decode=600,
                                      poll=0.05), a_name=f"h3_enc_bench_{tag}")
    out: dict = {"frames": {}}
    detail: dict = {}
    try:
        ex.start()

        health = ex.check_health()
        procs = {side: psutil.Process(health[side]["pid"]) for side in ("A", "B")}  # both on this machine

        def cpu() -> dict:
            return {side: sum(p.cpu_times()[:2]) for side, p in procs.items()}

        for n in frames:
            req = H3Request(prompt="bench decode: a robot dances while a piano plays", height=height, width=width,
                            num_frames=n, steps=2, seed=4242, request_id=f"bench-decode-{n}-{os.getpid()}")
            den = ex.denoise(ex.encode(req), req.params())
            times = {"A": [], "A+B": []}
            cpu_s = {"A": [], "A+B": []}  # CPU seconds of the actors' processes: the wall time with a free core each
            last = {}
            for rnd in range(repeats + 1):
                for mode in ("A", "A+B"):
                    c0, t0 = cpu(), time.perf_counter()
                    media, recs = ex.decode(den, decode_on=mode)
                    wall, c1 = time.perf_counter() - t0, cpu()
                    if rnd:
                        times[mode].append(wall)
                        cpu_s[mode].append(max(c1[k] - c0[k] for k in c0))
                    last[mode] = (media, recs)
            a_only, split = round(_median(times["A"]), 4), round(_median(times["A+B"]), 4)
            out["frames"][str(n)] = {"a_only_s": a_only, "split_s": split, "ratio": round(split / a_only, 3)}
            recs = last["A+B"][1]
            a_rec = next(r for r in recs if r.stage == "decode" and r.machine == "A")
            b_rec = next((r for r in recs if r.stage == "decode" and r.machine == "B"), None)
            got = a_rec.bytes.get("b_frames", 0)
            hand = a_rec.fetch_s + a_rec.materialize_s
            detail[str(n)] = {
                "clips": a_rec.info.get("clips"), "b_clips": a_rec.info.get("b_clips"),
                "a_clip_s": round(ex.clip_clock.clip_s("A", height, width) or 0, 4),
                "b_clip_s": round(ex.clip_clock.clip_s("B", height, width) or 0, 4),
                "b_frames_bytes": got, "b_frames_fetch_s": round(a_rec.fetch_s, 4),
                "b_frames_materialize_s": round(a_rec.materialize_s, 5),
                "b_frames_wait_s": round(a_rec.producer_wait_s, 4),
                "b_frames_mb_per_s": round(got / hand / 1e6, 1) if hand > 0 and got else None,
                "b_compute_s": round(b_rec.compute_s, 3) if b_rec else None,
                "identical": bool(np.array_equal(last["A"][0].frames, last["A+B"][0].frames)
                                  and np.array_equal(last["A"][0].audio, last["A+B"][0].audio)),
                "note": a_rec.note, "load_average": round(os.getloadavg()[0], 2),
                "cpu_a_only_s": round(_median(cpu_s["A"]), 3), "cpu_split_max_side_s": round(_median(cpu_s["A+B"]), 3),
                "cpu_ratio": round(_median(cpu_s["A+B"]) / _median(cpu_s["A"]), 3),
                "a_alone_clip_s": round(_median(times["A"]) / (a_rec.info.get("clips") or 1), 4),
            }
            del den
        lines = [f"  {'frames':>6} {'clips':>5} {'B clips':>8} {'A only s':>9} {'split s':>8} {'ratio':>6} {'goal':>5}"
                 f" {'A s/clip':>8} {'B s/clip':>8} {'B->A frames':>12} {'fetch s':>8} {'MB/s':>7} identical"]
        for n, row in out["frames"].items():
            d = detail[n]
            goal = DECODE_GOALS.get(n)
            lines.append(f"  {n:>6} {d['clips']:5d} {str(d['b_clips']):>8} {row['a_only_s']:9.3f} {row['split_s']:8.3f}"
                         f" {row['ratio']:6.3f} {goal if goal else '-':>5} {d['a_clip_s']:8.3f} {d['b_clip_s']:8.3f}"
                         f" {d['b_frames_bytes'] / 2**20:9.1f} MiB {d['b_frames_fetch_s']:8.4f}"
                         f" {d['b_frames_mb_per_s'] or 0:7.0f} {d['identical']}")
        met = all(row["ratio"] <= DECODE_GOALS.get(n, 1.0) for n, row in out["frames"].items())
        lines.append(f"  goal (ratio <= {', '.join(f'{g} at {n}' for n, g in DECODE_GOALS.items())}): "
                     f"{'met' if met else 'NOT met'}; A-only decode >= 5 s at 124 frames: "
                     f"{'yes' if out['frames'].get('124', {}).get('a_only_s', 0) >= 5 else 'no'}")
        for n, d in detail.items():
            lines.append(f"  {n}: {d['note']}; A alone {d['a_alone_clip_s']:.3f} s/clip (whole decode / clips), "
                         f"load average {d['load_average']} on {os.cpu_count()} CPUs; CPU seconds of the busier "
                         f"actor: A alone {d['cpu_a_only_s']:.2f} s, split {d['cpu_split_max_side_s']:.2f} s "
                         f"(ratio {d['cpu_ratio']:.3f}: the split's ratio with a free core per side)")
        log("decode, A alone vs split with B (medians of %d):\n" % repeats + "\n".join(lines))
        out["_detail"] = detail
        return out
    finally:
        ex.shutdown(kill_b=True)


DECODE_GOALS = {"124": 0.6, "345": 0.55}
