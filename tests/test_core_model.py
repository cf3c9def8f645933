"""B's side of ComfyUI's own samplers (issue #28) without a ComfyUI: one forward as ``BSide.forward_rows`` runs it
(the sampling context's guide rows filled in, the target rows' output back, an interrupt between blocks) against
diffusers' transformer called directly, ComfyUI's LoRA patches as B applies them (bypass form) against the same
LoRA merged into the weights, and the wire contract's checks of the per-forward payloads. The same path through a
real ComfyUI, against core's UNETLoader, is in ``tests/test_comfyui_integration.py`` (``-k core_model``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.contract.forward_payloads import (ComfyLora, ComfyLoraSet, ForwardCall, ForwardContext,
                                                            ForwardResult)
from comfy_h3_nodes.engine.contract.errors import DenoiseCancelled
from comfy_h3_nodes.engine.model.tiny_comfy import fixture
from remote_worker.b_side import BSide

W = wire.WireTensor.from_torch
NT, NC, NV, NA = 5, 6, 12, 8  # text rows, guide rows, target video rows, audio rows


@pytest.fixture(scope="module")
def b_side(tiny_ckpt):
    """B on the tiny Comfy-Org file (ComfyUI's own samplers run B's single-file transformer), fp32."""
    files = {p: str(fixture(tiny_ckpt, f"{p}:pruned_bf16")) for p in ("transformer", "transformer_ref")}
    return BSide(tiny_ckpt, dtype="float32", residency="one", sources=files)


def _context(b, batch: int = 1, sampling_id: str = "s-test") -> ForwardContext:
    g = torch.Generator().manual_seed(3)
    model = b._host.transformer
    text_dim, vdim, adim = model.config.text_dim, 24 * 4, 32
    seq = NT + NC + NV + NA
    tags = torch.tensor([1] * NT + [0] * (NC + NV) + [2] * NA)
    pos = torch.randn(seq, 3, generator=g)
    target = torch.tensor([False] * NC + [True] * NV)
    return ForwardContext(sampling_id, W(torch.randn(batch, NT, text_dim, generator=g)), W(tags), W(pos),
                               W(torch.arange(NT, NT + NC + NV)), W(torch.arange(NT + NC + NV, seq)),
                               W(torch.arange(NT)), W(target), W(torch.ones(NA, dtype=torch.bool)),
                               W(torch.randn(NC, vdim, generator=g)), W(torch.zeros(0, adim)))


def _call(ctx: ForwardContext, index: int = 0, batch: int = 1) -> ForwardCall:
    g = torch.Generator().manual_seed(4 + index)
    seq = ctx.seq_len
    t_idx = torch.zeros(seq, dtype=torch.uint8)
    t_idx[NT:NT + NC] = 2  # the guide rows at their own (pinned) level
    t_idx[NT + NC + NV:] = 1
    return ForwardCall(ctx.sampling_id, index, W(torch.randn(batch, NV, 96, generator=g)),
                            W(torch.randn(batch, NA, 32, generator=g)), W(torch.tensor([0.4, 0.55, 0.999])),
                            W(t_idx))


def _tensors(ctx):
    return {**{k: t.to_torch() for k, t in ctx.tensors().items()}, "partition": ctx.partition}


def _direct(b, ctx, call):
    """diffusers' transformer on every row (guide rows in their place), the target rows of its output."""
    t = _tensors(ctx)
    video = torch.empty(1, NC + NV, 96)
    video[:, ~t["video_target"]] = t["cond_video"]
    video[:, t["video_target"]] = call.video.to_torch()
    with torch.inference_mode():
        out = b._host.transformer(hidden_states=video, audio_hidden_states=call.audio.to_torch(),
                                  encoder_hidden_states=t["text"], timestep=call.timestep.to_torch(),
                                  timestep_indices=call.timestep_indices.to_torch().long(),
                                  token_tags=t["token_tags"], position_ids=t["position_ids"],
                                  video_indices=t["video_indices"], audio_indices=t["audio_indices"],
                                  text_indices=t["text_indices"])
    return out.sample[:, t["video_target"]], out.audio_sample


def test_forward_rows_is_diffusers_forward_with_the_guide_rows_in_place(b_side):
    ctx = _context(b_side).validate(text_dim=b_side.text_dim)
    call = _call(ctx).validate(ctx)
    video, audio, compute_s, _reload, lora_modules = b_side.forward_rows(_tensors(ctx), call)
    ref_v, ref_a = _direct(b_side, ctx, call)
    assert video.shape == (1, NV, 96) and audio.shape == (1, NA, 32) and lora_modules == 0
    assert torch.equal(video, ref_v) and torch.equal(audio, ref_a)
    assert compute_s > 0
    ForwardResult(ctx.sampling_id, 0, W(video), W(audio)).validate(call)


def test_forward_rows_answers_in_the_calls_dtype(b_side):
    """The sampler's bf16 latent crosses as bf16 rows (a permutation of it) and the output comes back as bf16."""
    ctx = _context(b_side)
    c32 = _call(ctx)
    c16 = dataclasses.replace(c32, video=W(c32.video.to_torch().bfloat16()), audio=W(c32.audio.to_torch().bfloat16()))
    video, audio, *_ = b_side.forward_rows(_tensors(ctx), c16.validate(ctx))
    assert video.dtype == audio.dtype == torch.bfloat16
    ref_v, _ = _direct(b_side, ctx, dataclasses.replace(c32, video=W(c16.video.to_torch().float()),
                                                        audio=W(c16.audio.to_torch().float())))
    assert torch.equal(video, ref_v.bfloat16())


def test_an_interrupt_stops_the_forward_between_blocks(b_side):
    ctx = _context(b_side)
    with pytest.raises(DenoiseCancelled, match=r"interrupted in forward 1 on B, before transformer block 1 of"):
        b_side.forward_rows(_tensors(ctx), _call(ctx), should_cancel=lambda: True, request_id="s-test")
    asked = []

    def late():  # the interrupt comes while the last block computes
        asked.append(1)
        return len(asked) > len(b_side._host.transformer.transformer_blocks)
    with pytest.raises(DenoiseCancelled, match=r"after transformer block (\d+) of \1"):
        b_side.forward_rows(_tensors(ctx), _call(ctx), should_cancel=late, request_id="s-test")
    video, *_ = b_side.forward_rows(_tensors(ctx), _call(ctx))  # and the next forward runs as before
    assert torch.equal(video, _direct(b_side, ctx, _call(ctx))[0])


def _lora(b, strength: float, rank: int = 2, seed: int = 5) -> ComfyLoraSet:
    """ComfyUI-named LoRA patches of block 0's qkv_proj (stacked: B cuts its rows as its loader does) and fc1
    (stored [gate; up], diffusers' [up; gate])."""
    g = torch.Generator().manual_seed(seed)
    shapes = {k: t.shape for k, t in b.sources["transformer"].tensors.items()}
    out = []
    for key in ("blocks.0.attn.qkv_proj.weight", "blocks.0.mlp.fc1.weight"):
        o, i = shapes[key]
        out.append(ComfyLora(key, strength / rank, W(torch.randn(o, rank, generator=g)),
                                  W(torch.randn(rank, i, generator=g))))
    return ComfyLoraSet(tuple(out)).validate()


def test_comfy_lora_on_b_is_the_lora_merged_into_the_weights(b_side):
    """B's bypass form (``scale * up(down(x))`` added to each module's output) equals the LoRA merged into the
    weights as ComfyUI merges it (``W += strength * alpha / rank * up @ down``, cut into diffusers' modules); the
    next forward without the set runs on the untouched weights; another set stacks."""
    from comfy_h3_nodes.engine.model import comfy_dit

    ctx = _context(b_side)
    call = _call(ctx)
    plain, *_ = b_side.forward_rows(_tensors(ctx), call)
    lora = _lora(b_side, 0.7)
    hooked, _, _, _, modules = b_side.forward_rows(_tensors(ctx), call, lora=("set-1", lora))
    assert modules == 4  # to_q, to_k, to_v and fc1's module
    model = b_side._host.transformer
    names = b_side.sources["transformer"].tensors
    saved = {}
    with torch.no_grad():
        for dname, (cname, how, part) in comfy_dit.comfy_to_diffusers(names).items():
            p = next((x for x in lora.patches if x.key == cname), None)
            if p is None or not dname.endswith(".weight"):
                continue
            delta = p.scale * p.up.to_torch() @ p.down.to_torch()
            param = model.get_parameter(dname)
            saved[dname] = param.detach().clone()
            param += comfy_dit.cut_rows(delta, how, part, None)
        try:
            merged, *_ = b_side.forward_rows(_tensors(ctx), call)
        finally:
            for dname, value in saved.items():
                model.get_parameter(dname).copy_(value)
    assert (hooked - plain).abs().max() > 1e-3  # the LoRA does something
    assert torch.allclose(hooked, merged, atol=1e-5, rtol=1e-5), (hooked - merged).abs().max()
    again, *_ = b_side.forward_rows(_tensors(ctx), call)  # removed: the resident weights are as they were
    assert torch.equal(again, plain)
    both = ComfyLoraSet(lora.patches + _lora(b_side, -0.4, seed=6).patches)
    stacked, *_ = b_side.forward_rows(_tensors(ctx), call, lora=("set-2", both))
    assert (stacked - hooked).abs().max() > 1e-4


def test_a_lora_for_a_layer_b_lacks_is_refused_by_name(b_side):
    ctx = _context(b_side)
    bad = ComfyLoraSet((ComfyLora("blocks.99.attn.qkv_proj.weight", 1.0, W(torch.ones(3, 1)),
                                            W(torch.ones(1, 2))),))
    with pytest.raises(ValueError, match=r"blocks\.99\.attn\.qkv_proj\.weight, which B's transformer does not have"):
        b_side.forward_rows(_tensors(ctx), _call(ctx), lora=("set-bad", bad))


@pytest.mark.parametrize("change, words", [
    (lambda c, x: (dataclasses.replace(c, schema_version=4), x),
     ["sampling context", "version 4", f"version {wire.SCHEMA_VERSION}"]),
    (lambda c, x: (dataclasses.replace(c, partition="transformer_x"), x), ["partition is 'transformer_x'"]),
    (lambda c, x: (dataclasses.replace(c, token_tags=W(torch.full((c.seq_len,), 7))), x), ["token_tags", "0 (video)"]),
    (lambda c, x: (dataclasses.replace(c, video_indices=W(torch.arange(100, 118))), x), ["video_indices points"]),
    (lambda c, x: (c, dataclasses.replace(x, sampling_id="other")), ["came with the context of 's-test'"]),
    (lambda c, x: (c, dataclasses.replace(x, video=W(torch.zeros(1, NV + 1, 96)))), ["video has shape (1, 13, 96)"]),
    (lambda c, x: (c, dataclasses.replace(x, timestep=W(torch.tensor([0.5])))), ["points past the 1 timestep"]),
    (lambda c, x: (c, dataclasses.replace(x, parallel=wire.ParallelCall("g1", 2, 2))), ["parallel.rank is 2"]),
    (lambda c, x: (c, dataclasses.replace(x, parallel="A+B")), ["forward parallel is a str"]),
    (lambda c, x: (c, dataclasses.replace(x, video=W(torch.zeros(1, NV, 96, dtype=torch.int32)))),
     ["video has dtype int32"]),
])
def test_forward_payloads_are_checked_on_arrival(b_side, change, words):
    ctx, call = change(_context(b_side), _call(_context(b_side)))
    with pytest.raises(wire.WireError) as err:
        ctx.validate(text_dim=b_side.text_dim)
        call.validate(ctx)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_a_context_for_another_text_width_is_refused(b_side):
    with pytest.raises(wire.WireError, match=r"text has shape \(1, 5, \d+\), expected \(\*, \*, 3\)"):
        _context(b_side).validate(text_dim=3)


def test_b_describes_its_file_and_refuses_a_folder(b_side, tiny_ckpt):
    info = b_side.transformer_file()
    assert info["path"].endswith("minimax_h3_t2va_pruned_bf16.safetensors")
    assert "blocks.0.attn.qkv_proj.weight" in info["tensors"] and info["dtype"] == "float32"
    shape, dtype = info["tensors"]["blocks.0.attn.qkv_proj.weight"]
    assert len(shape) == 2 and dtype in ("BF16", "F32")
    folder = BSide(tiny_ckpt, dtype="float32", residency="one")
    with pytest.raises(Exception, match=r"need B's transformer as one Comfy-Org .safetensors file"):
        folder.transformer_file()


def test_a_forward_for_a_dit_group_this_worker_is_not_in_is_refused_in_one_sentence(b_side):
    """A forward that names a DiT group (parallel A+B) on a worker outside it: refused before any block runs, with
    the group it is in and the one the forward is for (never run alone as if it were the whole group)."""
    ctx = _context(b_side)
    call = dataclasses.replace(_call(ctx), parallel=wire.ParallelCall("g-missing", 1, 2))
    from comfy_h3_nodes.engine.model.parallel import ParallelError

    with pytest.raises(ParallelError, match=r"this DiT worker is in no group, and forward 1 of sampling .* is for group "
                                         r"g-missing rank 1 of 2: form the group again"):
        b_side.forward_rows(_tensors(ctx), call)
