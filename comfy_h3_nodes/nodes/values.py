"""The values H3 nodes hand each other, by ComfyUI type:

* ``H3_ENCODERS``: A's resident side (``engine.a_side.side.ASide``: text encoder, video and audio VAE);
* ``H3_DIT``: :class:`DiT`, an executor bound to the DiT workers on B, with the LoRA adapters of ``H3LoRA`` nodes;
* ``H3_KEYFRAMES``: :class:`Keyframes`; ``H3_REFERENCES``: :class:`References`;
* ``H3_CONDITIONING``: an ``engine.executor.Conditioning``, one encoded request held on A (a cached one survives a
  cluster restart); in a batch, its encode may still be running;
* ``H3_LATENTS``: an ``engine.executor.Job``, one denoise run: in flight on B, then its latents on A. A job of a
  batch carries its ``batch`` (one progress counter, one stop for all).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Keyframes:
    first: object = None
    last: object = None


@dataclasses.dataclass
class References:
    images: list
    audio: object = None  # engine.contract.request.AudioClip


@dataclasses.dataclass(frozen=True)
class DiT:
    """H3_DIT: the same resident DiT for every node downstream, plus the adapters each request through it asks for."""

    executor: object
    adapters: tuple = ()


def dit_parts(dit) -> tuple[object, tuple]:
    """``(executor, adapters)`` of an H3_DIT (a bare executor has none)."""
    if isinstance(dit, DiT):
        return dit.executor, dit.adapters
    return dit, ()
