"""VSA-H3 (engine/model/vsa.py): tiles, selection, the sparse attention against dense attention restricted to the kept
tiles, the layout read from diffusers' own packed sequences, the processor on a tiny FastH3 transformer, and the
whole algorithm against FastVideo's own code (fastvideo 0.2.1, loaded by tests/fastvideo_ref.py).

Tolerances, measured on this machine (torch 2.13 CPU) and asserted with headroom: the torch kernel against dense
attention under the equivalent token mask differs by at most 1.6e-15 in fp64, 5.4e-7 in fp32 and 3.9e-3 (one bf16 ulp
near 1) in bf16, over 5 seeds x 3 settings with values of order 1; the asserted bounds are 1e-12, 2e-6 and 1.6e-2.
Against FastVideo's own forward (its kernel call replaced by the kernels' contract in plain PyTorch, see
``_kernel_contract``) by <= 1e-7 in fp64 inputs (FastVideo pools in fp32, so does the pack).
"""

from __future__ import annotations

import math

import pytest
import torch
from diffusers.modular_pipelines.minimax_h3.before_denoise import (MiniMaxH3PrepareLayoutStep,
                                                                   MiniMaxH3Ref2VAPrepareLayoutStep)
from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3AudioReference, MiniMaxH3ImageReference

import fastvideo_ref
from comfy_h3_nodes.engine.model import vsa
from comfy_h3_nodes.engine.model.backends import AttentionBackendError
from comfy_h3_nodes.engine.model.vsa_kernels import TorchKernel

F = torch.nn.functional
#: (prefix segments, token grid (T, Hp, Wp), tile size): ragged, production-sized, 256-token, empty segments
GEOMETRIES = [((70, 5, 130), (9, 10, 13), 64), ((300, 0, 414), (37, 24, 42), 64), ((300, 0, 414), (37, 24, 42), 256),
              ((512, 1760, 400), (30, 22, 40), 256), ((33, 0, 17), (5, 3, 7), 64), ((64, 0, 0), (4, 4, 4), 64)]
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 1.6e-2}


def _qkvg(geo, heads=3, dim=16, batch=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, geo.length, heads, dim, generator=g, dtype=torch.float64).to(dtype) for _ in range(4)]


def _masked_dense(q, k, v, gate, geo, sparsity, exempt=True):
    """The reference: dense SDPA under the token mask the tile mask stands for, plus the compression branch."""
    scores = vsa.tile_scores(q, k, geo)
    mask = vsa.block_mask(scores, geo.prefix_tiles, geo.video_tiles, sparsity, exempt)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=vsa.token_mask(mask, geo)).transpose(1, 2)
    if gate is not None:
        out = out + vsa.compression(scores, v, gate, geo, out.dtype)
    return out, mask


# ---------------------------------------------------------------------------------------------------- tiles
def test_tiles_have_the_worked_sizes():
    geo = vsa.geometry((70, 5, 130), (9, 10, 13), 64)
    assert geo.sizes[:geo.prefix_tiles].tolist() == [64, 6, 5, 64, 64, 2]  # chunks never cross a segment
    assert geo.video_tiles == 3 * 3 * 4 and geo.sizes[geo.prefix_tiles:].tolist()[:4] == [64, 64, 64, 16]
    prod = vsa.geometry((300, 0, 414), (37, 24, 42), 64)
    assert (prod.prefix_tiles, prod.video_tiles) == (12, 660) and int(prod.sizes.min()) == 1 * 4 * 2
    assert (vsa.geometry((300, 0, 414), (37, 24, 42), 256).prefix_tiles,
            vsa.geometry((300, 0, 414), (37, 24, 42), 256).video_tiles) == (4, 180)


@pytest.mark.parametrize("segments,grid,tile", GEOMETRIES)
def test_every_row_has_one_slot_in_its_tile(segments, grid, tile):
    geo = vsa.geometry(segments, grid, tile)
    assert int(geo.sizes.sum()) == geo.length == sum(segments) + math.prod(grid)
    assert 1 <= int(geo.sizes.min()) and int(geo.sizes.max()) <= tile
    assert torch.equal(torch.bincount(geo.tile, minlength=geo.n), geo.sizes)
    assert geo.slot.unique().numel() == geo.length and torch.equal(geo.slot // tile, geo.tile)
    assert bool((geo.slot % tile < geo.sizes[geo.tile]).all())  # valid rows first in each tile
    # a video row's tile from its (t, h, w): t-tile major, then h, then w
    (T, H, W), (ts, hs, ws) = grid, vsa.TILE_SHAPES[tile]
    nh, nw = math.ceil(H / hs), math.ceil(W / ws)
    for r in (0, H * W - 1, math.prod(grid) // 2, math.prod(grid) - 1):
        t, h, w = r // (H * W), (r // W) % H, r % W
        assert int(geo.tile[sum(segments) + r]) == geo.prefix_tiles + ((t // ts) * nh + h // hs) * nw + w // ws


def test_k_video_is_fastvideos_arithmetic():
    assert [vsa.k_video(s, 120) for s in (0.0, 0.5, 0.7, 0.8, 0.9)] == [120, 60, 37, 24, 12]  # (1-0.7)*120 > 36
    assert (vsa.k_video(0.9, 660), vsa.k_video(0.9, 180), vsa.k_video(0.9, 10), vsa.k_video(0.99, 3)) == (66, 18, 1, 1)


def test_block_mask_policy():
    g = torch.Generator().manual_seed(3)
    p, nv = 5, 40
    scores = torch.randn(2, 3, p + nv, p + nv, generator=g)
    m = vsa.block_mask(scores, p, nv, 0.8)
    kv = vsa.k_video(0.8, nv)
    assert bool(m[:, :, :p].all()) and bool(m[..., :p].all())  # dense prefix queries; prefix keys always kept
    assert (m[:, :, p:, p:].sum(-1) == kv).all()
    top = scores[:, :, p:, p:].topk(kv, dim=-1).indices
    assert bool(m[:, :, p:, p:].gather(-1, top).all())  # exactly the top-k by score
    c = vsa.block_mask(scores, p, nv, 0.8, exempt=False)
    assert (c[:, :, p:].sum(-1) == kv + p).all() and bool(c[:, :, :p].all())
    assert bool(vsa.block_mask(scores, p, nv, 0.0).all())


# ---------------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sparsity,exempt", [(0.9, True), (0.75, False), (0.5, True)])
def test_sparse_equals_dense_restricted_to_the_kept_tiles(dtype, sparsity, exempt):
    geo = vsa.geometry((70, 5, 130), (9, 10, 13), 64)
    q, k, v, gate = _qkvg(geo, dtype=dtype)
    out, mask = vsa.vsa_attention(q, k, v, gate, geo, sparsity, exempt, TorchKernel())
    ref, ref_mask = _masked_dense(q, k, v, gate, geo, sparsity, exempt)
    assert torch.equal(mask, ref_mask) and not bool(mask.all())
    assert (out.double() - ref.double()).abs().max() <= TOL[dtype]
    full = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    assert (out.double() - (full + vsa.compression(vsa.tile_scores(q, k, geo), v, gate, geo, dtype))
            .double()).abs().max() > 10 * TOL[dtype]  # sparse is not dense


def test_no_sparsity_and_no_gate_is_dense_attention():
    geo = vsa.geometry((33, 0, 17), (5, 3, 7), 64)
    q, k, v, _ = _qkvg(geo)
    out, mask = vsa.vsa_attention(q, k, v, None, geo, 0.0, True, TorchKernel())
    assert bool(mask.all()) and torch.allclose(out, vsa.sdpa(q, k, v), atol=1e-6)


def test_torch_kernel_takes_any_tile_mask():
    """Dense prefix rows are a shortcut, not an assumption: a mask that thins them too is computed exactly."""
    geo = vsa.geometry((70, 5, 130), (9, 10, 13), 64)
    q, k, v, _ = _qkvg(geo, dtype=torch.float64)
    mask = torch.rand(2, 3, geo.n, geo.n, generator=torch.Generator().manual_seed(1)) < 0.3
    mask[..., 0] = True  # every query tile keeps one tile at least
    out = TorchKernel().run(q, k, v, mask, geo, vsa.sdpa)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=vsa.token_mask(mask, geo)).transpose(1, 2)
    assert (out - ref).abs().max() < 1e-12


def test_fastvideo_kernel_adapter_feeds_the_padded_tile_layout():
    """The CUDA kernels' adapter (padded [B, n * E, H, D] buffers, BHSD entry, rows gathered back), run here with the
    kernels' contract in plain PyTorch in place of the CUDA kernel: it equals the torch kernel."""
    from comfy_h3_nodes.engine.model.vsa_kernels import FastVideoKernel, bhsd_entry

    geo = vsa.geometry((70, 5, 130), (9, 10, 13), 64)
    q, k, v, gate = _qkvg(geo, heads=2, dim=64, dtype=torch.float64)
    contract = FastVideoKernel("contract", "the kernels' contract", bhsd_entry(_kernel_contract(64)), None)
    out, mask = vsa.vsa_attention(q, k, v, gate, geo, 0.8, True, contract)
    ref, _ = vsa.vsa_attention(q, k, v, gate, geo, 0.8, True, TorchKernel())
    assert not bool(mask.all()) and (out - ref).abs().max() < 1e-12
    with pytest.raises(AttentionBackendError, match="head_dim 64 or 128, not 16"):
        contract.run(*_qkvg(geo)[:3], mask, geo, vsa.sdpa)  # head_dim 16


# ---------------------------------------------------------------------------------------------------- layout
def _layout_step_args(n_text, frames, lh, lw, anchors=()):
    return dict(text_token_tags=torch.ones(n_text, dtype=torch.long), num_latent_frames=frames, latent_height=lh,
                latent_width=lw, num_audio_latents=2 * frames + 3, patch_size=(1, 2, 2), audio_channels=2,
                audio_tag=2, video_tag=0, keyframe_anchors=anchors)


@pytest.mark.parametrize("anchors", [(), ("first",), ("first", "last")], ids=["t2va", "i2va", "fl2va"])
def test_layout_is_read_from_diffusers_packed_sequence(anchors):
    pos, tags, vid, aud, txt, n_cond, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        **_layout_step_args(11, 7, 6, 10, anchors))
    layout = vsa.layout_of(pos, txt, aud, vid)
    assert layout.grid == (7, 3, 5) and layout.segments == (11, n_cond, 2 * (2 * 7 + 3))
    assert n_cond == len(anchors) * 15 and layout.length == pos.shape[0]


def test_ref2va_layout_uses_fastvideos_three_numbers():
    refs = [MiniMaxH3ImageReference(image=None), MiniMaxH3AudioReference(audio=torch.zeros(2, 8), sample_rate=8)]
    pos, _, vid, aud, txt, _, _ = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
        torch.ones(9, dtype=torch.long), refs, [torch.zeros(1, 24, 1, 4, 6)], [torch.zeros(10, 32)], 5, 8, 8, 13,
        (1, 2, 2), 2, 2, 0)
    layout = vsa.layout_of(pos, txt, aud, vid)
    # [text | image ref rows | ref audio | target audio | target video]: FastVideo's (text, video refs, all audio)
    assert layout.grid == (5, 4, 4) and layout.segments == (9, 6, 10 + 26)


def test_a_layout_that_is_not_h3s_is_refused():
    pos, _, vid, aud, txt, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(**_layout_step_args(11, 7, 6, 10))
    with pytest.raises(vsa.VSALayoutError, match="raster"):
        vsa.layout_of(pos.flip(0), txt, aud, vid)
    with pytest.raises(vsa.VSALayoutError, match="does not end with its target video"):
        vsa.layout_of(pos, txt, aud, vid[:-1])


# ---------------------------------------------------------------------------------------------------- model
class _TokenMaskKernel:
    """Dense SDPA under the token mask: the reference the processor's kernel is checked against."""

    name = label = "token-mask reference"

    def run(self, q, k, v, mask, geo, dense):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              attn_mask=vsa.token_mask(mask, geo)).transpose(1, 2)


def _tiny_vsa_model(tiny_fasth3, kernel):
    from diffusers import MiniMaxH3Transformer3DModel

    from comfy_h3_nodes.engine.model import formats

    src = formats.detect(tiny_fasth3, "transformer")
    model = MiniMaxH3Transformer3DModel.from_pretrained(str(src.path)).eval()
    state = vsa.install(model, src.vsa, kernel, src.path)
    return model, state


def _forward(model, frames=13, lh=8, lw=12, seed=0):
    pos, tags, vid, aud, txt, n_cond, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        **_layout_step_args(40, frames, lh, lw, ("first",)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        return model(hidden_states=torch.randn(1, vid.numel(), 96, generator=g),
                     audio_hidden_states=torch.randn(1, aud.numel(), 32, generator=g),
                     encoder_hidden_states=torch.randn(1, 40, 32, generator=g), timestep=torch.tensor([0.3, 0.0]),
                     timestep_indices=(torch.arange(pos.shape[0]) < 40).long(), token_tags=tags,
                     position_ids=pos.float(), video_indices=vid, audio_indices=aud, text_indices=txt,
                     return_dict=False)


def test_processor_matches_the_token_mask_reference_in_the_model(tiny_fasth3):
    model, state = _tiny_vsa_model(tiny_fasth3, TorchKernel())
    ref_model, _ = _tiny_vsa_model(tiny_fasth3, _TokenMaskKernel())
    out, ref = _forward(model), _forward(ref_model)
    assert state.geometry.layout.grid == (13, 4, 6) and state.geometry.video_tiles == 4 * 1 * 2
    assert state.geometry.layout.segments == (40, 24, 2 * (2 * 13 + 3))
    assert max(float((a - b).abs().max()) for a, b in zip(out, ref)) < 1e-5
    assert state.kept == [1 / 8]  # sparsity 0.9 of 8 video tiles: each video query tile keeps ceil(0.8) = 1


def test_the_gates_and_the_sparsity_change_the_output(tiny_fasth3):
    from diffusers import MiniMaxH3Transformer3DModel

    model, state = _tiny_vsa_model(tiny_fasth3, TorchKernel())
    out = _forward(model)
    dense = MiniMaxH3Transformer3DModel.from_pretrained(str(tiny_fasth3 / "transformer")).eval()  # gates dropped
    assert min(float((a - b).abs().max()) for a, b in zip(out, _forward(dense))) > 1e-3
    state.gates_active = False  # the sparse branch alone
    assert min(float((a - b).abs().max()) for a, b in zip(out, _forward(model))) > 1e-3


def test_the_layout_is_read_however_the_forward_is_called(tiny_fasth3):
    model, state = _tiny_vsa_model(tiny_fasth3, TorchKernel())
    pos, tags, vid, aud, txt, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(**_layout_step_args(8, 5, 4, 4))
    state.pre_hook(model, (torch.zeros(1, vid.numel(), 96), torch.zeros(1, aud.numel(), 32), torch.zeros(1, 8, 32),
                           torch.zeros(1), torch.zeros(pos.shape[0], dtype=torch.long), tags, pos, vid, aud, txt), {})
    assert state.geometry.layout == vsa.Layout((8, 0, 26), (5, 2, 2))  # positional arguments, as a caller may pass


def test_the_processor_never_runs_without_its_layout(tiny_fasth3):
    model, state = _tiny_vsa_model(tiny_fasth3, TorchKernel())
    block = model.transformer_blocks[0]
    with pytest.raises(vsa.VSALayoutError, match="without a layout"):
        block.attn(torch.zeros(1, 10, 24))
    _forward(model)
    with pytest.raises(vsa.VSALayoutError, match="set up for"):
        block.attn(torch.zeros(1, 10, 24))  # another sequence than the forward's: refused, not run dense


# ---------------------------------------------------------------------------------------------------- FastVideo
@pytest.fixture(scope="module")
def fv():
    mods = fastvideo_ref.load()
    if mods is None:
        pytest.skip(f"fastvideo {fastvideo_ref.VERSION} is not installed (make test installs it: "
                    f"{fastvideo_ref.INSTALL})")
    return mods


def _kernel_contract(tile):
    """What FastVideo's block-sparse kernels compute, in plain PyTorch on their padded BHSD layout: each query tile
    attends to the key tiles its mask row keeps, a key slot counting only below its tile's valid size."""
    def run(q, k, v, mask, vbs):
        n = mask.shape[-1]
        tiles = torch.arange(n * tile) // tile
        valid = (torch.arange(n * tile) % tile) < vbs[tiles]
        keep = mask[:, :, tiles][:, :, :, tiles] & valid
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep), None
    return run


@pytest.mark.parametrize("segments,grid,tile", GEOMETRIES)
def test_tile_maps_equal_fastvideos(fv, segments, grid, tile):
    fv_vsa, h3 = fv
    tpi, vbs, untile, p, nv = h3._h3_tile_geometry(tuple(s for s in segments if s > 0), grid, torch.device("cpu"),
                                                    h3.VSA_H3_TILE_SHAPES[tile])
    geo = vsa.geometry(segments, grid, tile)
    assert (geo.prefix_tiles, geo.video_tiles) == (p, nv)
    assert torch.equal(geo.sizes, vbs.long()) and torch.equal(geo.slot, untile.long())
    for s in (0.0, 0.5, 0.7, 0.8, 0.9, 0.95):
        assert vsa.k_video(s, nv) == fv_vsa.compute_topk(s, nv)


@pytest.mark.parametrize("sparsity,mode", [(0.9, "exempt"), (0.75, "compete"), (0.0, "exempt")])
def test_selected_blocks_and_output_equal_fastvideos(fv, sparsity, mode):
    """FastVideo's metadata builder, tiling, pooling, block mask, compression branch and untiling against ours on
    the same q, k, v and gate; only its kernel call is replaced (by the kernels' contract)."""
    _, h3 = fv
    segments, grid, tile, heads, dim = (70, 5, 130), (9, 10, 13), 64, 3, 16
    geo = vsa.geometry(segments, grid, tile)
    q, k, v, gate = _qkvg(geo, heads, dim, dtype=torch.float64)
    md = h3.MiniMaxH3VSAMetadataBuilder().build(
        current_timestep=0, raw_latent_shape=(grid[0], 2 * grid[1], 2 * grid[2]), patch_size=(1, 2, 2),
        VSA_sparsity=sparsity, prefix_segments=segments, device=torch.device("cpu"), exempt=mode == "exempt",
        tile_size=tile)
    impl = h3.MiniMaxH3VSAImpl(num_heads=heads, head_size=dim, causal=False, softmax_scale=dim ** -0.5,
                               prefix="transformer_blocks.3.attn")
    tq, tk, tv, tg = (impl.tile(x, md).clone() for x in (q, k, v, gate))
    fv_scores = h3._pool_tiles(tq, md.variable_block_sizes, tile) @ \
        h3._pool_tiles(tk, md.variable_block_sizes, tile).transpose(-2, -1) / dim ** 0.5
    fv_mask = h3._build_block_mask(fv_scores, md.num_prefix_tiles, md.num_video_tiles, sparsity, mode == "exempt")
    saved = h3.block_sparse_attn_64_bhsd
    h3.block_sparse_attn_64_bhsd = _kernel_contract(tile)
    try:
        fv_out = impl.postprocess_output(impl.forward(tq, tk, tv, tg, md), md)
    finally:
        h3.block_sparse_attn_64_bhsd = saved
    out, mask = vsa.vsa_attention(q, k, v, gate, geo, sparsity, mode == "exempt", TorchKernel())
    assert torch.equal(mask, fv_mask)
    assert (vsa.tile_scores(q, k, geo) - fv_scores).abs().max() < 1e-6
    assert (out - fv_out).abs().max() < 1e-7, float((out - fv_out).abs().max())
