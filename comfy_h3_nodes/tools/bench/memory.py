"""``bench memory``: the memory plan of B's transformer residency against what B's actor really holds, for the tiny
model in several plans (Comfy-Org's pruned fp8_scaled files among them), and the plan's arithmetic at the released
model's size, with the room a Spark's A keeps for a DiT partition beside its encoders."""

from __future__ import annotations

import dataclasses
import os
import pathlib

import ray

from remote_worker.actor import start_dit

from ...engine.contract.configs import BConfig
from ...engine.model import comfy_files, formats, released_sizes
from ...engine.model import memory_plan as mp
from ...engine.model.tiny import build_tiny_checkpoint
from ...engine.model.tiny_comfy import fixture
from .common import GOALS, tiny_checkpoint


# ==================================================================================================== memory
#: the plans ``bench memory`` checks: (precision, residency, source format)
MEMORY_PLANS = {"bf16-one": ("bf16", "one", "folder"), "fp8-both": ("fp8", "both", "folder"),
                "gguf-q8_0-both": ("gguf", "both", "gguf"), "pruned-fp8-both": ("auto", "both", "pruned-fp8")}
SPARK = 121 * 2**30  # about what a DGX Spark has usable


def _formats_checkpoint(ckpt) -> pathlib.Path:
    """A tiny checkpoint that also holds the single-file and GGUF fixtures (an older cached one may lack them)."""
    ckpt = pathlib.Path(ckpt) if ckpt else tiny_checkpoint()
    if fixture(ckpt, "audio_vae:fp32").is_file():  # the Comfy-Org fixtures are written last
        return ckpt
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "comfy-h3"
    target = cache / "bench-tiny-h3-formats"
    if not fixture(target, "audio_vae:fp32").is_file():  # written last: a complete build
        build_tiny_checkpoint(target, seed=0)
    return target


def run_memory(ckpt=None, log=print) -> dict:
    """For each plan: what B's actor holds for the tiny model (its own accounting of parameters and buffers), what
    the plan predicted before loading, and the plan at the released model's size (resident weights only; working
    memory is reported apart, it is an estimate and not part of the comparison)."""
    ckpt = _formats_checkpoint(ckpt)
    real = {"folder": released_sizes.real_sources("single_file"), "gguf": released_sizes.real_sources("gguf", "Q8_0"),
            "pruned-fp8": released_sizes.real_sources("pruned-fp8")}
    plans, lines = {}, []
    for label, (precision, residency, kind) in MEMORY_PLANS.items():
        sources = ({p: str(ckpt / "gguf" / f"{p}-Q8_0.gguf") for p in ("transformer", "transformer_ref")}
                   if kind == "gguf" else
                   {p: str(fixture(ckpt, f"{p}:pruned_fp8_scaled")) for p in ("transformer", "transformer_ref")}
                   if kind == "pruned-fp8" else None)
        cfg = dataclasses.asdict(BConfig(str(ckpt), dtype="bfloat16", threads=1, precision=precision,
                                         name=f"h3_dit_bench_memory_{label}_{os.getpid()}", max_restarts=0))
        cfg.update(residency=residency, sources=sources)
        actor = start_dit(cfg, detached=False, get_if_exists=False)
        try:
            report = ray.get(actor.health.remote(), timeout=600)["memory_plan"]
        finally:
            ray.kill(actor, no_restart=True)
        measured = sum(report["measured_bytes"].values())
        planned = int(report["resident_bytes"])
        parts = ("transformer", "transformer_ref") if residency == "both" else ("transformer",)
        rplan = mp.plan_b(real[kind], parts, precision, "bfloat16", "cuda", limit_bytes=10**15)
        plans[label] = {"tiny_measured_bytes": measured, "tiny_planned_bytes": planned,
                        "real_planned_bytes": rplan.resident_bytes}
        lines.append(f"  {label:15} tiny measured {measured:9d} B, planned {planned:9d} B "
                     f"({(planned - measured) / measured * 100:+.2f} %); real {mp.human(rplan.resident_bytes)} "
                     f"+ working {mp.human(rplan.working_bytes)} (estimate, 1344x768x124)")
    ratio = plans["fp8-both"]["real_planned_bytes"] / plans["bf16-one"]["real_planned_bytes"]
    worst = max(abs(v["tiny_planned_bytes"] - v["tiny_measured_bytes"]) / v["tiny_measured_bytes"]
                for v in plans.values())
    lines.append(f"  goals: plan within {GOALS['plan_vs_measured'] * 100:.0f} % of measured: "
                 f"{'met' if worst <= GOALS['plan_vs_measured'] else 'NOT met'} (worst {worst * 100:.2f} %); "
                 f"real fp8-both / bf16-one = {ratio:.3f} (goal <= {GOALS['fp8_both_vs_bf16_one']}): "
                 f"{'met' if ratio <= GOALS['fp8_both_vs_bf16_one'] else 'NOT met'}")
    lines.append("  " + a_room(plans["pruned-fp8-both"]["real_planned_bytes"] // 2))
    lines.append("  " + a_beside_comfyui(int(66.3e9)))
    log("memory plans (B's transformer partitions):\n" + "\n".join(lines))
    return {"plans": plans}


def _released_a_parts() -> dict:
    fake = {"model.layers.49.self_attn.q_proj.weight": formats.TensorInfo("model.layers.49.self_attn.q_proj.weight",
                                                                         (8192, 5120), "BF16", 0)}
    return {c: comfy_files.PartSource(c, pathlib.Path(f"<released {c}>"), fake if c == "text_encoder" else {},
                                      config_root=comfy_files.SHIPPED) for c in ("text_encoder", "vae", "audio_vae")}


def a_beside_comfyui(comfy_bytes: int) -> str:
    """A's plan at the released size when ComfyUI's own loaded models already hold ``comfy_bytes`` of a Spark (e.g.
    its own H3 DiT file, bf16, 66.3 GB): counted besides the free memory, refused with the ways out."""
    parts = _released_a_parts()
    plan = mp.plan_a(formats.RELEASED_CONFIG_DIR, tuple(parts), "bfloat16", "cuda", limit_bytes=SPARK - comfy_bytes,
                     parts=parts, held_elsewhere={"ComfyUI's loaded models": comfy_bytes})
    return f"A beside ComfyUI's own models ({mp.human(comfy_bytes)}): {plan.summary()}"


def a_room(partition_bytes: int) -> str:
    """A's plan at the released size with its parts from Comfy-Org's files (the text encoder dequantised to bf16,
    the fp16 video VAE, the fp32 audio VAE) and what a Spark has left beside it for one pruned fp8 partition."""
    fake = {"model.layers.49.self_attn.q_proj.weight": formats.TensorInfo("model.layers.49.self_attn.q_proj.weight",
                                                                         (8192, 5120), "BF16", 0)}
    parts = {c: comfy_files.PartSource(c, pathlib.Path(f"<released {c}>"), fake if c == "text_encoder" else {},
                                       config_root=comfy_files.SHIPPED) for c in ("text_encoder", "vae", "audio_vae")}
    plan = mp.plan_a(formats.RELEASED_CONFIG_DIR, tuple(parts), "bfloat16", "cuda", limit_bytes=SPARK, parts=parts)
    room = plan.usable_bytes - plan.need_bytes
    return (f"A (released size, parts from files, bf16): {plan.terms()} = {mp.human(plan.need_bytes)}; "
            f"{mp.human(room)} left on a Spark, {'room' if room >= partition_bytes else 'no room'} for a DiT rank of "
            f"one pruned fp8 partition ({mp.human(partition_bytes)})")
