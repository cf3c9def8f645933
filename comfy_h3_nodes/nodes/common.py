"""What the node classes share: ComfyUI values to the engine's and back, and each node's timing report.

Lists: ComfyUI hands ``INPUT_IS_LIST`` nodes every input as a list (a direct call may pass one value); a batch is N
requests where every list input holds 1 or N items.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import socket
import threading
import time
from collections import OrderedDict
from typing import Callable

from ..engine import session
from ..engine.contract import request as rq
from ..engine.contract.timing import StageRecord
from ..engine.contract.wire import PREVIEW_MAX_SIDE, PreviewSpec
from ..host import host

log = logging.getLogger("comfy_h3.nodes")

CATEGORY = "MiniMax-H3"
MAX_BATCH = 64  # requests of one graph run


# ------------------------------------------------------------------------------------------------ errors
def plain_errors(cls):
    """Node class decorator: an error the node's function raises reaches the host as the host wants it (inside
    ComfyUI: a built-in exception type, so the user reads ``ValueError: <our sentence>`` rather than the pack's
    module path)."""
    fn = getattr(cls, cls.FUNCTION)

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run(self, *args, **kwargs):
            try:
                return await fn(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - re-raised, as the host shows errors
                raise host().user_error(exc) from exc
    else:
        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - re-raised, as the host shows errors
                raise host().user_error(exc) from exc

    setattr(cls, cls.FUNCTION, run)
    return cls


class InputMessage(str):
    """A ``VALIDATE_INPUTS`` message about one input. ComfyUI attaches a node's message to every input the method
    names (one error each, the same text), so a message about one of several named inputs says which it is about and
    that ComfyUI lists it under the others too; ``about`` and ``sentence`` (the message without that note) are for
    callers that can target the input themselves, such as the headless runner."""

    about: str | None
    sentence: str

    def __new__(cls, sentence: str, about: str | None, named: tuple[str, ...]):
        others = [n for n in named if n != about]
        text = sentence
        if about in named and others:
            text = (f"{sentence} (About {about} only: ComfyUI lists a node's own check under every input the check "
                    f"reads, so {' and '.join(others)} shows it too.)")
        obj = super().__new__(cls, text)
        obj.about, obj.sentence = about, sentence
        return obj


# ------------------------------------------------------------------------------------------------ lists
def items(value) -> list:
    return value if isinstance(value, list) else [value]


def one(value):
    """The single value of an input that a batch shares (encoders, dit, decode_on, unique_id)."""
    values = items(value)
    return values[0] if values else None


def at(value, i: int):
    values = items(value)
    return values[min(i, len(values) - 1)] if values else None


def batch_size(**inputs) -> int:
    """N of a batch: every list input has 1 or N items; anything else is an error naming the input."""
    sizes = {k: len(items(v)) for k, v in inputs.items() if v is not None}
    n = max(sizes.values(), default=1)
    bad = {k: m for k, m in sizes.items() if m not in (1, n)}
    if bad or n == 0:
        raise rq.RequestError(
            "the inputs of one batch must each hold 1 or the same number N of items; got "
            + ", ".join(f"{k}: {m}" for k, m in sizes.items()) + ". Give every list the same length."
        )
    if n > MAX_BATCH:
        raise rq.RequestError(f"a batch of {n} requests is over the {MAX_BATCH} limit; split it into several runs.")
    return n


def short(prompt, limit: int = 40) -> str:
    text = str(prompt or "").strip().replace("\n", " ")
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


# ------------------------------------------------------------------------------------------------ media
def image_list(images) -> list:
    """A ComfyUI IMAGE batch [B,H,W,C] -> list of [H,W,C] float arrays (validated by the engine)."""
    if images is None:
        return []
    arr = images.detach().cpu().numpy() if hasattr(images, "detach") else images
    if getattr(arr, "ndim", 0) == 3:
        return [arr]
    if getattr(arr, "ndim", 0) != 4:
        raise rq.RequestError(f"IMAGE has shape {tuple(getattr(arr, 'shape', ()))}; expected [batch, H, W, 3].")
    return [arr[i] for i in range(arr.shape[0])]


def audio_clip(audio) -> rq.AudioClip | None:
    """ComfyUI's AUDIO ``{"waveform": [1,C,L], "sample_rate"}`` -> the engine's clip, checked."""
    if audio is None:
        return None
    if not isinstance(audio, dict) or "waveform" not in audio or "sample_rate" not in audio:
        raise rq.RequestError("AUDIO must be ComfyUI's {'waveform': [B,C,L], 'sample_rate': int}.")
    wf = audio["waveform"]
    wf = wf.detach().cpu().float().numpy() if hasattr(wf, "detach") else wf
    if getattr(wf, "ndim", 0) == 3:
        if wf.shape[0] != 1:
            raise rq.RequestError(f"AUDIO reference holds a batch of {wf.shape[0]} clips; give one.")
        wf = wf[0]
    return rq.check_audio(rq.AudioClip(wf, int(audio["sample_rate"])), "AUDIO reference")


# ------------------------------------------------------------------------------------------------ records
def a_node() -> str:
    """How A's records name this machine: its host name, the same before and after Ray starts (its cluster address
    is shown by H3RemoteDiT and /h3/status)."""
    return socket.gethostname()


def reload_note(records: list) -> str:
    """The readout of A's reloads (load records of a side that had been released): ``A load text_encoder 0.12 s,
    vae 0.03 s (reloaded after ComfyUI freed memory)``; empty when nothing reloaded."""
    if not records:
        return ""
    causes = sorted({r.reason.split(" (file ")[0] for r in records})
    return ("A load " + ", ".join(f"{r.component} {r.seconds:.2f} s" for r in records)
            + f" ({'; '.join(causes)})")


def local_record(stage: str, t0: float, w0: float, request_id: str = "", **kw) -> StageRecord:
    return StageRecord(request_id, stage, "A", a_node(), w0, time.time(), compute_s=time.perf_counter() - t0, **kw)


def named_by_host(records: list[StageRecord], b_host: str) -> list[StageRecord]:
    """The executor's records name nodes by cluster address; the UI names both machines by host name."""
    return [dataclasses.replace(r, node=a_node() if r.machine == "A" else (b_host or r.node)) for r in records]


def b_host(executor) -> str:
    return ((executor.last_health or {}).get("B") or {}).get("hostname", "")


def _summary(records: list[StageRecord], compute_stage: str) -> dict:
    by = {}
    for r in records:  # the first of each stage: a DiT group's own denoise record is rank 0's
        by.setdefault(r.stage, r)
    # a DiT group's ranks run at once: its denoise took the group's wall time, not the sum of the ranks' times
    wall = ((by[compute_stage].info or {}).get("wall_s") if compute_stage in by else None)
    out = {"compute_s": wall if wall is not None else sum(r.compute_s for r in records if r.stage == compute_stage),
           "machine": by[compute_stage].machine if compute_stage in by else "A", "a_to_b": None, "b_to_a": None}
    for stage in ("a_to_b", "b_to_a"):
        r = by.get(stage)
        if r is not None:
            out[stage] = {"producer_wait_s": r.producer_wait_s, "fetch_s": r.fetch_s,
                          "materialize_s": r.materialize_s, "validate_s": r.validate_s,
                          "serialize_s": r.serialize_s, "bytes": r.total_bytes}
    if "denoise" in by:
        out["steps_done"] = len(by["denoise"].steps)
    return out


class LateReports:
    """The ``h3_timing`` payloads of batch nodes (``H3TextEncode``, ``H3RemoteDenoise``) that returned before their
    requests finished, by request id, until the node that waits for the batch (``H3Decode``) takes them into its
    ``ui``: ComfyUI copies a node's ``ui`` when the node returns, so nothing can be added to it later. Bounded."""

    LIMIT = 4096

    def __init__(self):
        self._by: OrderedDict[str, list[dict]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, request_id: str, ui: dict) -> None:
        with self._lock:
            self._by.setdefault(request_id, []).extend(ui.get("h3_timing", []))
            while len(self._by) > self.LIMIT:
                self._by.popitem(last=False)

    def take(self, request_ids) -> list[dict]:
        with self._lock:
            return [p for rid in dict.fromkeys(r for r in request_ids if r) for p in self._by.pop(rid, [])]


LATE = LateReports()
session.CACHE_SIZES["late_reports"] = lambda: len(LATE._by)


def report(node_type: str, unique_id, records: list[StageRecord], compute_stage: str, extra: dict | None = None,
           ui: dict | None = None) -> dict:
    """Send ``h3.timing``, keep the records for ``/h3/timings``, and return the ``ui`` dict of the node."""
    h = host()
    payload = {
        "prompt_id": h.prompt_id(),
        "node": None if unique_id is None else str(unique_id),
        "node_type": node_type,
        "request_id": next((r.request_id for r in records if r.request_id), None),
        "stages": [r.to_dict() for r in records],
        "summary": {**_summary(records, compute_stage), **(extra or {})},
    }
    session.TIMINGS.add(records)
    h.send_event("h3.timing", payload)
    out = dict(ui or {})
    out["h3_timing"] = [payload]
    return out


class StepEvents:
    """An ``on_step`` for B's step events: the node's progress bar (with B's preview when one came), and
    ``h3.progress`` to the UI. A progress hook that raises (ComfyUI's, once the user interrupted) calls
    ``on_cancel``."""

    def __init__(self, unique_id, bar=None, batch: Callable | None = None, on_cancel: Callable | None = None):
        self.unique_id, self.bar, self.batch, self.on_cancel = unique_id, bar, batch, on_cancel
        self.prompt_id = host().prompt_id()
        self.restarts: list[str] = []  # why the request started over (a DiT rank lost), in order

    def __call__(self, ev) -> None:  # runs on the executor's thread
        h = host()
        if getattr(ev, "restart", ""):  # a rank was lost: the request starts over, said on the node as it happens
            self.restart(ev)
            return
        if ev.preview is not None and ev.preview.latent is not None:  # B's latent frame: decoded here, on A
            ev = dataclasses.replace(ev, preview=decoded_preview(ev.preview))
        if self.bar is not None:
            try:
                self.bar.update(ev.index + 1, ev.total, ev.preview)
            except Exception as exc:  # noqa: BLE001 - ComfyUI's progress hook raises once the user interrupted
                log.info("progress update raised %s: cancelling request %s on B", type(exc).__name__, ev.request_id)
                if self.on_cancel is not None:
                    self.on_cancel()
        event = {"prompt_id": self.prompt_id, "node": str(self.unique_id), "request_id": ev.request_id,
                 "step": ev.index + 1, "total": ev.total, "seconds": ev.seconds}
        if self.batch is not None:
            event["batch"] = list(self.batch(ev.request_id))
        if ev.preview is not None:
            event["preview"] = {"step": ev.preview.step + 1, "width": ev.preview.width,
                                "height": ev.preview.height, "bytes": len(ev.preview.jpeg)}
        try:
            h.send_event("h3.progress", event)
        except Exception as exc:  # noqa: BLE001 - a UI that went away must not stop the denoise
            log.warning("could not send h3.progress: %s", exc)

    def restart(self, ev) -> None:
        """The request runs again from its first step (``ev.restart`` says why): the node's text, its bar back to
        0 and ``h3.progress`` with ``restart`` (the panel starts the count over)."""
        h = host()
        self.restarts.append(ev.restart)
        log.warning("request %s: %s", ev.request_id, ev.restart)
        h.progress_text(ev.restart, None if self.unique_id is None else str(self.unique_id))
        if self.bar is not None:
            try:
                self.bar.update(0, ev.total)
            except Exception as exc:  # noqa: BLE001 - ComfyUI's progress hook raises once the user interrupted
                log.info("progress update raised %s: cancelling request %s on B", type(exc).__name__, ev.request_id)
                if self.on_cancel is not None:
                    self.on_cancel()
        event = {"prompt_id": self.prompt_id, "node": str(self.unique_id), "request_id": ev.request_id, "step": 0,
                 "total": ev.total, "seconds": 0.0, "restart": ev.restart}
        if self.batch is not None:
            event["batch"] = list(self.batch(ev.request_id))
        try:
            h.send_event("h3.progress", event)
        except Exception as exc:  # noqa: BLE001 - a UI that went away must not stop the denoise
            log.warning("could not send h3.progress: %s", exc)


def decoded_preview(pv):
    """B's latent preview frame decoded on A by the host's preview decoder, as a JPEG preview; None (no preview this
    step, logged) when the decoder fails: a preview never stops a denoise."""
    decoder = host().preview_decoder()
    try:
        if decoder is None:
            raise RuntimeError("the host has no preview decoder any more")
        jpeg, width, height = decoder[0](pv.latent)
    except Exception as exc:  # noqa: BLE001 - logged; the denoise goes on without this preview
        log.warning("could not decode B's latent preview of request %s: %s", pv.request_id, exc)
        return None
    return dataclasses.replace(pv, jpeg=jpeg, width=width, height=height, latent=None)


def step_events(unique_id, bar=None, batch: Callable | None = None, on_cancel: Callable | None = None) -> StepEvents:
    return StepEvents(unique_id, bar, batch, on_cancel)


# ------------------------------------------------------------------------------------------------ previews
def fallback_note(method: str) -> str:
    """The readout's words when B previews with latent2rgb although ComfyUI's method asked for a decoder: what runs,
    what was asked, why, and (in the words) where the missing file goes."""
    return f"previews: latent2rgb ({method} asked, no taeh3.safetensors in ComfyUI's vae_approx)"


def preview_spec(latent_channels: int) -> tuple[PreviewSpec | None, str]:
    """How B previews a request, from the host's preview method (ComfyUI's setting) and its latent-to-RGB factors
    for H3: ``(spec or None, a sentence for the readout)``. ``none`` means none; factors for another number of latent
    channels than the model's are not used."""
    h = host()
    method = h.preview_method()
    if method in (None, "none"):
        return None, "previews off (ComfyUI's preview method is none)"
    got = h.preview_factors()
    if got is None:
        return None, "previews off: this ComfyUI has no latent-to-RGB factors for H3 latents"
    factors, bias, source = got
    if len(factors) != latent_channels:
        return None, (f"previews off: the {len(factors)}-channel factors of {source} do not fit this model's "
                      f"{latent_channels} latent channels")
    decoder = h.preview_decoder() if method == "taesd" else None
    if decoder is not None:
        kind, source = "latent", decoder[1]
        note = f"preview method taesd: B sends its latent frame, A decodes it with {source}"
    else:
        kind = "latent2rgb"
        note = "" if method in ("auto", "latent2rgb") else fallback_note(method)
    spec = PreviewSpec(kind, tuple(tuple(float(v) for v in row) for row in factors),
                       tuple(float(v) for v in bias), max_side=max(16, min(h.preview_size(), PREVIEW_MAX_SIDE)),
                       source=source)
    return spec, note
