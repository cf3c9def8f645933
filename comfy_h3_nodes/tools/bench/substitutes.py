"""Timed stand-ins for the benchmarks (and the tests that need a slow stage): the real A side and DiT, each stage
taking a known number of seconds more, so a pipeline's stages have known, balanced costs on a 2-core machine.

They substitute the sides from outside production code: subclasses of A's and B's actors whose ``make_side`` builds
a timed subclass of the real side, placed through the executor's :class:`~comfy_h3_nodes.engine.executor.ActorClasses`
(or, for the in-process A of the nodes, ``session.use_a_side``). The seconds reach the actors' processes in their
environment (``H3_BENCH_STAGE_S``, JSON), which only this module reads. Records count the stand-in seconds as
compute, and B's denoise note says how many were stand-in.
"""

from __future__ import annotations

import functools
import json
import os
import time

from remote_worker.actor import DiTActorImpl, build_side, start_dit
from remote_worker.b_side import BSide

from ...engine.a_side.actor import EncoderActorImpl, encoder_actor_class
from ...engine.a_side.side import ASide
from ...engine.executor import ActorClasses

ENV = "H3_BENCH_STAGE_S"
STAGES = ("encode", "denoise", "decode", "decode_share")


def env(stages: dict | None) -> dict:
    """The environment that gives the stand-in actors their seconds per stage."""
    bad = sorted(set(stages or {}) - set(STAGES))
    if bad:
        raise ValueError(f"stand-in stages {bad} are unknown; use {', '.join(STAGES)}.")
    return {ENV: json.dumps(stages)} if stages else {}


def _stages() -> dict:
    return {k: float(v) for k, v in json.loads(os.environ.get(ENV) or "{}").items()}


def _pause(stages: dict, stage: str) -> float:
    seconds = float(stages.get(stage, 0.0))
    if seconds > 0:
        time.sleep(seconds)
    return max(seconds, 0.0)


class TimedASide(ASide):
    """A's real side; ``encode`` and ``decode`` take ``stages[...]`` seconds more."""

    def __init__(self, *args, stages: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stages = dict(stages or {})

    def encode(self, request):
        payload = super().encode(request)
        _pause(self.stages, "encode")
        return payload

    def decode(self, latents, validated: bool = False):
        media = super().decode(latents, validated)
        _pause(self.stages, "decode")
        return media


class TimedBSide(BSide):
    """B's real DiT; ``denoise`` takes ``stages["denoise"]`` seconds more (counted as compute, said in the note), a
    decode share waits ``stages["decode_share"]`` first (long enough for a test to kill B during it)."""

    def __init__(self, *args, stages: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stages = dict(stages or {})

    def denoise(self, payload, call, **kwargs):
        result = super().denoise(payload, call, **kwargs)
        extra = _pause(self.stages, "denoise")
        if extra:
            result.compute_s += extra
            result.notes.append(f"stand-in +{extra:.3f} s (benchmark)")
        return result

    def decode_share(self, latents, start, stop, should_cancel=None, first_tile: int = 0):
        _pause(self.stages, "decode_share")
        return super().decode_share(latents, start, stop, should_cancel, first_tile)


class TimedEncoderActor(EncoderActorImpl):
    def make_side(self, config: dict) -> ASide:
        return TimedASide(config["model_dir"], dtype=config.get("dtype", "bfloat16"),
                          attention_backend=config.get("attention_backend", "sdpa"), device=config.get("device"),
                          stages=_stages())


class TimedDiTActor(DiTActorImpl):
    def make_side(self, config: dict) -> BSide:
        return build_side(config, TimedBSide, stages=_stages())


def actors(stages: dict | None = None) -> ActorClasses:
    """A's and B's timed actors (their seconds come from the environment the executor passes: :func:`env`)."""
    env(stages)  # checks the stage names
    return ActorClasses(dit=functools.partial(start_dit, impl=TimedDiTActor),
                        encoder=functools.partial(encoder_actor_class, TimedEncoderActor))


def a_side_factory(stages: dict):
    """For ``session.use_a_side``: the nodes' in-process A side, timed."""
    def make(model_path, dtype, attention_backend, device):
        return TimedASide(model_path, dtype=dtype, attention_backend=attention_backend, device=device,
                          stages=stages)

    return make


class NullForwardSide:
    """B's side for ``bench remote-model``: no model; :meth:`forward_rows` echoes the call's target rows (the shapes
    and dtype B's output has) at once, so a forward's round trip is only the hand-offs, B's checks and Ray. It
    counts the forwards it ran (:meth:`NullForwardDiTActor.stand_in_forwards`)."""

    device, dtype, attention_backend = "cpu", "float32", "none"

    def __init__(self, model_dir: str, text_dim: int = 5120):
        self.model_dir = model_dir
        self.text_dim = text_dim  # the released model's: the context is checked against it as B checks it
        self.load_records: list = []
        self.forwards = 0

    def resident(self) -> dict:
        return {"transformer": "stand-in (no model: echoes the target rows)"}

    def forward_rows(self, ctx: dict, call, should_cancel=None, request_id: str = "", lora=(None, None)) -> tuple:
        """B's ``forward_rows`` (:class:`remote_worker.comfy_forward.ComfySamplerForwards`) with nothing computed."""
        t0 = time.perf_counter()
        video, audio = call.video.to_torch(), call.audio.to_torch()
        self.forwards += 1
        return video, audio, time.perf_counter() - t0, 0.0, 0


class NullForwardDiTActor(DiTActorImpl):
    """The real DiT actor (its ``forward``: context fetched once and kept by object id, both checks, the result)
    around :class:`NullForwardSide`."""

    def make_side(self, config: dict) -> NullForwardSide:
        return NullForwardSide(config["model_dir"], int(config.get("text_dim", 5120)))

    def stand_in_forwards(self) -> int:
        return self.side.forwards
