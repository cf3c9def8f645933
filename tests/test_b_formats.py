"""B loads its transformer from every format at every precision, keeps both partitions when the plan allows it, and
refuses what does not fit before loading anything.

Tolerance of the lossy precisions: fp8 storage and the tiny Q8_0 GGUF change B's latents (they must), by at most
``LOSSY_TOL`` in absolute value; the latents' mean magnitude is about 0.9 and the measured differences are 0.01-0.02.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from comfy_h3_nodes.engine.model import memory_plan as mp
from conftest import denoise_each, encode_each, single_process_reference

LOSSY_TOL = 0.1


def _single(ckpt):
    return {p: str(ckpt / "single_file" / f"{p}.safetensors") for p in ("transformer", "transformer_ref")}


def _gguf(ckpt):
    return {p: str(ckpt / "gguf" / f"{p}-Q8_0.gguf") for p in ("transformer", "transformer_ref")}


@pytest.fixture(scope="module")
def a_bf16(tiny_ckpt):
    from comfy_h3_nodes.engine.a_side.side import ASide

    return ASide(tiny_ckpt, dtype="bfloat16")


@pytest.fixture(scope="module")
def encoded(a_bf16, media):
    """Per workflow: the encoded payload and its denoise call (``b.denoise(*encoded[wf])``)."""
    return encode_each(a_bf16, ("t2va", "ref2va"), media)


@pytest.fixture(scope="module")
def folder_latents(tiny_ckpt, encoded):
    return denoise_each(tiny_ckpt, encoded)


def test_single_file_bf16_bit_exact(tiny_ckpt, a_bf16, encoded, folder_latents, media):
    """The published single file (through from_single_file) denoises exactly as the diffusers folder, and the decoded
    video equals diffusers' own single-process pipeline."""
    from remote_worker.b_side import BSide

    b = BSide(tiny_ckpt, dtype="bfloat16", sources=_single(tiny_ckpt))
    assert {s.kind for s in b.sources.values()} == {"single_file"}
    for wf, enc in encoded.items():
        got = b.denoise(*enc).latents
        assert np.array_equal(got.latents.data, folder_latents[wf].latents.data), wf
        assert np.array_equal(got.audio_latents.data, folder_latents[wf].audio_latents.data), wf
    out = a_bf16.decode_raw(b.denoise(*encoded["t2va"]).latents, "np")
    expected = single_process_reference(tiny_ckpt, "t2va", media, dtype="bfloat16")
    assert np.array_equal(out["videos"], expected["videos"])
    assert torch.equal(out["audio"], expected["audio"])


@pytest.mark.parametrize("case", ["gguf", "fp8", "fp8-single-file"])
def test_lossy_precisions_finish_and_stay_close(tiny_ckpt, encoded, folder_latents, case):
    from remote_worker.b_side import BSide

    kw = {"gguf": {"sources": _gguf(tiny_ckpt)}, "fp8": {"precision": "fp8"},
          "fp8-single-file": {"precision": "fp8", "sources": _single(tiny_ckpt)}}[case]
    b = BSide(tiny_ckpt, dtype="bfloat16", **kw)
    assert b.precision == ("gguf" if case == "gguf" else "fp8")
    for wf, enc in encoded.items():
        got = b.denoise(*enc).latents.latents.to_torch()
        ref = folder_latents[wf].latents.to_torch()
        assert torch.isfinite(got).all()
        assert not torch.equal(got, ref), f"{case} {wf} should differ from bf16"
        assert (got - ref).abs().max().item() < LOSSY_TOL, (case, wf, (got - ref).abs().max().item())


@pytest.mark.parametrize("kw", [{"precision": "fp8"}, {"sources": "gguf"}, {}], ids=["fp8", "gguf", "bf16"])
def test_plan_predicts_what_b_holds(tiny_ckpt, kw):
    """The plan (headers and config only) equals B's own accounting of its parameters and buffers."""
    from remote_worker.b_side import BSide

    if kw.get("sources") == "gguf":
        kw = {"sources": _gguf(tiny_ckpt)}
    b = BSide(tiny_ckpt, dtype="bfloat16", **kw)
    measured = b.resident_bytes()
    planned = {c.name: c.bytes for c in b.memory_plan.components}
    assert planned == measured
    report = b.memory_report()
    assert report["measured_bytes"] == measured and report["fits"] and report["residency"] == "both"


def test_fp8_keeps_both_partitions_resident(tiny_ckpt, encoded):
    from remote_worker.b_side import BSide

    b = BSide(tiny_ckpt, dtype="bfloat16", precision="fp8")
    assert b.residency == "both" and set(b.resident()) >= {"transformer", "transformer_ref"}
    b.denoise(*encoded["t2va"])
    before = list(b.load_records)
    res = b.denoise(*encoded["ref2va"])
    assert b.load_records == before and res.swap_s == 0.0  # ref2va after t2va: zero loads
    assert b.partition == "transformer_ref"
    res = b.denoise(*encoded["t2va"])
    assert b.load_records == before and res.swap_s == 0.0


def _limit_for(plan_need: int) -> int:
    """The memory limit whose usable part (after the margin) is exactly ``plan_need``."""
    return int(plan_need / (1 - mp.margin_fraction())) + 2


def test_plan_allowing_one_partition_keeps_the_swap(tiny_ckpt, encoded):
    from remote_worker.b_side import BSide

    probe = BSide(tiny_ckpt, dtype="bfloat16", precision="fp8")
    sources = probe.sources
    canvas = mp.default_canvas(tiny_ckpt)  # what B budgets working memory for
    one = mp.plan_b(sources, ("transformer",), "fp8", "bfloat16", canvas=canvas, limit_bytes=10**12)
    both = mp.plan_b(sources, ("transformer", "transformer_ref"), "fp8", "bfloat16", canvas=canvas,
                     limit_bytes=10**12)
    assert one.need_bytes < both.need_bytes
    b = BSide(tiny_ckpt, dtype="bfloat16", precision="fp8", memory_limit_bytes=_limit_for(one.need_bytes))
    assert b.residency == "one" and b.resident_partitions == ["transformer"]
    b.denoise(*encoded["t2va"])
    res = b.denoise(*encoded["ref2va"])
    assert res.swap_s > 0 and b.load_records[-1].reason == "swap transformer -> transformer_ref"
    assert "swapped partition" in res.schedule_note()
    with pytest.raises(mp.MemoryPlanError, match="fp8 for one partition"):  # asked for both: refused, option named
        BSide(tiny_ckpt, dtype="bfloat16", precision="fp8", residency="both",
              memory_limit_bytes=_limit_for(one.need_bytes))


def test_plan_too_big_is_refused_before_loading(tiny_ckpt, monkeypatch):
    from comfy_h3_nodes.engine.model import split
    from remote_worker.b_side import BSide

    def no_load(*a, **k):
        raise AssertionError("B loaded something although its plan does not fit")

    monkeypatch.setattr(split, "load_checked", no_load)
    with pytest.raises(mp.MemoryPlanError) as err:
        BSide(tiny_ckpt, dtype="bfloat16", memory_limit_bytes=1000)
    msg = str(err.value)
    assert msg.startswith("memory plan refused before loading anything: B plan (bfloat16, transformer only")
    import re

    assert re.search(r"transformer [\d.]+ KiB \+ working [\d.]+ [KM]iB = [\d.]+ [KM]iB > [\d.]+ KiB free on B \(limit", msg)
    assert "no precision or residency of these files fits" in msg
    # bf16 for both does not fit, fp8 for both does: the refusal names it
    from comfy_h3_nodes.engine.model import formats

    srcs = {p: formats.detect(tiny_ckpt, p) for p in ("transformer", "transformer_ref")}
    canvas = mp.default_canvas(tiny_ckpt)
    fp8_both = mp.plan_b(srcs, ("transformer", "transformer_ref"), "fp8", canvas=canvas, limit_bytes=10**12)
    bf16_both = mp.plan_b(srcs, ("transformer", "transformer_ref"), "bf16", canvas=canvas, limit_bytes=10**12)
    assert fp8_both.need_bytes < bf16_both.need_bytes
    with pytest.raises(mp.MemoryPlanError, match=r"\(bfloat16, both partitions\).* > .*; fp8 for both \(.*\) fits"):
        BSide(tiny_ckpt, dtype="bfloat16", residency="both", memory_limit_bytes=_limit_for(fp8_both.need_bytes))
    monkeypatch.setenv(mp.LIMIT_ENV, "1000")  # the environment variable does the same
    with pytest.raises(mp.MemoryPlanError, match="H3_MEMORY_LIMIT_BYTES"):
        BSide(tiny_ckpt, dtype="bfloat16")


def test_precision_must_suit_the_file(tiny_ckpt):
    from remote_worker.b_side import BSide

    with pytest.raises(mp.MemoryPlanError, match="GGUF file, used as stored"):
        BSide(tiny_ckpt, dtype="bfloat16", precision="fp8", sources=_gguf(tiny_ckpt))
    with pytest.raises(mp.MemoryPlanError, match="precision 'gguf' needs a .gguf file"):
        BSide(tiny_ckpt, dtype="bfloat16", precision="gguf")


def test_refused_sources_never_load(tiny_ckpt, tmp_path):
    from comfy_h3_nodes.engine.model import formats
    from remote_worker.b_side import BSide

    with pytest.raises(formats.FormatError, match="is not a MiniMax-H3 transformer"):
        BSide(tiny_ckpt, sources={"transformer": str(tiny_ckpt / "vae" / "diffusion_pytorch_model.safetensors")})


def test_k_quant_gguf_runs_close_to_its_bf16_file(tiny_ckpt, encoded):
    """The K-quant fixture (a wider transformer, Q6_K where rows are 256 wide, config beside the files) loads through
    diffusers' GGUF quantizer and stays close to the same weights' bf16 single file; the plan matches again."""
    from remote_worker.b_side import BSide

    wide = tiny_ckpt / "gguf" / "wide"
    ref = BSide(tiny_ckpt, dtype="bfloat16", residency="one",
                sources={"transformer": str(wide / "transformer.safetensors")})
    q6 = BSide(tiny_ckpt, dtype="bfloat16", residency="one",
               sources={"transformer": str(wide / "transformer-Q6_K.gguf")})
    assert q6.sources["transformer"].config_root == wide.resolve()
    assert q6.sources["transformer"].quant_types()["Q6_K"] >= 8
    assert q6.resident_bytes() == {c.name: c.bytes for c in q6.memory_plan.components}
    got = q6.denoise(*encoded["t2va"]).latents.latents.to_torch()
    want = ref.denoise(*encoded["t2va"]).latents.latents.to_torch()
    assert torch.isfinite(got).all() and not torch.equal(got, want)
    assert (got - want).abs().max().item() < LOSSY_TOL, (got - want).abs().max().item()
