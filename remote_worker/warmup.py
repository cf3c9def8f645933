"""A minimal request for B's warm-up: the smallest canvas, the shortest clip, one transformer forward.

It goes through the actor's real ``denoise`` (object store, receipt, validation, diffusers' blocks) for the workflow
of the resident partition, so the first real request pays no first-call costs and the setup proves the path works.
The conditioning is random: B never sees the prompt, only its embeddings.
"""

from __future__ import annotations

import time

import ray
import torch

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.model.split import torch_dtype

WORKFLOW_OF = {"transformer": "t2va", "transformer_ref": "ref2va"}


SMALL = (64, 64, 124)  # 124 frames: the shortest clip MiniMax-H3 makes (5 s after 17n+5)


def canvases_for(health: dict) -> list[tuple[int, int, int]]:
    """The canvases B warms up at: the smallest (the path works), and on CUDA also the plan's canvas (its sequence
    length: FastH3's kernels, flash and cuDNN pick their tiles per length, so the first real request pays no tuning)."""
    out = [SMALL]
    canvas = tuple((health.get("memory_plan") or {}).get("canvas") or ())
    if str(health.get("device") or "").startswith("cuda") and len(canvas) == 3 and canvas != SMALL:
        out.append(tuple(int(x) for x in canvas))
    return out


def payload(partition: str, text_dim: int, dtype: str = "bfloat16", request_id: str | None = None,
            canvas: tuple[int, int, int] = SMALL, tokens: int = 8):
    """The warm-up's conditioning (random embeddings) for ``canvas`` (height, width, frames); the GPU bench and the
    tests build their requests here too, so none of them can drift from the wire's fields."""
    workflow = WORKFLOW_OF[partition]
    h, w, frames = canvas
    gen = torch.Generator("cpu").manual_seed(0)
    extra = {}
    if workflow == "ref2va":
        latent = torch.zeros(1, wire.VIDEO_LATENT_CHANNELS, 1, h // wire.SPATIAL_COMPRESSION,
                             w // wire.SPATIAL_COMPRESSION)
        extra = {"condition_latents": (wire.WireTensor.from_torch(latent),),
                 "references": (wire.ReferenceMeta("image", False),)}
    embeds = torch.randn(1, tokens, text_dim, generator=gen).to(torch_dtype(dtype))
    return wire.EncodedRequest(
        request_id=request_id or f"warmup-{int(time.time())}", workflow=workflow, height=h, width=w,
        num_frames=frames, prompt_embeds=wire.WireTensor.from_torch(embeds),
        text_token_tags=wire.WireTensor.from_torch(torch.zeros(tokens, dtype=torch.int64)), **extra,
    ).validate(text_dim=text_dim)


def call_for(pay: wire.EncodedRequest, steps: int, seed: int = 0, **kw) -> wire.DenoiseCall:
    return wire.DenoiseCall(pay.request_id, pay.request_id, seed=seed, num_inference_steps=steps, **kw)


def run(actor, partition: str, text_dim: int, dtype: str, timeout: float, steps: int = 2,
        canvases: list | None = None) -> dict:
    """Warm-up denoises (two sigma points; a FastH3 partition: the ``steps`` it was trained for) through ``actor``,
    one per canvas of ``canvases`` (default: the smallest); returns the timing facts of the last, with each
    canvas's seconds."""
    out, seen = {}, []
    for canvas in canvases or [SMALL]:
        pay = payload(partition, text_dim, dtype, canvas=tuple(canvas))
        call = call_for(pay, steps)
        t0 = time.perf_counter()
        latents_ref, recs_ref = actor.denoise.remote([ray.put(pay)], call, timeout)
        records = ray.get(recs_ref, timeout=timeout)
        latents = ray.get(latents_ref, timeout=timeout)
        den = records[1]
        seen.append({"canvas": list(canvas), "seconds": round(time.perf_counter() - t0, 3)})
        out = {"request_id": pay.request_id, "workflow": pay.workflow, "seconds": seen[-1]["seconds"],
               "compute_s": round(den.compute_s, 3), "steps": len(den.steps),
               "latents": list(latents.latents.shape), "canvases": seen}
    return out
