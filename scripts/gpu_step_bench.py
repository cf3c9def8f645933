#!/usr/bin/env python
"""One short GPU run that measures: B's denoise step against diffusers' single-process step, SDPA versus flash-attn,
VSA-H3 against dense attention, the remote MODEL's per-forward cost on B, previews per step and peak memory.

    python scripts/gpu_step_bench.py                       # one GPU (a Spark, an H200), < 10 minutes, no downloads
    python scripts/gpu_step_bench.py --cpu-dry-run --json  # every section on the CPU at a tiny size (CI runs it)

What it builds (nothing is downloaded): the tiny random checkpoint of ``comfy_h3_nodes.engine.model.tiny`` (real
classes), whose ``transformer/`` is replaced by a scaled-down but non-trivial ``MiniMaxH3Transformer3DModel`` with
random weights (default 4 layers, hidden 1024, 8 heads x 128, FFN 2816, the real 24/32 latent channels, rope 16).
The text encoder and VAEs stay tiny: only the transformer's work is under test. Requests are built by B's warm-up
helpers (``remote_worker.warmup.payload`` / ``call_for``), the ones the tests use, so they follow the wire.

Sections (each reports its own ``*_error`` key instead of stopping the others; ``--cpu-dry-run`` exits 1 on any):

* per attention backend (``sdpa`` = torch SDPA; ``flash`` = flash-attn, refused in one sentence when its wheel does
  not run on this GPU): ``b_step_ms``, B's step through ``BSide.denoise`` (our hook blocks, the per-step synchronize
  included) as ``(T(steps_hi) - T(steps_lo)) / (forwards_hi - forwards_lo)`` (fixed costs cancel);
  ``single_step_ms`` the same for diffusers' single-process pipeline; ``b_vs_single`` their ratio (1.0 = B adds
  nothing per step); ``b_forward_ms`` / ``single_forward_ms`` the forward alone (CUDA events);
* ``vsa``: ``bench vsa`` (VSA-H3 kernel vs dense attention, synchronised, bf16 on CUDA): ``speedup``; on CUDA also
  ``vsa_torch`` (the pack's torch kernel);
* ``remote_model``: ``forward_ms``, one forward of ComfyUI's sampler as B serves it (``BSide.forward_rows``: the
  rows to the device, the forward, the target rows back to the host), against ``b_forward_ms``; the hand-offs over
  Ray between two machines are ``bench remote-model``'s;
* ``preview``: ``ms_per_step`` for each method (``latent2rgb`` JPEG, ``latent`` frame) inside B's denoise;
* ``memory``: peak allocated / reserved bytes on the GPU (peak RSS on a CPU);
* ``not_measured``: what one GPU cannot measure (NCCL between two Sparks, the link's hand-offs).

The last line of output is one JSON object; ``b_step_ms`` at its top level is the SDPA (else first) backend's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-dry-run", action="store_true", help="tiny config on the CPU (proves the script runs)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--frames", type=int, default=124)
    p.add_argument("--tokens", type=int, default=256, help="prompt rows B receives")
    p.add_argument("--steps", default="4,12", help="two num_inference_steps values (lo,hi) for the difference")
    p.add_argument("--repeats", type=int, default=3, help="runs per point (median)")
    p.add_argument("--backends", default="sdpa,flash")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--keep", action="store_true", help="keep the temporary checkpoint")
    p.add_argument("--json", action="store_true", help="print only the final JSON line (no table)")
    p.add_argument("--forwards", type=int, default=5, help="remote MODEL forwards timed (median)")
    args = p.parse_args(argv)
    if args.cpu_dry_run:
        args.layers, args.hidden, args.heads, args.head_dim, args.ffn = 2, 64, 2, 32, 128
        args.height, args.width, args.frames, args.tokens, args.steps, args.repeats = 64, 64, 124, 16, "2,3", 1
        args.forwards = 2
        args.dtype = "float32"
    return args


def build_checkpoint(args, out: pathlib.Path) -> tuple[pathlib.Path, int]:
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    from comfy_h3_nodes.engine.model.tiny import TINY_SIZES, build_tiny_checkpoint

    build_tiny_checkpoint(out, seed=0)
    torch.manual_seed(0)
    rope = min(16, args.head_dim // 6)  # rotated channels 6 x rope_freq_dim must fit the head
    model = MiniMaxH3Transformer3DModel(
        num_attention_heads=args.heads, attention_head_dim=args.head_dim, hidden_size=args.hidden,
        num_layers=args.layers, num_refiner_layers=2 if not args.cpu_dry_run else 1, ffn_dim=args.ffn,
        in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=TINY_SIZES["text_hidden_size"],
        freq_dim=256 if not args.cpu_dry_run else 16, time_embed_hidden_dim=args.hidden,
        time_embed_dim=args.hidden // 2, rope_freq_dim=rope, rope_theta=10000.0,
    ).eval()
    shutil.rmtree(out / "transformer")
    model.save_pretrained(str(out / "transformer"))
    params = sum(p.numel() for p in model.parameters())
    del model
    return out, params


class ForwardTimer:
    """Times every transformer forward (CUDA events on a GPU, perf_counter on a CPU)."""

    def __init__(self, module, cuda: bool):
        import torch

        self.cuda, self.times, self._pending = cuda, [], None
        self._torch = torch
        self.handles = [module.register_forward_pre_hook(self.pre), module.register_forward_hook(self.post)]

    def pre(self, *_):
        if self.cuda:
            start = self._torch.cuda.Event(enable_timing=True)
            start.record()
            self._pending = start
        else:
            self._pending = time.perf_counter()

    def post(self, *_):
        if self.cuda:
            end = self._torch.cuda.Event(enable_timing=True)
            end.record()
            self.times.append((self._pending, end))
        else:
            self.times.append(time.perf_counter() - self._pending)

    def take_ms(self) -> list[float]:
        if self.cuda:
            self._torch.cuda.synchronize()
            out = [s.elapsed_time(e) for s, e in self.times]
        else:
            out = [t * 1e3 for t in self.times]
        self.times = []
        return out

    def remove(self):
        for h in self.handles:
            h.remove()


def sync(device):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def forwards(steps: int) -> int:
    return steps - 1  # n sigma points = n - 1 transformer forwards (design.md: 50 points = 49 forwards)


def bench_b(ckpt, args, backend, device, lo, hi) -> dict:
    import torch

    from remote_worker import warmup
    from remote_worker.b_side import BSide

    side = BSide(ckpt, partition="transformer", dtype=args.dtype, attention_backend=backend, device=device)
    canvas = (args.height, args.width, args.frames)

    def run(steps, **kw):
        pay = warmup.payload("transformer", side.text_dim, args.dtype, f"gpu-bench-{steps}", canvas, args.tokens)
        return side.denoise(pay, warmup.call_for(pay, steps, **kw))

    timer = ForwardTimer(getattr(side._host, "transformer"), device.startswith("cuda"))
    run(lo)  # warm both step counts: kernels, allocator, lazy pipeline, scheduler tables
    run(hi)
    timer.take_ms()
    totals = {lo: [], hi: []}
    monitor_steps = []
    for _ in range(args.repeats):
        for steps in (lo, hi):
            sync(device)
            t0 = time.perf_counter()
            res = run(steps)  # ends with the latents copied to the host: synchronous
            totals[steps].append(time.perf_counter() - t0)
            if steps == hi:
                monitor_steps.extend(s.seconds for s in res.steps)
    fwd = timer.take_ms()
    timer.remove()
    step = (statistics.median(totals[hi]) - statistics.median(totals[lo])) / (forwards(hi) - forwards(lo))
    out = {"b_step_ms": round(step * 1e3, 3), "b_forward_ms": round(statistics.median(fwd), 3),
           "b_total_s": {str(k): round(statistics.median(v), 4) for k, v in totals.items()},
           "b_monitor_step_ms": round(statistics.median(monitor_steps) * 1e3, 3)}
    if backend == "sdpa":  # the sections that need B's side once
        out["_side"] = side
        out["_run"] = run
    else:
        del side
    return out


def bench_preview(run, lo) -> dict:
    """Previews inside B's denoise, each method, one per step: B's seconds per preview."""
    from comfy_h3_nodes.engine.contract import wire
    from comfy_h3_nodes.tools.bench.preview import _factors

    out = {}
    for method in ("latent2rgb", "latent"):
        res = run(lo, preview=wire.PreviewSpec(method, _factors(), every=1, source="bench"))
        pv = res.preview
        out[method] = {"ms_per_step": round(pv["cost_s"] / max(1, pv["count"]) * 1e3, 3), "count": pv["count"]}
    out["ms_per_step"] = out["latent2rgb"]["ms_per_step"]
    return out


def bench_remote_model(side, args, device) -> dict:
    """One forward of ComfyUI's sampler as B serves it (``forward_rows``), host rows in and out, CFG batch 2."""
    import torch

    from comfy_h3_nodes.engine.contract import wire
    from comfy_h3_nodes.engine.contract.forward_payloads import (TOKEN_AUDIO, TOKEN_TEXT, TOKEN_VIDEO, ForwardCall,
                                                                ForwardContext)

    W = wire.WireTensor.from_torch
    g = torch.Generator().manual_seed(0)
    nt = args.tokens
    nv = wire.video_latent_frames(args.frames) * (args.height // 32) * (args.width // 32)
    na = wire.AUDIO_CHANNELS * wire.audio_latent_frames(args.frames)
    seq, dt = nt + nv + na, getattr(torch, args.dtype)
    tags = torch.cat([torch.full((nt,), TOKEN_TEXT), torch.full((nv,), TOKEN_VIDEO),
                      torch.full((na,), TOKEN_AUDIO)]).long()
    pos = torch.zeros((seq, 3))
    pos[:, 0] = torch.arange(seq, dtype=torch.float32)
    ctx = ForwardContext("gpu-bench", W(torch.randn(2, nt, side.text_dim, generator=g).to(dt)), W(tags), W(pos),
                         W(torch.arange(nt, nt + nv)), W(torch.arange(nt + nv, seq)), W(torch.arange(nt)),
                         W(torch.ones(nv, dtype=torch.bool)), W(torch.ones(na, dtype=torch.bool)),
                         W(torch.zeros(0, 96)), W(torch.zeros(0, 32)))
    t_idx = torch.zeros(seq, dtype=torch.uint8)
    t_idx[nt + nv:] = 1
    tensors = {**{k: t.to_torch() for k, t in ctx.tensors().items()}, "partition": ctx.partition}
    times = []
    for i in range(args.forwards + 1):
        call = ForwardCall("gpu-bench", i, W(torch.randn(2, nv, 96, generator=g).to(dt)),
                           W(torch.randn(2, na, 32, generator=g).to(dt)), W(torch.tensor([0.5, 0.62])), W(t_idx))
        sync(device)
        t0 = time.perf_counter()
        video, *_ = side.forward_rows(tensors, call.validate(ctx))  # host tensors back: the work is done
        if i:
            times.append(time.perf_counter() - t0)
    return {"forward_ms": round(statistics.median(times) * 1e3, 3), "rows": seq, "cfg_batch": 2,
            "forwards": len(times), "device_tensors": device.startswith("cuda"),
            "ray_round_trip": "not here: python -m comfy_h3_nodes.tools.bench remote-model (the A<->B hand-offs)"}


def bench_vsa(args, device, kernel=None) -> dict:
    from comfy_h3_nodes.tools.bench import vsa as vsa_bench

    res = vsa_bench.run_vsa(quick=args.cpu_dry_run, repeats=1 if args.cpu_dry_run else 5, device=device,
                            kernel=kernel or ("torch" if device == "cpu" else None), log=lambda *_: None)
    return {k: res[k] for k in ("kernel", "dtype", "dense_s", "vsa_s", "speedup", "max_abs_diff", "shape")}


def bench_memory(device) -> dict:
    import resource

    import torch

    if device.startswith("cuda"):
        return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved())}
    return {"peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


def section(results: dict, name: str, fn, quiet: bool) -> None:
    """``results[name] = fn()``, or ``results[name + "_error"]`` with the real failure (the others still run)."""
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - reported, keeps the other measurements
        results[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
    if not quiet:
        print(f"[{name}] {json.dumps(results.get(name) or results.get(name + '_error'), default=str)}", flush=True)


NOT_MEASURED = ("NCCL across two GPUs (a DiT group's collectives over the Sparks' link: bench parallel on two "
                "Sparks) and the A<->B hand-offs over the network (bench handoff, bench remote-model)")


def bench_single(ckpt, args, backend, device, lo, hi) -> dict:
    import torch
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    from comfy_h3_nodes.engine.model.backends import apply_attention_backend, resolve_attention_backend
    from comfy_h3_nodes.engine.model.compat import ensure_processor_compat

    ensure_processor_compat()
    pipe = MiniMaxH3Blocks().get_workflow("t2va").init_pipeline(str(ckpt))
    pipe.load_components(dtype=getattr(torch, args.dtype))
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    apply_attention_backend(pipe.transformer, resolve_attention_backend(backend))
    timer = ForwardTimer(pipe.transformer, device.startswith("cuda"))

    def run(steps):
        return pipe(prompt="a robot dances on a table while a piano plays", height=args.height, width=args.width,
                    num_frames=args.frames, num_inference_steps=steps,
                    generator=torch.Generator("cpu").manual_seed(0), output="latents")

    run(lo)
    run(hi)
    timer.take_ms()
    totals = {lo: [], hi: []}
    for _ in range(args.repeats):
        for steps in (lo, hi):
            sync(device)
            t0 = time.perf_counter()
            run(steps)
            sync(device)
            totals[steps].append(time.perf_counter() - t0)
    fwd = timer.take_ms()
    timer.remove()
    step = (statistics.median(totals[hi]) - statistics.median(totals[lo])) / (forwards(hi) - forwards(lo))
    out = {"single_step_ms": round(step * 1e3, 3), "single_forward_ms": round(statistics.median(fwd), 3),
           "single_total_s": {str(k): round(statistics.median(v), 4) for k, v in totals.items()}}
    del pipe
    return out


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    import torch

    from comfy_h3_nodes.engine.model.backends import AttentionBackendError, resolve_attention_backend

    device = "cpu" if args.cpu_dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch; run with --cpu-dry-run on a CPU machine", file=sys.stderr)
        return 2
    quiet = args.json
    lo, hi = (int(x) for x in args.steps.split(","))
    info = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "dtype": args.dtype, "canvas": f"{args.width}x{args.height}x{args.frames}", "steps": [lo, hi],
            "config": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "head_dim": args.head_dim,
                       "ffn": args.ffn}, "cpu_dry_run": args.cpu_dry_run, "not_measured": NOT_MEASURED}
    if device == "cuda":
        info["capability"] = "sm_%d%d" % torch.cuda.get_device_capability(0)
        torch.cuda.reset_peak_memory_stats()
    try:
        import diffusers

        info["diffusers"] = diffusers.__version__
    except Exception:  # noqa: BLE001
        pass
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="h3-gpu-step-"))
    results, extra, side = {}, {}, None
    try:
        t0 = time.perf_counter()
        ckpt, params = build_checkpoint(args, tmp / "ckpt")
        info["transformer_params_m"] = round(params / 1e6, 1)
        info["build_s"] = round(time.perf_counter() - t0, 1)
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            row = {}
            try:
                resolve_attention_backend(backend)
            except AttentionBackendError as exc:  # a refusal is a result (no flash wheel for this GPU), not an error
                results[backend] = {"available": False, "refused": str(exc)}
                if not quiet:
                    print(f"[{backend}] unavailable: {exc}", flush=True)
                continue
            row["available"] = True
            for name, fn in (("b", bench_b), ("single", bench_single)):
                try:
                    row.update(fn(ckpt, args, backend, device, lo, hi))
                except Exception as exc:  # noqa: BLE001 - report the real failure, keep the other measurements
                    row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                if device == "cuda":
                    torch.cuda.empty_cache()
            if "_side" in row:
                side, run = row.pop("_side"), row.pop("_run")
            if "b_step_ms" in row and "single_step_ms" in row and row["single_step_ms"] > 0:
                row["b_vs_single"] = round(row["b_step_ms"] / row["single_step_ms"], 3)
            results[backend] = row
            if not quiet:
                print(f"[{backend}] {json.dumps(row)}", flush=True)
        if side is not None:
            section(extra, "preview", lambda: bench_preview(run, lo), quiet)
            section(extra, "remote_model", lambda: bench_remote_model(side, args, device), quiet)
            fwd = (results.get("sdpa") or {}).get("b_forward_ms")
            if fwd and "remote_model" in extra:
                extra["remote_model"]["vs_b_forward"] = round(extra["remote_model"]["forward_ms"] / fwd, 3)
        else:
            extra["preview_error"] = extra["remote_model_error"] = "B's side did not start (see the sdpa row)"
        del side
        section(extra, "vsa", lambda: bench_vsa(args, device), quiet)
        if device == "cuda":  # the pack's torch kernel on the GPU too (FastVideo's may be missing)
            section(extra, "vsa_torch", lambda: bench_vsa(args, device, "torch"), quiet)
        section(extra, "memory", lambda: bench_memory(device), quiet)
    finally:
        if args.keep:
            print(f"checkpoint kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    info["wall_s"] = round(time.perf_counter() - t_start, 1)
    first = next((r for r in (results.get("sdpa"), *results.values()) if r and "b_step_ms" in r), {})
    if not quiet:
        table(results, info, args, lo, hi)
    out = {"bench": "gpu-step", **info, "b_step_ms": first.get("b_step_ms"), "backends": results, **extra}
    print(json.dumps(out, sort_keys=True, default=str), flush=True)
    errors = sorted(k for k in _keys(out) if k.endswith("_error"))
    if errors and not quiet:
        print(f"errors: {', '.join(errors)}", file=sys.stderr)
    if out["b_step_ms"] is None or (errors and args.cpu_dry_run):
        return 1
    return 0


def _keys(d: dict, path: str = ""):
    for k, v in d.items():
        yield f"{path}{k}"
        if isinstance(v, dict):
            yield from _keys(v, f"{path}{k}.")


def table(results, info, args, lo, hi) -> None:
    print(f"\nB step vs diffusers single-process, {info['device']}, {info['dtype']}, {info['canvas']}, transformer "
          f"{args.layers} layers x hidden {args.hidden} ({info.get('transformer_params_m')} M params), "
          f"steps {lo}/{hi}")
    head = f"{'backend':8} {'B step ms':>10} {'single ms':>10} {'B/single':>9} {'B fwd ms':>9} {'single fwd':>10}"
    print(head)
    print("-" * len(head))
    for backend, r in results.items():
        if not r.get("available"):
            print(f"{backend:8} unavailable: {r['refused']}")
            continue

        def f(k):
            v = r.get(k)
            return f"{v:10.3f}" if isinstance(v, (int, float)) else f"{'error':>10}"

        print(f"{backend:8} {f('b_step_ms')} {f('single_step_ms')} {f('b_vs_single')[1:]} {f('b_forward_ms')[1:]} "
              f"{f('single_forward_ms')}")


if __name__ == "__main__":
    sys.exit(main())
