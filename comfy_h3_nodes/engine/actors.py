"""The resident A side (text encoder, VAEs) as a Ray actor pinned to the A node.

Concurrency groups: ``encode`` (one slot) and ``decode`` (one slot) run side by side, so A encodes request k+1 while
it waits for (or decodes) request k; ``control`` answers health checks at any time.
"""

from __future__ import annotations

import logging
import time

import ray

from . import actor_common as common
from .request import H3Request
from .timing import StageRecord

log = logging.getLogger("comfy_h3.A")

DEFAULT_NAME = "h3_encoders"


class EncoderActorImpl(common.ResidentActorMixin):
    def __init__(self, config: dict):
        common.setup_process(config.get("threads"))
        from .a_side import ASide

        self.started = time.time()
        self.config = dict(config)
        self.side = ASide(config["model_dir"], dtype=config.get("dtype", "bfloat16"),
                          attention_backend=config.get("attention_backend", "sdpa"), device=config.get("device"))
        self.node_ip = ray.util.get_node_ip_address()
        log.info("A ready on %s: %s", self.node_ip, self.side.resident())

    @ray.method(concurrency_group="encode", num_returns=2)
    def encode(self, request: H3Request):
        t0, w0 = time.perf_counter(), time.time()
        payload = self.side.encode(request)
        synthetic = common.synthetic_delay(self.config, "encode")
        rec = StageRecord(payload.request_id, "encode", "A", self.node_ip, w0, time.time(),
                          compute_s=time.perf_counter() - t0, bytes=payload.field_bytes(),
                          note=f"synthetic +{synthetic:.3f} s" if synthetic else "")
        log.info("[%s] encoded %s (%d bytes) in %.3f s", payload.request_id, payload.workflow, payload.nbytes,
                 rec.compute_s)
        return payload, rec

    @ray.method(concurrency_group="decode", num_returns=2)
    def decode(self, refs: list, request_id: str, wait_timeout: float = 600.0):
        """Receive B's latents (bounded), decode them; returns ``(DecodedMedia, [b_to_a, decode])``."""
        w0 = time.time()
        latents, wait_s, fetch_s = common.receive(refs[0], wait_timeout, "A", "B->A", request_id)
        t_v = time.perf_counter()
        latents.validate()
        validate_s = time.perf_counter() - t_v
        mat_s = common.materialize(latents)
        w1 = time.time()
        b_to_a = StageRecord(request_id, "b_to_a", "A", self.node_ip, w0, w1, producer_wait_s=wait_s, fetch_s=fetch_s,
                             materialize_s=mat_s, validate_s=validate_s, bytes=latents.field_bytes())
        t0 = time.perf_counter()
        media = self.side.decode(latents, validated=True)
        synthetic = common.synthetic_delay(self.config, "decode")
        dec = StageRecord(request_id, "decode", "A", self.node_ip, w1, time.time(),
                          compute_s=time.perf_counter() - t0,
                          bytes={"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes)},
                          note=f"synthetic +{synthetic:.3f} s" if synthetic else "")
        return media, [b_to_a, dec]

    @ray.method(concurrency_group="control")
    def health(self) -> dict:
        return common.base_health("A", self.side, self.started)



_CLASS = None


def encoder_actor_class():
    global _CLASS
    if _CLASS is None:
        _CLASS = ray.remote(concurrency_groups={"encode": 1, "decode": 1, "control": 2})(EncoderActorImpl)
    return _CLASS
