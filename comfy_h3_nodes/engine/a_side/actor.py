"""The resident A side (text encoder, VAEs) as a Ray actor pinned to the A node.

Concurrency groups: ``encode`` (one slot) and ``decode`` (one slot) run side by side, so A encodes request k+1 while
it waits for (or decodes) request k; ``control`` answers health checks and cancels at any time. ``decode_split``
decodes A's clips and blends in B's (:mod:`.split_decode`); a cancel stops it before its next clip.
"""

from __future__ import annotations

import logging
import time

import ray

from .. import process as common
from ..contract.request import H3Request
from ..contract.timing import StageRecord

log = logging.getLogger("comfy_h3.A")

DEFAULT_NAME = "h3_encoders"


class EncoderActorImpl(common.ResidentActorMixin):
    def __init__(self, config: dict):
        common.setup_process(config.get("threads"))
        from .side import ASide

        self.started = time.time()
        self.config = dict(config)
        self.side = ASide(config["model_dir"], dtype=config.get("dtype", "bfloat16"),
                          attention_backend=config.get("attention_backend", "sdpa"), device=config.get("device"))
        self.node_ip = ray.util.get_node_ip_address()
        self._cancelled: set[str] = set()
        log.info("A ready on %s: %s", self.node_ip, self.side.resident())

    @ray.method(concurrency_group="encode", num_returns=2)
    def encode(self, request: H3Request):
        t0, w0 = time.perf_counter(), time.time()
        payload = self.side.encode(request)
        synthetic = common.synthetic_delay(self.config, "encode")
        rec = StageRecord(payload.request_id, "encode", "A", self.node_ip, w0, time.time(),
                          compute_s=time.perf_counter() - t0, bytes=payload.field_bytes(),
                          note=f"synthetic +{synthetic:.3f} s" if synthetic else "",
                          info={"height": payload.height, "width": payload.width, "num_frames": payload.num_frames})
        log.info("[%s] encoded %s (%d bytes) in %.3f s", payload.request_id, payload.workflow, payload.nbytes,
                 rec.compute_s)
        return payload, rec

    def _receive_latents(self, refs: list, request_id: str, wait_timeout: float):
        """B's latents on A: bounded wait and fetch, validated once, materialised; with their ``b_to_a`` record."""
        w0 = time.time()
        latents, wait_s, fetch_s = common.receive(refs[0], wait_timeout, "A", "B->A", request_id)
        t_v = time.perf_counter()
        latents.validate()
        validate_s = time.perf_counter() - t_v
        mat_s = common.materialize(latents)
        return latents, StageRecord(request_id, "b_to_a", "A", self.node_ip, w0, time.time(), producer_wait_s=wait_s,
                                    fetch_s=fetch_s, materialize_s=mat_s, validate_s=validate_s,
                                    bytes=latents.field_bytes())

    @ray.method(concurrency_group="decode", num_returns=2)
    def decode(self, refs: list, request_id: str, wait_timeout: float = 600.0):
        """Receive B's latents (bounded), decode them; returns ``(DecodedMedia, [b_to_a, decode])``."""
        latents, b_to_a = self._receive_latents(refs, request_id, wait_timeout)
        w1 = b_to_a.end
        t0 = time.perf_counter()
        media = self.side.decode(latents, validated=True)
        synthetic = common.synthetic_delay(self.config, "decode")
        dec = StageRecord(request_id, "decode", "A", self.node_ip, w1, time.time(),
                          compute_s=time.perf_counter() - t0,
                          bytes={"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes)},
                          note=f"synthetic +{synthetic:.3f} s" if synthetic else "")
        return media, [b_to_a, dec]

    @ray.method(concurrency_group="decode", num_returns=2)
    def decode_split(self, refs: list, request_id: str, b_refs: list, b_start: int, wait_timeout: float = 600.0):
        """Receive B's latents, decode clips ``[0, b_start)`` and blend in B's share (``b_refs``: the returns of B's
        ``decode_share``, clips ``b_start``..); returns ``(DecodedMedia, [b_to_a, decode on A, decode on B?])``."""
        latents, b_to_a = self._receive_latents(refs, request_id, wait_timeout)
        w1 = b_to_a.end
        cancelled = lambda: request_id in self._cancelled  # noqa: E731
        share = common.ShareReceiver(b_refs, b_start, latents.height, latents.width, wait_timeout, request_id,
                                     cancelled)
        try:
            media, served = self.side.decode_split(latents, share, cancelled, validated=True)
        finally:
            self._cancelled.discard(request_id)
        recs = split_decode_records(request_id, self.node_ip, w1, media, served, share)
        return media, [b_to_a, *recs]

    @ray.method(concurrency_group="control")
    def cancel(self, request_id: str) -> bool:
        """Stop a split decode of this request on A before its next clip."""
        self._cancelled.add(request_id)
        return True

    @ray.method(concurrency_group="control")
    def health(self) -> dict:
        info = common.base_health("A", self.side, self.started)
        info["video_vae"] = self.side.decoder_info()
        return info



def split_decode_records(request_id: str, node_ip: str, start: float, media, served, share) -> list[StageRecord]:
    """A's decode record of a split decode (its clips, the blend, B's frames' wait/fetch/materialisation), then B's
    own record when B's share arrived. The note says what ran where, and when A decoded B's clips itself."""
    n, b0 = served.clips, share.start
    a_clips = [i for i in served.decoded if i < b0]
    took_over = [i for i in served.decoded if i >= b0]
    span = (lambda c: f"{c[0]}-{c[-1]}" if len(c) > 1 else f"{c[0]}" if c else "none")  # noqa: E731
    note = f"split decode: A clips {span(a_clips)}, B clips {span(list(range(b0, n)))} of {n}"
    if took_over:
        note += f"; B's share was lost ({share.failure}): A decoded B's clips {span(took_over)} itself"
    compute = media.timings["decode_s"] - share.producer_wait_s - share.fetch_s - share.materialize_s
    a_rec = StageRecord(request_id, "decode", "A", node_ip, start, time.time(), producer_wait_s=share.producer_wait_s,
                        fetch_s=share.fetch_s, materialize_s=share.materialize_s, compute_s=max(compute, 0.0),
                        bytes={"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes),
                               "b_frames": int(share.bytes)},
                        note=note,
                        info={"decode_on": "A+B", "clips": n, "a_clips": [0, b0], "b_clips": [b0, n],
                              "a_decoded": list(served.decoded), "b_received": list(share.received),
                              "a_clip_s": [round(x, 5) for x in served.decoded_s], "b_lost": share.failure})
    return [a_rec] + ([share.record] if share.record is not None else [])


_CLASS = None


def encoder_actor_class():
    global _CLASS
    if _CLASS is None:
        _CLASS = ray.remote(concurrency_groups={"encode": 1, "decode": 1, "control": 2})(EncoderActorImpl)
    return _CLASS
