"""Benchmarks of the two-node split: ``python -m comfy_h3_nodes bench VERB [options]``.

Verbs (each starts the embedded two-node Ray cluster, or reuses the one this process already joined):

* ``handoff``: the A->B and B->A payloads at their real shapes (shared/design.md section 2), received by an actor on
  the other node exactly as the A/B actors receive them (ref inside a list, ``receive`` + ``materialize``), next to
  Ray's own floor for the same bytes (one plain uint8 numpy array, same path) and a memcpy of the same bytes.
  ``--tensor-transport`` adds Ray's direct tensor transport (gloo collective on CPU) for the same byte counts.
* ``pipeline``: N requests with stand-in, balanced stage times (:mod:`.substitutes`) through the real executor (tiny
  model, resident A/B actors), pipelined versus one at a time, next to the ideal bound ``fill + (N-1) x slower
  machine``.
* ``step-overhead``: B's per-step control overhead (the two step hook blocks, progress bookkeeping, cancel check).
* ``warm``: first versus second request through the executor; the second must load nothing.
* ``memory``: the memory plan of B's transformer residency against what B's actor really holds, for the tiny model in
  three plans (``bf16-one``, ``fp8-both``, ``gguf-q8_0-both``), and the plan's arithmetic at the released model's size.
* ``decode``: one request's video decode by A alone versus split with B (``decode_on`` ``A`` vs ``A+B``, shares
  from the measured clip times) at 124 and 345 frames, each actor pinned to one CPU thread, with a larger random video
  VAE (the real diffusers class, random weights, built here) so the decode is compute-bound like the released one.
* ``preview``: B's cost and the bytes of one live preview at 1344x768 with 124 and 345 frames, against a step.
* ``vsa``: VSA-H3 attention (FastH3's video sparse attention) against dense attention over one packed sequence at a
  tiny shape with enough tiles, on this machine (no cluster); the sparsity it ran at and the error against dense
  attention restricted to the kept tiles.
* ``remote-model``: one forward of ComfyUI's sampler on A through B's DiT actor (the per-forward path, wire schema 5)
  at 1344x768x124 and x345, CFG batch 2, with a stand-in forward that costs nothing: the round trip (hand-offs and
  Ray only) against vLLM-Omni's 31.4 s step, and the once-per-sampling context apart.
* ``soak``: N prompts of a day of use through a running ComfyUI (started when no ``--url`` is given): templates and
  core graphs in turn, parallel, LoRA switches, interrupts, bad inputs, re-queues, two clients; the growth of every
  memory, file and cache metric per 100 prompts after the warm-up, and the processes left after ComfyUI's SIGTERM
  (:mod:`.soak`).
* ``two-hosts``: one whole request (encode, denoise, decode, MP4) on one host doing everything against the pair (A and
  B as separate hosts of ``scripts/two_hosts.py``: parallel A+B denoise, split decode, the QSFP link), with a random
  H3 whose denoise and decode stand in the real model's proportion (:mod:`.two_hosts`; root).
* ``all``: every bench above in one cluster (``vsa`` and ``soak`` excepted).

``--json`` makes the LAST line of output one JSON object; ``--quick`` shrinks counts for the smoke test.
Numbers are medians; the goals (ratio_vs_raw <= 1.2, makespan <= 1.05 x ideal, >= 1.6 x sequential, step overhead
<= 1 ms, warm load 0) are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

from .. import runner
from . import (batch, decode, handoff, memory, parallel, pipeline, pool, preview, remote_model, soak, step, two_hosts,
               vsa)
from .common import DEFAULT_SYNTHETIC, cluster, tiny_checkpoint


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m comfy_h3_nodes bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)

    def common(sp):
        sp.add_argument("--json", action="store_true", help="print one JSON object as the last line")
        sp.add_argument("--quick", action="store_true", help="tiny counts (the smoke test)")
        sp.add_argument("--object-store-mb", type=int, default=1024, help="object store per node (embedded cluster)")
        return sp

    h = common(sub.add_parser("handoff", help="A<->B payload hand-off vs Ray's raw floor and memcpy"))
    h.add_argument("--repeats", type=int, default=None, help="measured repeats per shape (default 10; quick 2)")
    h.add_argument("--warmup", type=int, default=None, help="unmeasured repeats first (default 2; quick 1)")
    h.add_argument("--only", default="", help="comma-separated substrings: run only matching shapes")
    h.add_argument("--tensor-transport", action="store_true",
                   help="also measure Ray's direct tensor transport (gloo) for the same byte counts")
    pl = common(sub.add_parser("pipeline", help="N requests through the executor, pipelined vs sequential"))
    pl.add_argument("--requests", type=int, default=None, help="requests (default 8; quick 3)")
    pl.add_argument("--in-flight", default=None, help="comma-separated max_in_flight values (default 2,3; quick 2)")
    pl.add_argument("--stages", default=None,
                    help="synthetic seconds, e.g. encode=0.2,denoise=0.4,decode=0.15 (quick: a quarter of those)")
    pl.add_argument("--ckpt", default=None, help="tiny checkpoint folder (built there if missing)")
    so = common(sub.add_parser("step-overhead", help="per-step control overhead on B"))
    so.add_argument("--iterations", type=int, default=None, help="steps timed (default 10000; quick 2000)")
    so.add_argument("--no-model", action="store_true", help="skip the tiny-model with/without hooks comparison")
    so.add_argument("--ckpt", default=None)
    w = common(sub.add_parser("warm", help="first vs second request: the second loads nothing"))
    w.add_argument("--ckpt", default=None)
    m = common(sub.add_parser("memory", help="memory plan vs what B holds, tiny and at real size"))
    m.add_argument("--ckpt", default=None, help="tiny checkpoint folder (built with its format fixtures if missing)")
    d = common(sub.add_parser("decode", help="video decode by A alone vs split with B, at 124 and 345 frames"))
    d.add_argument("--repeats", type=int, default=None, help="measured rounds (default 2; quick 1)")
    d.add_argument("--frames", default="124,345", help="comma-separated frame counts (17n+5)")
    bt = common(sub.add_parser("batch", help="N prompts in one graph run vs N graph runs (headless runner)"))
    bt.add_argument("--requests", type=int, default=None, help="prompts (default 8; quick 3)")
    pa = common(sub.add_parser("parallel", help="one request's denoise on 1 rank vs a DiT group of 2 (A + B)"))
    pa.add_argument("--repeats", type=int, default=None, help="measured rounds (default 3; quick 1)")
    pa.add_argument("--steps", type=int, default=3, help="sigma points per request (default 3: 2 forwards)")
    pa.add_argument("--canvas", default=None, help="HEIGHTxWIDTH at 124 frames (default 384x640: 9,363 packed rows; "
                    "320x480: 6,033)")
    po = common(sub.add_parser("pool", help="B-bound requests through a pool of 1, then 2 DiT workers (bench_pool)"))
    po.add_argument("--requests", type=int, default=None, help="requests per run (default 8; quick 3)")
    po.add_argument("--ckpt", default=None)
    pv = common(sub.add_parser("preview", help="one live preview's cost on B and its bytes, at real size"))
    pv.add_argument("--repeats", type=int, default=None, help="measured previews per shape (default 50; quick 3)")
    vs = common(sub.add_parser("vsa", help="VSA-H3 vs dense attention time at a tiny shape (no cluster)"))
    vs.add_argument("--sparsity", type=float, default=None, help="VSA sparsity (default FastH3 v1's 0.9)")
    vs.add_argument("--tile-size", type=int, default=64, choices=(64, 256))
    vs.add_argument("--repeats", type=int, default=None, help="measured repeats (default 5; quick 2)")
    vs.add_argument("--device", default="cpu")
    vs.add_argument("--kernel", default=None, help="VSA kernel (default $H3_VSA_KERNEL, else auto)")
    rm = common(sub.add_parser("remote-model", help="one sampler forward's round trip A->B->A at real shapes"))
    rm.add_argument("--forwards", type=int, default=None, help="timed forwards per shape (default 10; quick 3)")
    rm.add_argument("--warmup", type=int, default=None, help="unmeasured forwards first (default 2; quick 1)")
    rm.add_argument("--shapes", default=None, help="comma-separated WIDTHxHEIGHTxFRAMES (default "
                    f"{','.join(remote_model.SHAPES)}; quick {','.join(remote_model.QUICK_SHAPES)})")
    sk = common(sub.add_parser("soak", help="N prompts of a day of use through ComfyUI: what grows per 100 prompts"))
    sk.add_argument("--prompts", type=int, default=None, help="prompts (default 200; quick 12)")
    sk.add_argument("--url", default=None, help="a running ComfyUI (default: start one)")
    sk.add_argument("--pid", type=int, default=None, help="its process id (for its RSS, files, threads)")
    sk.add_argument("--comfyui", default=None, help="ComfyUI checkout (default $COMFYUI_DIR, else ../shared/comfyui)")
    sk.add_argument("--python", default=None, help="ComfyUI's Python (default $COMFYUI_PYTHON, else .comfyui-venv)")
    sk.add_argument("--warmup", type=int, default=20, help="prompts before growth is measured (default 20)")
    th = common(sub.add_parser("two-hosts", help="one whole request on one host vs the pair A+B on two hosts (root)"))
    th.add_argument("--timeout", type=float, default=540.0, help="bound of the whole bench in seconds (default 540)")
    a = common(sub.add_parser("all", help="every bench, one cluster"))
    a.add_argument("--repeats", type=int, default=None)
    a.add_argument("--requests", type=int, default=None)
    a.add_argument("--ckpt", default=None)
    return p


def _stages(text: str | None, quick: bool) -> dict:
    if text:
        out = {}
        for part in text.split(","):
            k, _, v = part.partition("=")
            if k.strip() not in ("encode", "denoise", "decode"):
                raise SystemExit(f"--stages: unknown stage {k!r}; use encode, denoise, decode")
            out[k.strip()] = float(v)
        return out
    return {k: v / 4 for k, v in DEFAULT_SYNTHETIC.items()} if quick else dict(DEFAULT_SYNTHETIC)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    quick = args.quick
    log = (lambda s: print(s, flush=True))
    result: dict = {}
    verb = args.verb
    if verb == "parallel":  # its own cluster, ranks at nice 0: .parallel
        res = parallel.run_parallel(args.repeats or (1 if quick else 3), args.steps, quick, log,
                                    canvas=parallel.parse_canvas(args.canvas))
        if args.json:
            print(json.dumps(res), flush=True)  # exactly {"ranks": {...}, "speedup": ..., "shape": {...}}
        return 0
    if verb == "two-hosts":  # the harness's hosts, each with its own cluster: .two_hosts
        res = two_hosts.run_two_hosts(quick, log, timeout=args.timeout)
        res.pop("_detail", None)
        if args.json:
            print(json.dumps(res), flush=True)  # exactly the keys, in its order
        return 0
    if verb == "soak":  # through ComfyUI's HTTP API: its own cluster, inside ComfyUI
        res = soak.run_soak(args.prompts or (12 if quick else 200), url=args.url, pid=args.pid,
                            comfy_dir=args.comfyui, python=args.python, warmup=args.warmup, log=log)
        if args.json:
            print(soak.main_json(res), flush=True)
        return 0 if res["failed_unexpectedly"] == 0 else 1
    if verb == "preview":  # no cluster: B's own computation
        res = preview.run_preview(args.repeats or (3 if quick else 50), log)
        if args.json:
            print(json.dumps(res), flush=True)
        return 0
    if verb == "vsa":  # attention only, in this process
        res = vsa.run_vsa(quick, args.sparsity, args.tile_size, args.repeats, args.device, args.kernel, log)
        if args.json:
            print(vsa.main_json(res), flush=True)
        return 0
    if verb == "pool":  # its own three-node cluster: .pool
        res = pool.run_pool(args.requests or (3 if quick else 8), ckpt=args.ckpt and tiny_checkpoint(args.ckpt), log=log)
        if args.json:
            print(pool.main_json(res), flush=True)
        return 0
    if verb == "remote-model":  # B's DiT actor with a stand-in forward, on the two-node cluster
        shapes = (args.shapes.split(",") if args.shapes
                  else remote_model.QUICK_SHAPES if quick else remote_model.SHAPES)
        with cluster(args.object_store_mb):
            res = remote_model.run_remote_model(shapes, args.forwards or (3 if quick else 10),
                                                args.warmup if args.warmup is not None else (1 if quick else 2), log)
        if args.json:
            print(json.dumps(remote_model.main_json(res)), flush=True)  # exactly {"shapes": {...}, "worst_share..."}
        return 0
    needs_cluster = verb in ("handoff", "pipeline", "warm", "memory", "decode", "all")
    with (cluster(args.object_store_mb) if needs_cluster else contextlib.nullcontext()):
        if verb in ("handoff", "all"):
            repeats = args.repeats or (2 if quick else 10)
            warmup = getattr(args, "warmup", None)
            warmup = warmup if warmup is not None else (1 if quick else 2)
            shapes = handoff.handoff_shapes()
            only = [s for s in (getattr(args, "only", "") or "").split(",") if s]
            if only:
                shapes = [s for s in shapes if any(o in s["name"] for o in only)]
            result["handoff"] = handoff.run_handoff(repeats, warmup, shapes, getattr(args, "tensor_transport", False),
                                                    log)
        if verb in ("pipeline", "all"):
            n = args.requests or (3 if quick else 8)
            inflight = getattr(args, "in_flight", None) or ("2" if quick else "2,3")
            result["pipeline"] = pipeline.run_pipeline(n, tuple(int(x) for x in inflight.split(",")),
                                                       _stages(getattr(args, "stages", None), quick),
                                                       args.ckpt and tiny_checkpoint(args.ckpt), log)
        if verb in ("step-overhead", "all"):
            its = getattr(args, "iterations", None) or (2000 if quick else 10_000)
            result["step-overhead"] = step.run_step_overhead(
                its, model_steps=4 if quick else 20, model_repeats=2 if quick else 3,
                ckpt=args.ckpt and tiny_checkpoint(args.ckpt), with_model=not getattr(args, "no_model", False),
                log=log)
        if verb in ("warm", "all"):
            result["warm"] = pipeline.run_warm(args.ckpt and tiny_checkpoint(args.ckpt), log)
        if verb == "memory":
            result["memory"] = memory.run_memory(args.ckpt, log)
        if verb == "decode":
            result["decode"] = decode.run_decode(tuple(int(x) for x in args.frames.split(",")),
                                                 args.repeats or (1 if quick else 2), quick, log)
    if verb == "batch":  # the runner starts and joins its own embedded cluster, as `run` does
        try:
            result["batch"] = batch.run_batch(args.requests or (3 if quick else 8), log=log)
        finally:
            runner._shutdown_embedded()
        if args.json:
            print(json.dumps(result["batch"]), flush=True)  # exactly the keys
        return 0
    if verb == "decode":
        result["decode"].pop("_detail", None)
        if args.json:
            print(json.dumps(result["decode"]), flush=True)  # exactly {"frames": {"124": {...}, "345": {...}}}
        return 0
    if args.json and verb == "memory":
        print(json.dumps(result["memory"]), flush=True)  # exactly {"plans": {...}}, in the key order
        return 0
    if args.json:
        payload = result[verb] if verb != "all" else {"bench": "all", **result}
        payload["quick"] = quick
        print(json.dumps(payload, sort_keys=True, default=str), flush=True)
    return 0
