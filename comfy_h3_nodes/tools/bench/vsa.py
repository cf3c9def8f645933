"""``bench vsa``: VSA-H3 attention (tile scores, selection, the kept tiles' attention, the gated compression branch)
against dense attention over the same packed sequence, on this machine's CPU (or ``--device``), at a tiny shape with
enough tiles for the sparsity to matter. On CUDA both sides run in bf16 (B's dtype) and every timed run is
synchronised before the clock is read.

The default shape is a 768x1024 canvas's token grid over 16 latent frames, (T, Hp, Wp) = (16, 24, 32), behind 320
text rows and 272 audio rows: 12,880 rows, 10 prefix tiles and 4 x 6 x 8 = 192 video tiles of 64 (``--quick``: 3,664
rows, 48 video tiles).
Both sides get the same q, k, v (and gate); the numbers are medians, and the sparse output is checked against dense
attention restricted to the kept tiles (``max_abs_diff``), so a fast wrong result cannot pass for a speed-up.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from ...engine.model import vsa
from ...engine.model.fasth3 import RELEASES
from ...engine.model.vsa_kernels import resolve_vsa_kernel

#: (segments, grid, heads, head_dim)
DEFAULT_SHAPE = ((320, 0, 272), (16, 24, 32), 2, 64)
QUICK_SHAPE = ((320, 0, 272), (16, 12, 16), 2, 64)


def _median_s(fn, repeats: int, warmup: int = 1, device: str = "cpu") -> float:
    """Median seconds of ``fn``; on CUDA the queue is drained before each clock read (kernels run asynchronously:
    without it the clock times the launches, not the work)."""
    cuda = str(device).startswith("cuda")

    def wait():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        wait()
        t0 = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


def bench_dtype(device: str):
    """bf16 on CUDA (what B runs; the kernels' fast path), fp32 on the CPU."""
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def run_vsa(quick: bool = False, sparsity: float | None = None, tile_size: int = 64, repeats: int | None = None,
            device: str = "cpu", kernel: str | None = None, log=print) -> dict:
    segments, grid, heads, dim = QUICK_SHAPE if quick else DEFAULT_SHAPE
    sparsity = RELEASES["v1"]["sparsity"] if sparsity is None else float(sparsity)
    repeats = repeats or (2 if quick else 5)
    geo = vsa.geometry(segments, grid, tile_size, device)
    kern = resolve_vsa_kernel(kernel, device, (tile_size,))
    gen = torch.Generator("cpu").manual_seed(0)
    dtype = bench_dtype(device)
    q, k, v, gate = (torch.randn(1, geo.length, heads, dim, generator=gen).to(device, dtype) for _ in range(4))
    dense_s = _median_s(lambda: vsa.sdpa(q, k, v), repeats, device=device)
    run = lambda: vsa.vsa_attention(q, k, v, gate, geo, sparsity, True, kern)  # noqa: E731
    vsa_s = _median_s(run, repeats, device=device)
    out, mask = run()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=vsa.token_mask(mask, geo)).transpose(1, 2)
    ref = ref + vsa.compression(vsa.tile_scores(q, k, geo), v, gate, geo, ref.dtype)
    kept = vsa.k_video(sparsity, geo.video_tiles)
    result = {
        "bench": "vsa", "device": str(device), "dtype": str(dtype).removeprefix("torch."), "kernel": kern.label, "threads": torch.get_num_threads(),
        "sparsity": sparsity, "tile_size": tile_size, "shape": {"segments": list(segments), "grid": list(grid),
                                                                 "rows": geo.length, "heads": heads, "head_dim": dim},
        "tiles": {"prefix": geo.prefix_tiles, "video": geo.video_tiles, "kept_video_per_query_tile": kept},
        "dense_s": round(dense_s, 5), "vsa_s": round(vsa_s, 5), "speedup": round(dense_s / vsa_s, 3),
        "max_abs_diff": float((out.float() - ref.float()).abs().max()), "repeats": repeats, "quick": quick,
    }
    log(f"bench vsa: {geo.length} rows ({geo.describe()}), {heads} heads x {dim}, sparsity {sparsity:g} "
        f"(keeps {kept} of {geo.video_tiles} video tiles): dense {dense_s * 1e3:.1f} ms, VSA-H3 "
        f"{vsa_s * 1e3:.1f} ms ({result['speedup']:.2f}x; {kern.label}); |VSA - masked dense| <= "
        f"{result['max_abs_diff']:.2e}")
    return result


def main_json(result: dict) -> str:
    return json.dumps(result, sort_keys=True)
