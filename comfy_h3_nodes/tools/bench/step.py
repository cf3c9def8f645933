"""``bench step-overhead``: B's per-step control cost (the two step hook blocks, progress bookkeeping, cancel
check), alone and around a tiny model's steps."""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch

from remote_worker.b_side import BSide, MonitorSlot, StepMonitor, _hook_block

from ...engine.contract import wire
from ...engine.model import split
from ...engine.model.folders import b_components
from .common import GOALS, _median, tiny_checkpoint


def run_step_overhead(iterations: int = 10_000, model_steps: int = 20, model_repeats: int = 3, ckpt=None,
                      with_model: bool = True, log=print) -> dict:
    """Per-step control cost on B: diffusers' loop dispatch of our two hook blocks, the StepMonitor (cancel check,
    step timing, record) and the actor's progress bookkeeping, each step as B runs it, with a step that costs 0."""
    denoise = split.split_workflow("t2va")["denoise"]
    loop = next(b for b in denoise.sub_blocks.values() if hasattr(b, "loop_step"))
    loop.sub_blocks.clear()  # an empty loop: diffusers' per-step dispatch with nothing in it (the baseline)
    slot = MonitorSlot()
    total = 50
    state = SimpleNamespace(timesteps=list(range(total)))
    cancelled: set = set()

    def one_request(rid):  # what DiTActorImpl.denoise sets up around BSide.denoise
        progress = {"state": "running", "steps": [], "total": total, "error": None}

        def on_step(rec):
            progress["steps"].append((rec.index, rec.total, rec.seconds))

        return StepMonitor(total=total, on_step=on_step, should_cancel=lambda: rid in cancelled, request_id=rid)

    def run(n):
        t0 = time.perf_counter()
        for k in range(n):
            i = k % total
            if i == 0:
                slot.monitor = one_request(f"r{k}")
            loop.loop_step(None, state, i=i, t=i)
        return time.perf_counter() - t0

    reps = 5
    base, hooked = [], []
    for _ in range(reps):
        loop.sub_blocks.clear()
        base.append(run(iterations) / iterations)
        loop.sub_blocks["h3_step_start"] = _hook_block("start", slot)
        loop.sub_blocks["h3_step_end"] = _hook_block("end", slot)
        hooked.append(run(iterations) / iterations)
    slot.monitor = None
    # A follows B with a long poll B answers once per step (and every 2 s when none ends); one answer copies the
    # step list (50 steps).
    monitor = one_request("poll")
    for i in range(total):
        monitor.start(i)
        monitor.end(i)
    p = {"state": "running", "steps": [(s.index, s.total, s.seconds) for s in monitor.steps], "total": total,
         "error": None}
    t0 = time.perf_counter()
    for _ in range(iterations):
        {"state": p["state"], "steps": list(p["steps"]), "total": p["total"], "error": p["error"]}
    poll_us = (time.perf_counter() - t0) / iterations * 1e6
    out = {
        "bench": "step-overhead", "iterations": iterations, "repeats": reps,
        "hooked_step_us": round(_median(hooked) * 1e6, 3),
        "empty_step_us": round(_median(base) * 1e6, 3),
        "overhead_us": round((_median(hooked) - _median(base)) * 1e6, 3),
        "progress_poll_us": round(poll_us, 3),
        "goal_step_overhead_us": GOALS["step_overhead_us"],
    }
    out["goal_met"] = out["hooked_step_us"] <= GOALS["step_overhead_us"]
    lines = [f"step overhead on B ({iterations} steps x {reps}, a step costing 0; median us per step)",
             f"  {'diffusers loop dispatch, no hooks':52} {out['empty_step_us']:9.3f} us",
             f"  {'+ our 2 hook blocks, StepMonitor, progress, cancel':52} {out['hooked_step_us']:9.3f} us "
             f"(overhead {out['overhead_us']:.3f} us)",
             f"  {'one progress answer (50 steps copied; once a step)':52} {out['progress_poll_us']:9.3f} us"]
    if with_model:
        out["tiny_model"] = _step_overhead_model(model_steps, model_repeats, ckpt)
        m = out["tiny_model"]
        lines.append(f"  tiny model, {m['steps']} forwards per request, median of {m['repeats']}: "
                     f"{m['with_hooks_ms_per_step']:.3f} ms/step with hooks vs {m['without_hooks_ms_per_step']:.3f} "
                     f"without (difference {m['difference_us_per_step']:.1f} us; run-to-run spread "
                     f"{m['noise_us_per_step']:.1f} us)")
    lines.append(f"  goal <= {GOALS['step_overhead_us']:.0f} us: {'met' if out['goal_met'] else 'NOT met'}")
    log("\n".join(lines))
    return out


def _step_overhead_model(steps: int, repeats: int, ckpt=None) -> dict:
    """The tiny model's step time through BSide's hooked pipeline versus diffusers' own denoise blocks."""
    ckpt = ckpt or tiny_checkpoint()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        side = BSide(ckpt, dtype="float32", device="cpu")
        g = torch.Generator().manual_seed(0)
        payload = wire.EncodedRequest("step-bench", "t2va", 32, 32, 124,
                                      wire.WireTensor.from_torch(torch.randn((1, 16, side.text_dim), generator=g)),
                                      wire.WireTensor.from_torch(torch.zeros(16, dtype=torch.int64))).validate()
        hooked = side._pipe("t2va")
        plain = split.make_group_pipeline(split.split_workflow("t2va")["denoise"], side.model_dir, side._host,
                                          b_components(side.partition))
        progress = []

        def call(pipe, monitor):
            side._slot.monitor = monitor
            t0 = time.perf_counter()
            pipe(**payload.pipeline_inputs(), num_inference_steps=steps + 1,
                 generator=torch.Generator("cpu").manual_seed(0),
                 output=["latents", "audio_latents"])
            side._slot.monitor = None
            return (time.perf_counter() - t0) / steps

        call(hooked, None)
        call(plain, None)
        w, wo = [], []
        for _ in range(repeats):
            mon = StepMonitor(total=steps, on_step=lambda r: progress.append((r.index, r.total, r.seconds)),
                              should_cancel=lambda: False, request_id="step-bench")
            w.append(call(hooked, mon))
            wo.append(call(plain, None))
        noise = statistics.pstdev(wo) if len(wo) > 1 else float("nan")
        return {"steps": steps, "repeats": repeats, "with_hooks_ms_per_step": round(_median(w) * 1e3, 4),
                "without_hooks_ms_per_step": round(_median(wo) * 1e3, 4),
                "difference_us_per_step": round((_median(w) - _median(wo)) * 1e6, 2),
                "noise_us_per_step": round(noise * 1e6, 2)}
    finally:
        torch.set_num_threads(threads)
