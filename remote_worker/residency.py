"""B's weights released on request and loaded again: "Release B's model" (the H3 panel, ``POST /h3/release_b``,
``python -m remote_worker release``). The worker keeps its actor (name, node, settings, schedulers, plan); only the
transformer partitions, the split-decode VAE and the LoRA adapters on them go. The next denoise (or a DiT group's
join) loads what was resident, after checking the memory plan again, and says so in its record."""

from __future__ import annotations

import gc
import time

import torch

from comfy_h3_nodes.engine.model import memory_plan, split
from comfy_h3_nodes.engine.model.quant import tensor_nbytes


class Releasable:
    """Mixed into :class:`~.b_side.BSide` (its ``_lock``, ``_host``, ``sources``, ``resident_partitions``, ``vae``,
    ``_load_partition`` and ``_activate``)."""

    def release(self, cause: str = "a release") -> dict:
        """Drop the weights (every resident partition, the decoder, the adapters) and keep everything else: the
        sources, the schedulers, the plan. The next denoise reloads what was resident (``reload_if_released``).
        Waits for a running denoise. Returns what was released (partitions, bytes per part, cause, time)."""
        with self._lock:
            if self.released is not None:
                return {**self.released, "already": True}
            held = self.resident_bytes()
            if self.vae is not None:
                held["vae decoder"] = int(sum(tensor_nbytes(t) for t in (*self.vae.parameters(), *self.vae.buffers())))
            self.released = {"cause": cause, "at": time.time(), "partitions": list(self.resident_partitions),
                             "active": self.partition, "vae": self.vae is not None, "bytes": held,
                             "total_bytes": int(sum(held.values()))}
            for name in self.resident_partitions:
                setattr(self._host, name, None)
            self.resident_partitions = []
            if self.vae is not None:
                self._host.vae = None
                self.vae = None
            self._adapters.clear()
            self._pipes.clear()
            gc.collect()
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            return dict(self.released)

    def reload_if_released(self) -> float:
        """Load again what ``release`` dropped (after the memory plan says it still fits); the seconds it took, 0.0
        when nothing was released. Its load records' reason is ``reloaded after <cause>``."""
        with self._lock:
            rel = self.released
            if rel is None:
                return 0.0
            t0 = time.perf_counter()
            memory_plan.plan_b(self.sources, tuple(rel["partitions"]), self.precision, self.dtype, self.device,
                               self.memory_plan.canvas, self.memory_limit_bytes, machine=self.machine).check()
            reason = f"reloaded after {rel['cause']}"
            for name in rel["partitions"]:
                self._load_partition(name, reason)
            self.resident_partitions = list(rel["partitions"])
            self._activate(rel["active"])
            if rel["vae"]:
                loaded = split.load_checked(self.model_dir, ("vae",), self.dtype, self.device, reason=reason,
                                            host=self._host)
                self.load_records.extend(loaded.records)
                self.vae = self._host.vae
                self.vae.encoder, self.vae.quant_conv = None, None
            self.released = None
            self.reloads += 1
            return time.perf_counter() - t0

