#!/usr/bin/env python
"""One short GPU run: B's denoise step time against diffusers' single-process pipeline, SDPA versus flash-attn.

    python scripts/gpu_step_bench.py                 # H200-class GPU, < 5 minutes, no downloads
    python scripts/gpu_step_bench.py --cpu-dry-run   # proves the script on a CPU with a tiny config

What it builds (nothing is downloaded): the tiny random checkpoint of ``comfy_h3_nodes.engine.model.tiny`` (real
classes), whose ``transformer/`` is replaced by a scaled-down but non-trivial ``MiniMaxH3Transformer3DModel`` with
random weights (default 4 layers, hidden 1024, 8 heads x 128, FFN 2816, the real 24/32 latent channels, rope 16).
The text encoder and VAEs stay tiny: only the transformer's step time is under test.

What it measures, per attention backend (``sdpa`` = diffusers' native torch SDPA; ``flash`` = flash-attn, whose real
import error is reported when it is missing):

* ``b_step_ms``: B's step, ``remote_worker.b_side.BSide.denoise`` (our hook blocks included), as
  ``(T(steps_hi) - T(steps_lo)) / (forwards_hi - forwards_lo)``: fixed costs (noise, packing, the D2H copy of the
  latents) cancel out.
* ``single_step_ms``: the same for diffusers' single-process ``MiniMaxH3`` t2va pipeline (encode + denoise + decode
  in one process), so its tiny encode/decode cancel out too.
* ``b_forward_ms`` / ``single_forward_ms``: the transformer forward alone (CUDA events around ``forward``).
* ``b_monitor_step_ms``: B's own step record (StepMonitor; on CUDA it synchronises at the end of every step, so the
  record is the real step time; that sync is part of what ``b_step_ms`` pays against the single process).
* ``b_vs_single``: the ratio of the two step times (1.0 = B adds nothing per step).

The last line of output is one JSON object.
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
    args = p.parse_args(argv)
    if args.cpu_dry_run:
        args.layers, args.hidden, args.heads, args.head_dim, args.ffn = 2, 64, 2, 32, 128
        args.height, args.width, args.frames, args.tokens, args.steps, args.repeats = 64, 64, 124, 16, "2,4", 2
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

    from comfy_h3_nodes.engine.contract import wire
    from remote_worker.b_side import BSide

    side = BSide(ckpt, partition="transformer", dtype=args.dtype, attention_backend=backend, device=device)
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn((1, args.tokens, side.text_dim), generator=g).to(getattr(torch, args.dtype))

    def payload(steps):
        return wire.EncodedRequest(f"gpu-bench-{steps}", "t2va", args.height, args.width, args.frames, steps, 0,
                                   wire.WireTensor.from_torch(embeds),
                                   wire.WireTensor.from_torch(torch.zeros(args.tokens, dtype=torch.int64)))

    timer = ForwardTimer(getattr(side._host, "transformer"), device.startswith("cuda"))
    side.denoise(payload(lo))  # warm both step counts: kernels, allocator, lazy pipeline, scheduler tables
    side.denoise(payload(hi))
    timer.take_ms()
    totals = {lo: [], hi: []}
    monitor_steps = []
    for _ in range(args.repeats):
        for steps in (lo, hi):
            sync(device)
            t0 = time.perf_counter()
            res = side.denoise(payload(steps))  # ends with the latents copied to the host: synchronous
            totals[steps].append(time.perf_counter() - t0)
            if steps == hi:
                monitor_steps.extend(s.seconds for s in res.steps)
    fwd = timer.take_ms()
    timer.remove()
    step = (statistics.median(totals[hi]) - statistics.median(totals[lo])) / (forwards(hi) - forwards(lo))
    out = {"b_step_ms": round(step * 1e3, 3), "b_forward_ms": round(statistics.median(fwd), 3),
           "b_total_s": {str(k): round(statistics.median(v), 4) for k, v in totals.items()},
           "b_monitor_step_ms": round(statistics.median(monitor_steps) * 1e3, 3)}
    del side
    return out


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
    lo, hi = (int(x) for x in args.steps.split(","))
    info = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "dtype": args.dtype, "canvas": f"{args.width}x{args.height}x{args.frames}", "steps": [lo, hi],
            "config": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "head_dim": args.head_dim,
                       "ffn": args.ffn}, "cpu_dry_run": args.cpu_dry_run}
    try:
        import diffusers

        info["diffusers"] = diffusers.__version__
    except Exception:  # noqa: BLE001
        pass
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="h3-gpu-step-"))
    results = {}
    try:
        t0 = time.perf_counter()
        ckpt, params = build_checkpoint(args, tmp / "ckpt")
        info["transformer_params_m"] = round(params / 1e6, 1)
        info["build_s"] = round(time.perf_counter() - t0, 1)
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            row = {}
            try:
                resolve_attention_backend(backend)
            except AttentionBackendError as exc:
                row = {"available": False, "error": str(exc)}
                results[backend] = row
                print(f"[{backend}] unavailable: {exc}", flush=True)
                continue
            row["available"] = True
            for name, fn in (("b", bench_b), ("single", bench_single)):
                try:
                    row.update(fn(ckpt, args, backend, device, lo, hi))
                except Exception as exc:  # noqa: BLE001 - report the real failure, keep the other measurements
                    row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                    print(f"[{backend}] {name} failed: {type(exc).__name__}: {exc}", flush=True)
                if device == "cuda":
                    torch.cuda.empty_cache()
            if "b_step_ms" in row and "single_step_ms" in row and row["single_step_ms"] > 0:
                row["b_vs_single"] = round(row["b_step_ms"] / row["single_step_ms"], 3)
            results[backend] = row
            print(f"[{backend}] {json.dumps(row)}", flush=True)
    finally:
        if args.keep:
            print(f"checkpoint kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    info["wall_s"] = round(time.perf_counter() - t_start, 1)

    print(f"\nB step vs diffusers single-process, {info['device']}, {info['dtype']}, {info['canvas']}, transformer "
          f"{args.layers} layers x hidden {args.hidden} ({info.get('transformer_params_m')} M params), "
          f"steps {lo}/{hi}")
    head = f"{'backend':8} {'B step ms':>10} {'single ms':>10} {'B/single':>9} {'B fwd ms':>9} {'single fwd':>10}"
    print(head)
    print("-" * len(head))
    for backend, r in results.items():
        if not r.get("available"):
            print(f"{backend:8} unavailable: {r['error']}")
            continue

        def f(k):
            v = r.get(k)
            return f"{v:10.3f}" if isinstance(v, (int, float)) else f"{'error':>10}"

        print(f"{backend:8} {f('b_step_ms')} {f('single_step_ms')} {f('b_vs_single')[1:]} {f('b_forward_ms')[1:]} "
              f"{f('single_forward_ms')}")
    print(json.dumps({"bench": "gpu-step", **info, "backends": results}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
