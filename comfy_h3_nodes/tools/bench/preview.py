"""``bench preview``: what a live preview costs B per step, and its bytes, at the released model's sizes.

B's preview of one step is :class:`~...engine.model.preview.Previewer.make` on the packed rows diffusers' loop holds
(``[rows, 24 * 1 * 2 * 2]`` fp32 for the real patch (1, 2, 2)): the rows of one latent frame, the estimate
``x0 = x_next + sigma_next * v``, the linear map to RGB, a JPEG. Measured here at 1344x768 (84 x 48 latents) with 124
and 345 frames, on latents of two kinds: Gaussian noise (the first steps; the JPEG's worst case) and a smooth field
(what late steps look like). The share of a step is against the public figure of 31.4 s per step (vLLM-Omni, two
GB10s, 1344x768, 5 s): a single GB10 is slower, so the share there is smaller still.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import video_latent_num_frames

from ...engine.contract import wire
from ...engine.model.preview import Previewer

PUBLIC_STEP_S = 31.4  # s per step, two GB10s (shared/design.md section 8)
PATCH = (1, 2, 2)


def _factors() -> tuple:
    rng = np.random.default_rng(0)
    return tuple(tuple(float(v) for v in row) for row in rng.uniform(-0.2, 0.2, (24, 3)))


def _rows(frames: int, height: int, width: int, smooth: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if smooth:
        y = torch.linspace(0, 3.14, height // 2)[:, None, None]
        x = torch.linspace(0, 3.14, width // 2)[None, :, None]
        base = torch.sin(y * torch.arange(1, 97)[None, None, :] / 24) * torch.cos(x)
        return base.reshape(1, -1, 96).expand(frames, -1, -1).reshape(-1, 96).contiguous()
    return torch.randn(frames * (height // 2) * (width // 2), 96, generator=g)


def run_preview(repeats: int = 50, log=print) -> dict:
    spec = wire.PreviewSpec("latent2rgb", _factors(), (0.0, 0.0, 0.0), max_side=512, source="bench")
    out = {"public_step_s": PUBLIC_STEP_S, "shapes": {}}
    for frames in (124, 345):
        lf, lh, lw = video_latent_num_frames(frames, 17, 5), 768 // 16, 1344 // 16
        for kind in ("noise", "smooth"):
            latents = _rows(lf, lh, lw, kind == "smooth")
            velocity = torch.zeros_like(latents)[None]
            pv = Previewer(spec, "bench")
            costs, sizes = [], []
            for i in range(repeats + 2):
                t0 = time.perf_counter()
                got = pv.make(i, repeats + 2, latents, velocity, 0.5, condition_rows=0, grid=(lf, lh, lw),
                              patch=PATCH, step_s=PUBLIC_STEP_S)
                if i >= 2:  # the first two warm up the allocator and Pillow's encoder
                    costs.append(time.perf_counter() - t0)
                    sizes.append(len(got.jpeg))
            cost = statistics.median(costs)
            row = {"latent_grid": [lf, lh, lw], "rows": int(latents.shape[0]), "cost_ms": round(cost * 1e3, 3),
                   "min_ms": round(min(costs) * 1e3, 3),
                   "jpeg_bytes": int(statistics.median(sizes)), "image": [got.width, got.height],
                   "share_of_step": cost / PUBLIC_STEP_S, "every": pv.every}
            out["shapes"][f"1344x768x{frames}/{kind}"] = row
            log(f"[preview] 1344x768, {frames} frames, {kind}: {row['cost_ms']:.2f} ms on B per preview (median; "
                f"min {row['min_ms']:.2f}), "
                f"{row['jpeg_bytes']} B JPEG {got.width}x{got.height}, {row['share_of_step'] * 100:.4f} % of a "
                f"{PUBLIC_STEP_S} s step")
    worst = max(r["share_of_step"] for r in out["shapes"].values())
    out["worst_share_of_step"] = worst
    out["goal"] = "< 1 % of a step"
    out["met"] = worst < 0.01
    return out
