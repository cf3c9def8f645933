"""The kernels VSA-H3's block-sparse attention runs on, chosen once per B the way ``attention_backend`` is: a name
checked up front, the real import error when it cannot load, and no fallback (in particular never to dense).

=============  ============================================================================================  ======
name           what runs                                                                                     device
=============  ============================================================================================  ======
``torch``      this pack's: each query tile's kept key tiles gathered and attended with SDPA, the dense       any
               prefix rows with the processor's attention backend; memory bounded by chunks of query tiles
``triton``     FastVideo's Triton block-sparse kernel (``fastvideo_kernel``: ``map_to_index`` +              CUDA
               ``block_sparse_attn_triton``; 256-token tiles: ``block_sparse_attn_256_bshd``); the GB10 path
``fastvideo``  ``fastvideo_kernel.block_sparse_attn``: FastVideo's own dispatch (ThunderKittens on an sm_90     CUDA
               build, else Triton; its ``FASTVIDEO_VSA_*`` variables apply)
``auto``       ``torch`` on a CPU, ``fastvideo`` on CUDA (which then must import)
=============  ============================================================================================  ======

B takes the name from its ``vsa_kernel`` setting, else ``$H3_VSA_KERNEL``, else ``auto``. The ``vsa`` package
(FastVideo's older standalone kernel) implements Wan's VSA (top-k over all tiles, no dense prefix), not VSA-H3, and
is not used.
"""

from __future__ import annotations

import importlib
import os

import torch

from .backends import AttentionBackendError

ENV = "H3_VSA_KERNEL"
CHOICES = ("auto", "torch", "triton", "fastvideo")
#: bytes of gathered keys + values per chunk of query tiles (the torch kernel): small enough to stay in cache
#: while SDPA reads them (measured on 2 CPU cores: 4 MiB chunks ran 2x faster than 256 MiB ones)
CHUNK_BYTES = 4 * 2**20


def _tiles(x: torch.Tensor, geo) -> torch.Tensor:
    """[B, S, H, D] rows scattered into a zeroed tile buffer [B, H, n, E, D] (pad slots stay zero)."""
    b, _, h, d = x.shape
    buf = x.new_zeros(b, h, geo.n * geo.tile_size, d)
    buf.index_copy_(2, geo.slot, x.transpose(1, 2))
    return buf.view(b, h, geo.n, geo.tile_size, d)


class TorchKernel:
    """Block-sparse attention in plain PyTorch, exact for any tile mask: query tiles whose every key tile is kept
    (the dense prefix rows) go to ``dense``; the others attend to their kept tiles only, gathered into one SDPA call
    per chunk with the pad slots masked."""

    name = "torch"

    def __init__(self, device: str = "cpu"):
        self.label = f"torch (kept tiles gathered into SDPA, {device})"

    def run(self, q, k, v, mask, geo, dense):
        b, s, h, d = q.shape
        p, n, e = geo.prefix_tiles, geo.n, geo.tile_size
        if bool(mask.all()):
            return dense(q, k, v)
        rows_dense = geo.prefix_rows if p and bool(mask[:, :, :p].all()) else 0
        first = p if rows_dense else 0  # the first query tile whose kept key tiles are gathered
        out = torch.empty_like(q)
        if rows_dense:
            out[:, :rows_dense] = dense(q[:, :rows_dense], k, v)
        sel_mask = mask[:, :, first:].reshape(b * h, n - first, n)
        kmax = int(sel_mask.sum(-1).max())
        sel = sel_mask.to(torch.int8).topk(kmax, dim=-1).indices  # [BH, nq, K]: the kept tiles, then fillers
        valid = torch.arange(e, device=q.device)[None, :] < geo.sizes[:, None]  # [n, E]
        # additive mask over the gathered keys: 0 for a kept tile's valid rows, -inf for pad rows and fillers
        bias = torch.where(sel_mask.gather(-1, sel)[..., None] & valid[sel], 0.0, float("-inf")).to(q.dtype)
        qt, kt, vt = (_tiles(x, geo).view(b * h, n, e, d) for x in (q, k, v))
        base = (torch.arange(b * h, device=q.device) * n).view(-1, 1, 1)
        step = max(1, CHUNK_BYTES // max(2 * kmax * e * d * q.element_size() * b * h, 1))
        ot = torch.empty_like(qt)
        for a in range(first, n, step):
            z = min(n, a + step)
            flat = (base + sel[:, a - first:z - first]).reshape(-1)  # [BH * c * K] rows of the tile buffers
            keys = kt.view(-1, e * d).index_select(0, flat).view(b * h, z - a, kmax * e, d)
            vals = vt.view(-1, e * d).index_select(0, flat).view(b * h, z - a, kmax * e, d)
            keep = bias[:, a - first:z - first].reshape(b * h, z - a, 1, kmax * e)
            ot[:, a:z] = torch.nn.functional.scaled_dot_product_attention(qt[:, a:z], keys, vals, attn_mask=keep)
        rows = slice(rows_dense, s)
        gathered = ot.view(b, h, n * e, d)[:, :, geo.slot[rows]]
        out[:, rows] = gathered.transpose(1, 2)
        return out


class FastVideoKernel:
    """One of FastVideo's CUDA block-sparse kernels, fed its padded tile layout: q, k, v scattered into ``E`` rows
    per tile, the bool tile mask and the valid rows per tile (``variable_block_sizes``); rows gathered back after."""

    def __init__(self, name: str, label: str, fn64, fn256):
        self.name, self.label, self._fn = name, label, {64: fn64, 256: fn256}

    def run(self, q, k, v, mask, geo, dense):
        fn = self._fn.get(geo.tile_size)
        if fn is None:
            raise AttentionBackendError(f"VSA kernel {self.name!r} has no {geo.tile_size}-token tile path here.")
        if q.shape[-1] not in (64, 128):
            raise AttentionBackendError(f"VSA kernel {self.name!r} takes head_dim 64 or 128, not {q.shape[-1]}.")
        b, s, h, d = q.shape
        padded = [t.new_zeros(b, geo.n * geo.tile_size, h, d).index_copy_(1, geo.slot, t).contiguous()
                  for t in (q, k, v)]
        out = fn(*padded, mask.contiguous(), geo.sizes.to(torch.int32).contiguous())  # [B, n * E, H, D]
        return out[:, geo.slot]


def _import(kernel: str, module: str):
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the real message is the point
        raise AttentionBackendError(
            f"VSA kernel {kernel!r} needs {module!r} (FastVideo's fastvideo-kernel package), whose import failed: "
            f"{type(exc).__name__}: {exc}. Install fastvideo-kernel for this torch/CUDA build, or set the VSA kernel "
            f"to 'torch' (B's vsa_kernel setting or ${ENV}).") from exc


def bhsd_entry(fn):
    """A 64-token block-sparse entry of FastVideo's (``fn(q, k, v, mask, vbs) -> (out, aux)`` on [B, H, S, D]) as the
    [B, S, H, D] function :class:`FastVideoKernel` calls."""
    def run(q, k, v, mask, vbs):
        out, _ = fn(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), mask, vbs)
        return out.transpose(1, 2)
    return run


def _fastvideo_kernels(name: str, tile_sizes) -> FastVideoKernel:
    fn256 = None
    if 256 in tile_sizes:
        m256 = _import(name, "fastvideo_kernel.block_sparse_attn_256")
        fn256 = lambda q, k, v, mask, vbs: m256.block_sparse_attn_256_bshd(q, k, v, mask, vbs)[0]  # noqa: E731
    bsa = _import(name, "fastvideo_kernel.block_sparse_attn")
    if name == "triton":
        index = _import(name, "fastvideo_kernel.triton_kernels.index")

        def triton(q, k, v, mask, vbs):
            q2k_idx, q2k_num = index.map_to_index(mask)
            return bsa.block_sparse_attn_triton(q, k, v, q2k_idx.to(torch.int32).contiguous(),
                                                q2k_num.to(torch.int32).contiguous(), vbs)

        fn64, label = bhsd_entry(triton), "triton (fastvideo_kernel block_sparse_attn_triton)"
    else:
        fn64 = bhsd_entry(bsa.block_sparse_attn)
        label = "fastvideo (fastvideo_kernel block_sparse_attn: ThunderKittens on sm_90 builds, else Triton)"
    version = getattr(importlib.import_module("fastvideo_kernel"), "__version__", "?")
    return FastVideoKernel(name, f"{label} {version}", fn64, fn256)


def resolve_vsa_kernel(name: str | None, device: str, tile_sizes=(64,)):
    """The kernel for ``name`` (None: ``$H3_VSA_KERNEL`` or ``auto``) on ``device``, after proving it loads here;
    raises :class:`AttentionBackendError` with the real cause if not."""
    key = (name or os.environ.get(ENV) or "auto").strip().lower()
    if key not in CHOICES:
        raise AttentionBackendError(f"VSA kernel {key!r} is unknown; choose one of {', '.join(CHOICES)}.")
    cuda = str(device).startswith("cuda")
    if key == "auto":
        key = "fastvideo" if cuda else "torch"
    if key == "torch":
        return TorchKernel(str(device))
    if not cuda:
        raise AttentionBackendError(f"VSA kernel {key!r} runs on CUDA GPUs only and B runs on {device}; choose "
                                    "'torch' (or 'auto').")
    return _fastvideo_kernels(key, set(int(t) for t in tile_sizes))
