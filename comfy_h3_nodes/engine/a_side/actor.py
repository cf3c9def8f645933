"""The resident A side (text encoder, VAEs) as a Ray actor pinned to the A node.

Concurrency groups: ``encode`` (one slot) and ``decode`` (one slot) run side by side, so A encodes request k+1 while
it waits for (or decodes) request k; ``control`` answers health checks and cancels at any time. ``decode_split``
decodes A's clips and blends in B's (:mod:`..model.split_decode`); a cancel stops it before its next clip. B's latents
arrive through the one hand-off receive (:mod:`..executor.handoff`).
"""

from __future__ import annotations

import logging
import time

import ray

from ..contract.request import EncodeRequest, ValidEncode
from ..executor.handoff import ShareReceiver, receive_payload
from ..process import ResidentActorMixin, base_health, setup_process
from .side import ASide

log = logging.getLogger("comfy_h3.A")

DEFAULT_NAME = "h3_encoders"


class EncoderActorImpl(ResidentActorMixin):
    def __init__(self, config: dict):
        setup_process(config.get("threads"))
        self.started = time.time()
        self.config = dict(config)
        self.side = self.make_side(self.config)
        self.node_ip = ray.util.get_node_ip_address()
        self._cancelled: set[str] = set()
        log.info("A ready on %s: %s", self.node_ip, self.side.resident())

    def make_side(self, config: dict) -> ASide:
        """The resident side this actor serves (a subclass may wrap it: the benchmarks give stages known costs)."""
        return ASide(config["model_dir"], dtype=config.get("dtype", "bfloat16"),
                     attention_backend=config.get("attention_backend", "sdpa"), device=config.get("device"))

    @ray.method(concurrency_group="encode", num_returns=2)
    def encode(self, request: EncodeRequest | ValidEncode):
        payload, rec = self.side.encode_recorded(request, self.node_ip)
        log.info("[%s] encoded %s (%d bytes) in %.3f s", payload.request_id, payload.workflow, payload.nbytes,
                 rec.compute_s)
        return payload, rec

    def _receive(self, refs: list, request_id: str, wait_timeout: float):
        return receive_payload(refs[0], wait_timeout, "A", "b_to_a", request_id, lambda p: p.validate(),
                               self.node_ip)

    @ray.method(concurrency_group="decode", num_returns=2)
    def decode(self, refs: list, request_id: str, wait_timeout: float = 600.0):
        """Receive B's latents (bounded), decode them; returns ``(DecodedMedia, [b_to_a, decode])``."""
        latents, b_to_a = self._receive(refs, request_id, wait_timeout)
        media, rec = self.side.decode_recorded(latents, self.node_ip, validated=True)
        return media, [b_to_a, rec]

    @ray.method(concurrency_group="decode", num_returns=2)
    def decode_split(self, refs: list, request_id: str, b_refs: list, b_start: int, wait_timeout: float = 600.0,
                     b_tile: int = 0):
        """Receive B's latents, decode clips ``[0, b_start)`` (and the tiles of clip ``b_start`` before ``b_tile``)
        and blend in B's share (``b_refs``: the returns of B's ``decode_share``, clips ``b_start``..); returns
        ``(DecodedMedia, [b_to_a, decode on A, decode on B?])``."""
        latents, b_to_a = self._receive(refs, request_id, wait_timeout)
        cancelled = lambda: request_id in self._cancelled  # noqa: E731
        share = ShareReceiver(b_refs, b_start, latents.height, latents.width, wait_timeout, request_id, cancelled,
                              first_tile=b_tile)
        try:
            media, recs = self.side.decode_split_recorded(latents, share, cancelled, self.node_ip, validated=True)
        finally:
            share.close()
            self._cancelled.discard(request_id)
        return media, [b_to_a, *recs]

    @ray.method(concurrency_group="control")
    def cancel(self, request_id: str) -> bool:
        """Stop a split decode of this request on A before its next clip."""
        self._cancelled.add(request_id)
        return True

    @ray.method(concurrency_group="control")
    def health(self) -> dict:
        info = base_health("A", self.side, self.started)
        info["video_vae"] = self.side.decoder_info()
        return info


CONCURRENCY_GROUPS = {"encode": 1, "decode": 1, "control": 2}
_CLASS = None


def encoder_actor_class(impl: type = EncoderActorImpl):
    """The Ray actor class of ``impl`` (A's actor, or a subclass of it), decorated once."""
    global _CLASS
    if impl is not EncoderActorImpl:
        return ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(impl)
    if _CLASS is None:
        _CLASS = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(EncoderActorImpl)
    return _CLASS
