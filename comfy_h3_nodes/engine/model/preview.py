"""Live previews of B's denoise: its current estimate of the clean latents, one frame, as a small JPEG.

After each step B holds ``x_next`` and the model's velocity ``v`` at ``x_t``. H3's scheduler is rectified-flow Euler
with a data-ward velocity (``x0 = x_t + sigma * v``, ``x_next = x_t + (sigma - sigma_next) * v``), so the estimate
is ``x0 = x_next + sigma_next * v``: no extra model work. Only the rows of one latent frame are touched (the middle
generated frame: the first is a given keyframe in fl2va), unpacked the way diffusers' decode step unpacks them, mapped
to RGB by a per-channel linear map (ComfyUI's ``latent_rgb_factors`` for H3) and encoded as JPEG with Pillow; or
(method ``latent``) sent as the float16 frame itself, which A decodes with ComfyUI's tiny preview decoder for H3.
"""

from __future__ import annotations

import io
import math
import time

import torch
from PIL import Image

from ..contract.wire import Preview, PreviewSpec

JPEG_QUALITY = 85
MIN_SIDE = 128  # a tiny latent grid is enlarged (nearest neighbour, at most 8x) so its blocks stay visible


def x0_frame(latents: torch.Tensor, velocity: torch.Tensor, sigma_next: float, *, condition_rows: int,
             grid: tuple[int, int, int], patch: tuple[int, int, int], frame: int) -> torch.Tensor:
    """The estimate of latent frame ``frame`` as ``[channels, height, width]`` (float32) from the packed rows.

    ``latents``: ``[rows, channels * pt * ph * pw]`` after the step; ``velocity``: the model's output for the same
    rows (a leading batch of 1 allowed); ``grid``: ``(latent frames, latent height, latent width)``."""
    pt, ph, pw = patch
    frames, height, width = grid
    per_frame_group = (height // ph) * (width // pw)
    group, sub = divmod(frame, pt)
    lo = condition_rows + group * per_frame_group
    rows = latents[lo:lo + per_frame_group].float()
    v = velocity.reshape(-1, velocity.shape[-1])[lo:lo + per_frame_group].float()
    x0 = rows + float(sigma_next) * v
    channels = x0.shape[-1] // (pt * ph * pw)
    x0 = x0.reshape(height // ph, width // pw, channels, pt, ph, pw)[:, :, :, sub]  # [H', W', C, ph, pw]
    return x0.permute(2, 0, 3, 1, 4).reshape(channels, height, width)


def to_rgb(frame: torch.Tensor, spec: PreviewSpec) -> torch.Tensor:
    """``[C, H, W]`` latents -> ``[H, W, 3]`` uint8, the way ComfyUI's Latent2RGB previewer maps them."""
    w = torch.tensor(spec.factors, dtype=torch.float32, device=frame.device)  # [C, 3], on the frame's device
    b = torch.tensor(spec.bias, dtype=torch.float32, device=frame.device)
    rgb = torch.einsum("chw,ck->hwk", frame.float(), w) + b
    return ((rgb + 1.0) / 2.0).clamp(0, 1).mul(255).to(torch.uint8)


def encode_jpeg(rgb: torch.Tensor, max_side: int) -> tuple[bytes, int, int]:
    img = Image.fromarray(rgb.cpu().numpy(), "RGB")
    side = max(img.size)
    if side > max_side:
        scale = max_side / side
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BILINEAR)
    elif side < MIN_SIDE:
        k = min(8, max(1, MIN_SIDE // side))
        img = img.resize((img.width * k, img.height * k), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue(), img.width, img.height


class Previewer:
    """One request's previews on B: decides which steps get one (``spec.every``, or so the cost stays under
    ``spec.budget`` of a step) and keeps the latest."""

    def __init__(self, spec: PreviewSpec, request_id: str):
        self.spec = spec
        self.request_id = request_id
        self.latest: Preview | None = None
        self.cost_s: list[float] = []
        self._every = spec.every or 1

    def due(self, i: int, total: int) -> bool:
        return i == total - 1 or i % self._every == 0

    def make(self, i: int, total: int, latents, velocity, sigma_next: float, *, condition_rows: int,
             grid: tuple[int, int, int], patch: tuple[int, int, int], step_s: float) -> Preview:
        t0 = time.perf_counter()
        frame = grid[0] // 2
        x0 = x0_frame(latents, velocity, sigma_next, condition_rows=condition_rows, grid=grid, patch=patch,
                      frame=frame)
        if self.spec.method == "latent":  # A decodes it (ComfyUI's tiny decoder for H3): the frame as it is
            latent = x0.to(torch.float16).cpu().contiguous().numpy()  # one frame to the host (CUDA: a copy)
            jpeg, w, h = b"", latent.shape[2], latent.shape[1]
        else:
            latent = None
            jpeg, w, h = encode_jpeg(to_rgb(x0, self.spec), self.spec.max_side)
        cost = time.perf_counter() - t0
        self.cost_s.append(cost)
        if not self.spec.every and step_s > 0:  # B chooses: keep the previews under the budget of a step
            self._every = max(1, math.ceil(cost / (self.spec.budget * step_s)))
        self.latest = Preview(self.request_id, i, total, jpeg, w, h, cost, frame, latent)
        return self.latest

    @property
    def every(self) -> int:
        return self._every
