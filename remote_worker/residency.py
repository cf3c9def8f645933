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

    def others(self) -> dict | None:
        """B's other workers now (``workers``: a dict, or a call that asks them), which every plan counts."""
        return self.workers() if callable(self.workers) else self.workers

    def plan_bytes(self) -> dict:
        """What another worker's plan counts of this one: its plan's resident bytes (with the split-decode VAE when
        that loaded) and working memory, released or not."""
        dec = self.decoder_plan
        plan = dec if dec is not None and dec.fits and (self.vae is not None or (self.released or {}).get("vae")) \
            else self.memory_plan
        return {"planned": int(plan.resident_bytes), "working": int(plan.working_bytes)}

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
                               self.memory_plan.canvas, self.memory_limit_bytes, machine=self.machine,
                               workers=self.others()).check()
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


def other_workers(namespace: str, bound_s: float = 5.0) -> dict:
    """B's other DiT workers of ``namespace`` on this worker's node (the Ray actor this runs in), for its memory plan:
    ``name -> {"planned", "working", "now", "released"}`` from each one's ``pool_status``, all asked at once and
    waited for at most ``bound_s``; one that does not answer in time (still loading) is not counted. ``{}`` outside
    an actor."""
    import ray  # noqa: PLC0415 - only inside B's worker process

    ctx = ray.get_runtime_context()
    me, ns = ctx.get_actor_name(), namespace
    if not me:
        return {}
    refs = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a.get("namespace") == ns and a["name"] != me:
            try:
                refs[a["name"]] = ray.get_actor(a["name"], namespace=ns).pool_status.remote()
            except (ValueError, AttributeError):  # gone since the listing, or not a DiT worker
                continue
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=bound_s) if refs else ([], [])
    out = {}
    for name, ref in refs.items():
        try:
            st = ray.get(ref, timeout=0) if ref in ready else None
        except Exception:  # noqa: BLE001 - a worker that failed to load holds nothing
            continue
        if st and st.get("node_id") == ctx.get_node_id() and st.get("plan"):
            out[name] = {**st["plan"], "now": int(sum((st.get("resident_bytes") or {}).values())),
                         "released": bool(st.get("released"))}
    return out

