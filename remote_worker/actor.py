"""The resident DiT as a named, detached Ray actor on the B node.

Two concurrency groups: ``denoise`` (one slot: B serves one request at a time, in submission order) and ``control``
(health, progress, cancel, load records), so a running denoise never blocks a health check or a cancel.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import ray

from comfy_h3_nodes.engine import actor_common as common
from comfy_h3_nodes.engine.timing import StageRecord

log = logging.getLogger("comfy_h3.B")

DEFAULT_NAME = "h3_dit"


class DiTActorImpl(common.ResidentActorMixin):
    def __init__(self, config: dict):
        common.setup_process(config.get("threads"))
        from remote_worker import model_roots
        from remote_worker.b_side import BSide

        model_roots.enforce(config)  # refuse a model path outside B's model roots before reading anything

        self.started = time.time()
        self.config = dict(config)
        self.side = BSide(config["model_dir"], partition=config.get("partition", "transformer"),
                          dtype=config.get("dtype", "bfloat16"),
                          attention_backend=config.get("attention_backend", "sdpa"),
                          device=config.get("device"), allow_swap=config.get("allow_swap", True),
                          path_check=lambda p: model_roots.enforce({"model_dir": str(p),
                                                                    "model_roots": config.get("model_roots")}))
        self._lock = threading.Lock()
        self._progress: dict[str, dict] = {}
        self._cancelled: set[str] = set()
        self.recent: deque = deque(maxlen=50)
        self.node_ip = ray.util.get_node_ip_address()
        log.info("B ready on %s: %s", self.node_ip, self.side.resident())

    # ------------------------------------------------------------------------------------------------ denoise
    @ray.method(concurrency_group="denoise", num_returns=2)
    def denoise(self, refs: list, request_id: str, wait_timeout: float = 600.0):
        """Receive A's payload (bounded), denoise it, return ``(DenoisedLatents, [a_to_b, denoise])``."""
        from remote_worker.b_side import DenoiseCancelled

        progress = {"state": "waiting", "steps": [], "total": 0, "error": None}
        with self._lock:
            self._progress[request_id] = progress
        t_start = time.time()
        try:
            if request_id in self._cancelled:
                raise DenoiseCancelled(f"request {request_id} was cancelled before B started it")
            payload, wait_s, fetch_s = common.receive(refs[0], wait_timeout, "B", "A->B", request_id)
            if payload.request_id != request_id:
                raise common.HandoffError(
                    f"B received the payload of request {payload.request_id} for request {request_id}")
            t_v = time.perf_counter()
            payload.validate(text_dim=self.side.text_dim)
            validate_s = time.perf_counter() - t_v
            mat_s = common.materialize(payload)
            t_recv = time.time()
            a_to_b = StageRecord(request_id, "a_to_b", "B", self.node_ip, t_start, t_recv, producer_wait_s=wait_s,
                                 fetch_s=fetch_s, materialize_s=mat_s, validate_s=validate_s,
                                 bytes=payload.field_bytes())
            progress["state"] = "running"
            progress["total"] = payload.num_inference_steps

            def on_step(rec):
                progress["steps"].append((rec.index, rec.total, rec.seconds))

            result = self.side.denoise(payload, on_step=on_step, validated=True,
                                       should_cancel=lambda: request_id in self._cancelled)
            synthetic = common.synthetic_delay(self.config, "denoise")
            notes = [result.schedule_note(payload.adapters)]
            notes += [f"synthetic +{synthetic:.3f} s"] if synthetic else []
            den = StageRecord(request_id, "denoise", "B", self.node_ip, t_recv, time.time(),
                              compute_s=result.compute_s + synthetic, bytes=result.latents.field_bytes(),
                              steps=tuple(s.seconds for s in result.steps), load_s=result.swap_s + result.adapter_s,
                              note="; ".join(notes))
            progress["state"] = "done"
            self.recent.append({"request_id": request_id, "workflow": payload.workflow, "steps": len(result.steps),
                                "compute_s": round(result.compute_s, 4), "finished": time.time()})
            log.info("[%s] denoised %d steps in %.3f s", request_id, len(result.steps), result.compute_s)
            return result.latents, [a_to_b, den]
        except DenoiseCancelled as exc:
            progress["state"] = "cancelled"
            progress["error"] = str(exc)
            log.info("[%s] cancelled", request_id)
            raise
        except Exception as exc:
            progress["state"] = "failed"
            progress["error"] = f"{type(exc).__name__}: {exc}"
            log.warning("[%s] failed: %s", request_id, exc)
            raise
        finally:
            with self._lock:
                self._cancelled.discard(request_id)
                # keep only the most recent progress entries
                while len(self._progress) > 64:
                    self._progress.pop(next(iter(self._progress)))

    # ------------------------------------------------------------------------------------------------ control
    @ray.method(concurrency_group="control")
    def progress(self, request_id: str) -> dict:
        p = self._progress.get(request_id)
        if p is None:
            return {"state": "queued", "steps": [], "total": 0, "error": None}
        return {"state": p["state"], "steps": list(p["steps"]), "total": p["total"], "error": p["error"],
                "cancel_at_step": p.get("cancel_at_step")}

    @ray.method(concurrency_group="control")
    def cancel(self, request_id: str) -> bool:
        """Flag a request; B stops it before its next step (or refuses it if it has not started)."""
        with self._lock:
            p = self._progress.get(request_id)
            if p is not None and p["state"] in ("done", "failed", "cancelled"):
                return False
            if p is not None and "cancel_at_step" not in p:
                p["cancel_at_step"] = len(p["steps"])
            self._cancelled.add(request_id)
        return True

    @ray.method(concurrency_group="control")
    def health(self) -> dict:
        info = common.base_health("B", self.side, self.started)
        info["partition"] = self.side.partition
        info["text_dim"] = self.side.text_dim
        info["recent"] = list(self.recent)[-10:]
        info["busy"] = any(p["state"] in ("waiting", "running") for p in list(self._progress.values()))
        return info



_CLASS = None


def dit_actor_class():
    """The Ray actor class (decorated once, on first use)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = ray.remote(concurrency_groups={"denoise": 1, "control": 4})(DiTActorImpl)
    return _CLASS
