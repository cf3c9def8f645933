"""The request path as nodes: ``H3TextEncode`` (A) -> ``H3RemoteDenoise`` (B) -> ``H3Decode`` (A, or split with B).

Each node hands the next one work in flight (the engine's conditioning and jobs, :mod:`..engine.executor`), so a
batch (list inputs) pipelines across A and B: A encodes k+1 while B denoises k and A decodes k-1. A single request is
a batch of one whose denoise node waits for its job, showing B's steps on its own progress bar.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

from ..engine import session
from ..engine.contract import request as rq
from ..engine.contract.configs import DECODE_ON
from ..engine.contract.errors import H3Cancelled, H3Error
from ..engine.contract.timing import StageRecord
from ..engine.contract.wire import VIDEO_LATENT_CHANNELS
from ..host import host
from .common import (CATEGORY, LATE, InputMessage, at, b_host, batch_size, items, named_by_host, one, preview_spec,
                     reload_note, report, short, step_events)
from .save import save_partial
from .values import dit_parts

#: what the A side needs resident to encode and to decode (the host registers and, if released, reloads them)
ENCODE_NEEDS = ("text_encoder", "vae", "audio_vae")
DECODE_NEEDS = ("vae", "audio_vae")


def _canvas_error(width: int, height: int) -> tuple[str | None, str] | None:
    """``(the input it is about or None, the sentence)`` for a canvas ComfyUI's widgets allow but H3 does not."""
    if width == 0 and height == 0:
        return None
    for zero, other in (("width", "height"), ("height", "width")):
        if {"width": width, "height": height}[zero] == 0:
            return zero, (f"{zero} 0 means an automatic canvas, which needs {other} 0 too: set {zero} to a multiple "
                          f"of {rq.CANVAS_MULTIPLE}, or {other} to 0 as well.")
    try:
        rq.check_canvas(height, width)
    except rq.RequestError as exc:
        return exc.about, str(exc)
    return None


class H3TextEncode:
    DESCRIPTION = ("Encodes the prompt (and keyframes or references) on A. The workflow follows from what is "
                   "connected: nothing = t2va, keyframes = fl2va, references = ref2va. width/height 0 = automatic. "
                   "A list of prompts (H3PromptList or any list output) is a batch: each is checked before any is "
                   "encoded, and they are encoded one after another while B already works on the first.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_CONDITIONING",)
    RETURN_NAMES = ("conditioning",)
    FUNCTION = "encode"
    INPUT_IS_LIST = True
    OUTPUT_IS_LIST = (True,)

    @classmethod
    def INPUT_TYPES(cls):
        lo, hi = rq.valid_frame_range()
        return {"required": {
            "encoders": ("H3_ENCODERS",),
            "prompt": ("STRING", {"multiline": True, "default": ""}),
            "width": ("INT", {"default": 832, "min": 0, "max": 4096, "step": 32}),
            "height": ("INT", {"default": 480, "min": 0, "max": 4096, "step": 32}),
            "num_frames": ("INT", {"default": 124, "min": lo, "max": hi,
                                   "tooltip": "at 24 fps; snapped up to 17n+5; 124..345 (5-15 s)"}),
        }, "optional": {"keyframes": ("H3_KEYFRAMES",), "references": ("H3_REFERENCES",)},
            "hidden": {"unique_id": "UNIQUE_ID"}}

    # The canvas check needs both sides, so it names both, and ComfyUI shows its message under both: a message about
    # one side says so (InputMessage). num_frames is ComfyUI's range check, and the prompt is checked when the node
    # runs (before anything is encoded), so no message lands on an input it is not about.
    @classmethod
    def VALIDATE_INPUTS(cls, width=None, height=None):
        width, height = one(width), one(height)  # lists (INPUT_IS_LIST); a linked input arrives as None
        if isinstance(width, int) and isinstance(height, int):
            problem = _canvas_error(width, height)
            if problem:
                return InputMessage(problem[1], problem[0], ("width", "height"))
        return True

    def encode(self, encoders, prompt, width, height, num_frames, keyframes=None, references=None, unique_id=None):
        from ..engine.executor.a_client import LocalA  # noqa: PLC0415 - Ray loads when a node runs, not at load

        encoders, unique_id = one(encoders), one(unique_id)
        n = batch_size(prompt=prompt, width=width, height=height, num_frames=num_frames, keyframes=keyframes,
                       references=references)
        reqs = [self._checked(i, n, at(prompt, i), at(width, i), at(height, i), at(num_frames, i),
                              at(keyframes, i), at(references, i)) for i in range(n)]  # all before any encodes

        reloaded = host().hold_a_side(encoders, ENCODE_NEEDS)  # ComfyUI may have unloaded them since the last run
        note = reload_note(reloaded)

        def reported(i):
            def done(payload, rec):
                extra = {"workflow": payload.workflow, "canvas": f"{payload.width}x{payload.height}",
                         "num_frames": payload.num_frames, **({"batch": [i + 1, n]} if n > 1 else {})}
                if note and i == 0:  # the first request's record carries the reload
                    rec = dataclasses.replace(rec, load_s=sum(r.seconds for r in reloaded),
                                              note="; ".join(x for x in (rec.note, note) if x))
                    extra["reloaded"] = note
                return report("H3TextEncode", unique_id, named_by_host([rec], ""), "encode", extra=extra)
            return done

        a = LocalA(encoders)
        if n == 1:  # one request: encoded before the node returns, its timing on this node's output
            cond = a.encode(reqs[0])
            return {"ui": reported(0)(*cond.payload.result()), "result": ([cond],)}
        conds = [a.encode(req, on_done=lambda p, r, i=i: LATE.add(p.request_id, reported(i)(p, r)))
                 for i, req in enumerate(reqs)]
        host().progress_text(f"{n} prompts: encoding one after another on A", unique_id)
        return {"ui": {}, "result": (conds,)}

    @staticmethod
    def _checked(i, n, prompt, width, height, num_frames, keyframes, references) -> rq.ValidEncode:
        req = rq.EncodeRequest(prompt=prompt, height=height or None, width=width or None, num_frames=num_frames)
        if keyframes is not None:
            req.first_image, req.last_image = keyframes.first, keyframes.last
        if references is not None:
            req.reference_images, req.reference_audio = list(references.images), references.audio
        try:
            rq.check_prompt(prompt)
            return rq.validate_encode(req)
        except rq.RequestError as exc:
            raise (rq.RequestError(f"request {i + 1} of {n} ({short(prompt)}): {exc}") if n > 1 else exc) from None


class H3RemoteDenoise:
    DESCRIPTION = ("Denoises on machine B: sends the conditioning A->B, follows B's steps on the progress bar, "
                   "brings the latents B->A. ComfyUI's interrupt stops B within one step. A batch (a list of "
                   "conditionings) is handed on at once as requests in flight: at most max_in_flight of them between "
                   "A and B at a time; H3Decode decodes each as it comes back while B works on the next.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_LATENTS",)
    RETURN_NAMES = ("latents",)
    FUNCTION = "denoise"
    INPUT_IS_LIST = True
    OUTPUT_IS_LIST = (True,)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "dit": ("H3_DIT",),
            "conditioning": ("H3_CONDITIONING",),
            "seed": ("INT", {"default": 0, "min": 0, "max": rq.MAX_SEED, "control_after_generate": True}),
            "steps": ("INT", {"default": 50, "min": 1, "max": rq.MAX_STEPS,
                              "tooltip": "sigma points; 50 for the base model (49 forwards)"}),
        }, "optional": {
            "max_in_flight": ("INT", {"default": 2, "min": 1, "max": 8, "tooltip": (
                "batches: requests between A and B at once. 2 keeps B busy (it receives the next while it denoises "
                "one) and A encoding/decoding beside it; more only holds more payloads in memory")}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def VALIDATE_INPUTS(cls, steps=None):  # seed: ComfyUI's own range check (0..2**64-1)
        try:
            for value in items(steps):  # a list (INPUT_IS_LIST); a linked input arrives as None
                if value is not None:
                    rq.check_steps(value)
        except rq.RequestError as exc:
            return str(exc)
        return True

    async def denoise(self, dit, conditioning, seed, steps, max_in_flight=2, unique_id=None):
        from ..engine.executor import Batch, BatchProgress, Slots  # noqa: PLC0415 - Ray loads when a node runs

        (ex, adapters), unique_id, conds = dit_parts(one(dit)), one(unique_id), items(conditioning)
        n = batch_size(conditioning=conds, seed=seed, steps=steps)
        params = [rq.validate_params(at(steps, i), at(seed, i), adapters) for i in range(n)]  # all before any runs
        # B's health where B is used: the loader's output may come from ComfyUI's cache, made before B restarted
        ex, b_note = await asyncio.to_thread(session.live, ex)
        if b_note:
            host().progress_text(b_note, unique_id)
        if n == 1 and conds[0].done():
            return await self._one(ex, conds[0], params[0], unique_id, b_note)
        batch = Batch([], BatchProgress(n, max(p.steps for p in params) - 1))
        index = {}
        slots = Slots(int(one(max_in_flight) or 2))
        preview = {"note": batch_preview_note(n, slots.n)}
        on_step = step_events(unique_id, batch=lambda rid: (index[rid] + 1, n))

        def stepped(ev):
            batch.on_step(ev)
            on_step(ev)
            if host().interrupted():  # the graph may be between nodes: stop every request of the batch here too
                batch.cancel()

        def done(job):  # the executor's thread: the request's latents are on A
            LATE.add(job.request_id, report(
                "H3RemoteDenoise", unique_id, named_by_host(job.records, b_host(ex)), "denoise",
                extra=schedule_extra(job.records, job.params.steps) | {"batch": [index[job.request_id] + 1, n],
                                                                       "preview": preview}))

        for i, (cond, p) in enumerate(zip(conds, params)):
            job = ex.submit_denoise(cond, p, stepped, slots, done)
            job.batch, index[job.request_id] = batch, i
            batch.jobs.append(job)
        host().progress_text(f"{n} requests in flight to B, at most {slots.n} at a time; {preview['note']}",
                             unique_id)
        return {"ui": {}, "result": (batch.jobs,)}

    async def _one(self, ex, cond, params, unique_id, b_note: str = ""):
        """One request: wait for its job here, B's steps on this node's bar; an interrupt stops B within a step."""
        h = host()
        bar = h.progress(unique_id, max(1, params.steps - 1), "B denoise")
        t0 = time.perf_counter()
        spec, preview_note = preview_spec(VIDEO_LATENT_CHANNELS)
        params = dataclasses.replace(params, preview=spec)
        job = None  # the progress hook below cancels it (ComfyUI's hook raises once the user interrupted)
        events = step_events(unique_id, bar, on_cancel=lambda: job.cancel())
        job = ex.submit_denoise(cond, params, events)
        job.batch = None
        try:
            await job.wait(should_cancel=h.interrupted)
        except H3Cancelled:
            if h.interrupted():
                raise h.interrupt_exception() from None
            raise
        finally:
            bar.close()
        held = session.a_rank_held(ex) if ex.bclient.parallel != "off" else None
        if held is not None:  # A's DiT rank shares A's memory: the host accounts for it (ComfyUI's /free releases it)
            h.hold_a_rank(*held)
        records = [dataclasses.replace(r, note="; ".join(x for x in (r.note, b_note) if x)) if b_note and
                   r.stage == "denoise" else r for r in named_by_host(job.records, b_host(ex))]
        extra = schedule_extra(records, params.steps) | {"total_s": time.perf_counter() - t0, "b_note": b_note,
                                                         "preview": preview_readout(records, preview_note, spec)}
        # the last live preview stays on the node as the frontend keeps it for ComfyUI's own samplers; also giving it
        # as the node's output image made the Vue nodes of frontend 1.58 show it twice (issue #30)
        ui = report("H3RemoteDenoise", unique_id, records, "denoise", extra=extra)
        return {"ui": ui, "result": ([job],)}


def batch_preview_note(n: int, in_flight: int) -> str:
    """Why a batch shows no previews (the readout and the node's text say it): its requests run on B after this node
    returned, several at a time, so no live preview belongs on the node; a single prompt gets them. With ComfyUI's
    previews off, that reason instead."""
    spec, note = preview_spec(VIDEO_LATENT_CHANNELS)
    if spec is None:
        return note
    return (f"no previews for a batch of {n}: its requests run on B after this node returned, up to {in_flight} at "
            "a time; a single prompt gets live previews")


def preview_readout(records: list[StageRecord], note: str, spec=None) -> dict:
    """What the previews were: B's count, cost and bytes (from its denoise record), or why there were none; with
    ``fallback`` (the node shows it beside the count) when B sent latent2rgb previews although ComfyUI's method asked
    for a decoder A does not have (the only case a latent2rgb spec comes with a note)."""
    den = next(r for r in records if r.stage == "denoise")
    made = (den.info or {}).get("preview") or {}
    out = {"note": note, **made}
    if spec is not None and spec.method == "latent2rgb" and note:
        out["fallback"] = note
    if made and den.steps:
        out["share_of_step"] = made["cost_s"] / max(made["count"], 1) / (sum(den.steps) / len(den.steps))
    return out


def schedule_extra(records: list[StageRecord], steps: int) -> dict:
    """What a denoise readout shows: forwards, the schedule B ran and where (partition, dtype, attention)."""
    den = next(r for r in records if r.stage == "denoise")
    ran = den.info
    where = ""
    if ran:  # the file B loaded the partition from, and what it really ran as (a quantised file's layers as stored)
        weights = (ran.get("weights") or {}).get(ran["partition"]) or {}
        source = f" from {os.path.basename(weights['file'])}" if weights.get("file") else ""
        where = f" on {ran['partition']}{source} ({weights.get('runs') or ran['dtype']}, {ran['attention_backend']})"
    return {"steps_total": len(den.steps), "schedule": f"{steps} sigma points{where}: {den.note}", "ran": ran}


class H3Decode:
    DESCRIPTION = ("Decodes B's latents into frames (IMAGE) and stereo sound (AUDIO), plus the frame rate: on A, or "
                   "split with B (B decodes the last clips from the latents it still holds, A the rest and blends; "
                   "the frames are identical).")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "AUDIO", "INT")
    RETURN_NAMES = ("images", "audio", "fps")
    FUNCTION = "decode"
    DECODE_ON = DECODE_ON
    INPUT_IS_LIST = True
    OUTPUT_IS_LIST = (True, True, True)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"encoders": ("H3_ENCODERS",), "latents": ("H3_LATENTS",)},
                "optional": {"decode_on": (list(DECODE_ON), {
                    "default": "auto",
                    "tooltip": "auto: split the video decode with B when B holds the video VAE, has no denoise "
                               "waiting and the decode is long enough; A: A alone; A+B: split whenever B can"})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def decode(self, encoders, latents, decode_on="auto", unique_id=None):
        from ..engine.executor import LocalA, decode_in_order  # noqa: PLC0415 - Ray loads when a node runs

        h = host()
        a, decode_on, unique_id, jobs = LocalA(one(encoders)), one(decode_on) or "auto", one(unique_id), items(latents)
        self._reloaded = reload_note(h.hold_a_side(one(encoders), DECODE_NEEDS))  # the first decode's readout says it
        batched = any(getattr(j, "batch", None) is not None for j in jobs)
        bar = h.progress(unique_id, 1, "H3 batch") if batched else None
        try:
            out = decode_in_order(jobs, lambda job: self._one(a, job, decode_on, unique_id), h.interrupted,
                                  bar.update if bar is not None else None)
        except H3Cancelled:
            raise h.interrupt_exception() from None
        finally:
            if bar is not None:
                bar.close()
        if out.failed:
            saved = save_partial([media for _, (media, _ui) in out.done])
            names = "; ".join(f"request {jobs.index(j) + 1} of {len(jobs)} ({j.request_id}): {why}"
                              for j, why in out.failed)
            raise H3Error(f"{len(out.failed)} of {len(jobs)} requests failed: {names}. The {len(out.done)} finished "
                          f"videos were saved: {', '.join(map(str, saved)) or 'none'}.")
        # a batch's encode and denoise nodes returned before their requests finished: their records join this
        # node's ui, each naming its node, so /history keeps every record of the run
        late = LATE.take([rid for j in jobs for rid in (getattr(j, "conditioning", None) and
                                                        j.conditioning.request_id, getattr(j, "request_id", None))])
        return {"ui": {"h3_timing": late + [t for _, (_m, ui) in out.done for t in ui["h3_timing"]]},
                "result": tuple([m[k] for _, (m, _ui) in out.done] for k in range(3))}

    def _one(self, a, job, decode_on, unique_id):
        import torch  # noqa: PLC0415 - ComfyUI's own torch; the pack's import needs none

        t0 = time.perf_counter()
        media, records, plan = job.decode(a, decode_on, should_cancel=host().interrupted)
        records = named_by_host(records, job.pipeline.b_hostname())
        note, self._reloaded = getattr(self, "_reloaded", ""), ""
        if note:
            records = [dataclasses.replace(r, note="; ".join(x for x in (r.note, note) if x))
                       if r.machine == "A" and r.stage == "decode" else r for r in records]
        images = torch.from_numpy(media.frames)
        audio = {"waveform": torch.from_numpy(media.audio).unsqueeze(0), "sample_rate": media.sample_rate}
        ui = report("H3Decode", unique_id, sorted(records, key=lambda r: r.machine != "B"), "decode",
                    extra={"frames": int(media.frames.shape[0]), "sample_rate": media.sample_rate,
                           "compute_s": time.perf_counter() - t0, "decode_on": plan.why,
                           **({"reloaded": note} if note else {})})
        return (images, audio, media.fps), ui
