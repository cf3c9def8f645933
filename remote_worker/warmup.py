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


def payload(partition: str, text_dim: int, dtype: str = "bfloat16", request_id: str | None = None):
    workflow = WORKFLOW_OF[partition]
    tokens, h, w, frames = 8, 64, 64, 124  # 124 frames: the shortest clip MiniMax-H3 makes (5 s after 17n+5)
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


def run(actor, partition: str, text_dim: int, dtype: str, timeout: float, steps: int = 2) -> dict:
    """One warm-up denoise (two sigma points; a FastH3 partition: the ``steps`` it was trained for) through
    ``actor``; returns its timing facts."""
    pay = payload(partition, text_dim, dtype)
    call = wire.DenoiseCall(pay.request_id, pay.request_id, seed=0, num_inference_steps=steps)
    t0 = time.perf_counter()
    latents_ref, recs_ref = actor.denoise.remote([ray.put(pay)], call, timeout)
    records = ray.get(recs_ref, timeout=timeout)
    latents = ray.get(latents_ref, timeout=timeout)
    den = records[1]
    return {"request_id": pay.request_id, "workflow": pay.workflow, "seconds": round(time.perf_counter() - t0, 3),
            "compute_s": round(den.compute_s, 3), "steps": len(den.steps),
            "latents": list(latents.latents.shape)}
