"""The resident DiT as a named, detached Ray actor on the B node.

Two concurrency groups: ``denoise`` (one slot: B serves one request at a time, in submission order; ``reconfigure``
and a split decode's ``decode_share`` queue there too, so B never computes two things at once and never changes the
model under a running request) and ``control`` (health, progress, cancel,
load records, the model list), so a running denoise never blocks a health check or a cancel.

The model a config names may be ``tiny-random``: B builds the pack's tiny random checkpoint in its own cache on first
use. Everything else must lie inside B's model roots (:mod:`remote_worker.model_roots`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from comfy_h3_nodes.cluster.ray_cluster import ACTOR_CPUS, ROLE_A, ROLE_B
from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.contract.forward_payloads import ForwardCall, ForwardResult
from comfy_h3_nodes.engine.contract.configs import NAMESPACE
from comfy_h3_nodes.engine.contract.errors import DenoiseCancelled, ModelFolderError
from comfy_h3_nodes.engine.contract.timing import StageRecord
from comfy_h3_nodes.engine.executor.handoff import receive, receive_payload
from comfy_h3_nodes.engine.model import catalog, formats, parallel, split_decode
from comfy_h3_nodes.engine.model.backends import resolve_attention_backend
from comfy_h3_nodes.engine.process import (ResidentActorMixin, base_health, memory_info, runtime_env,
                                           setup_process)

from . import model_roots, residency
from .b_side import BSide

log = logging.getLogger("comfy_h3.B")

DEFAULT_NAME = "h3_dit"

#: the settings of a running B that a client may ask to change (``reconfigure``); each one is a reload
RECONFIGURABLE = ("model_dir", "partition", "dtype", "attention_backend", "precision")


def build_side(config: dict, side_class: type = BSide, **extra) -> BSide:
    """Load B as ``config`` says (with ``side_class``, a stand-in of the benchmarks, and its ``extra`` arguments); a
    model path outside B's model roots is refused before anything is read."""
    model, sources = config["model_dir"], dict(config.get("sources") or {})
    if catalog.is_tiny(model):
        model_dir = catalog.resolve(model, announce=log.info)  # the pack's own, built in B's cache
    else:
        model_dir = model_roots.enforce(config)
        if model_dir.is_file():  # one transformer file (single-file or GGUF) for the node's partition: the
            sources.setdefault(config.get("partition", "transformer"), str(model_dir))  # schedulers and index
            model_dir = formats.RELEASED_CONFIG_DIR  # come from the release's configs shipped with the pack

    def path_check(p):
        if catalog.is_tiny(str(p)):
            return catalog.tiny_lora_path(announce=log.info)
        return model_roots.enforce({"model_dir": str(p), "model_roots": config.get("model_roots"),
                                    "search_roots": config.get("search_roots")})  # names as for the model

    return side_class(model_dir, partition=config.get("partition", "transformer"), dtype=config.get("dtype", "bfloat16"),
                 attention_backend=config.get("attention_backend", "sdpa"), device=config.get("device"),
                 allow_swap=config.get("allow_swap", True), path_check=path_check,
                 precision=config.get("precision") or "auto", residency=config.get("residency") or "auto",
                 sources=sources, memory_limit_bytes=config.get("memory_limit_bytes"),
                 decoder=config.get("decoder") or "auto", machine=config.get("role") or "B",
                 vsa_kernel=config.get("vsa_kernel"), workers=lambda: residency.other_workers(config.get("namespace") or NAMESPACE), **extra)


class DiTActorImpl(ResidentActorMixin):
    earlier_loads = reconfigures = 0  # the load count is this worker's: models it loaded before a reconfigure count

    def __init__(self, config: dict):
        setup_process(config.get("threads"))
        self.started = time.time()
        self.config = dict(config)
        # a name as B's picker lists it (relative to a model root) is served, and reported, as the path it names
        self.config["model_dir"] = model_roots.resolve_model(self.config)
        self.side = self.make_side(self.config)
        self._lock = threading.Lock()
        self._progress: dict[str, dict] = {}
        self._changed = threading.Condition()  # notified when a request's progress gains a step or ends
        self._cancelled: set[str] = set()
        self._decoding: set[str] = set()  # requests whose decode share runs now
        self._queue: dict[str, dict] = {}  # pool: announced denoises (enqueue), in arrival order, until they end
        self._step_s: deque = deque(maxlen=32)  # seconds of the last steps (the pool's wait estimate)
        self.recent: deque = deque(maxlen=50)
        #: sampling contexts of ComfyUI's samplers (``forward``), by the id of the object A put them in
        self._contexts: OrderedDict = OrderedDict()
        self._lora_sets: OrderedDict = OrderedDict()  # ComfyUI's LoRA patch sets, by the id of their object
        self.forwards = 0  # forwards served to ComfyUI's samplers
        self.denoises = 0  # denoises served to the pack's H3RemoteDenoise
        self.interrupts: deque = deque(maxlen=8)  # the forwards a sampler's interrupt stopped, and where
        self.node_ip = ray.util.get_node_ip_address()
        self.machine = config.get("role") or "B"  # a DiT rank on A's machine (parallel denoise) says "A"
        log.info("DiT ready on %s (%s): %s", self.node_ip, self.machine, self.side.resident())

    def make_side(self, config: dict) -> BSide:
        """The resident DiT this actor serves, as ``config`` says (a subclass may wrap it: the benchmarks give the
        denoise a known cost)."""
        return build_side(config)

    # ------------------------------------------------------------------------------------------------ denoise
    @ray.method(concurrency_group="denoise", num_returns=2)
    def denoise(self, refs: list, call: wire.DenoiseCall, wait_timeout: float = 600.0):
        """Receive A's payload (bounded), denoise it as ``call`` says (seed, steps, adapters), return
        ``(DenoisedLatents, [a_to_b, denoise])``."""
        call.validate()
        request_id = call.request_id
        progress = {"state": "waiting", "steps": [], "total": 0, "error": None}
        with self._lock:
            self._progress[request_id] = progress
            entry = self._queue.setdefault(request_id, {"request_id": request_id, "steps": 0, "client": None,
                                                        "since": time.time()})
            entry["state"] = "running"
        try:
            if request_id in self._cancelled:
                raise DenoiseCancelled(f"request {request_id} was cancelled before B started it")
            payload, a_to_b = receive_payload(
                refs[0], wait_timeout, self.machine, "a_to_b", request_id,
                lambda p: (call.validate(p), p.validate(text_dim=self.side.text_dim)), self.node_ip)
            t_recv = a_to_b.end
            progress["state"] = "running"
            progress["total"] = call.num_inference_steps
            entry["steps"] = entry["steps"] or call.num_inference_steps

            def on_step(rec):
                if rec.preview is not None:  # the latest preview, before its step shows, so A gets them together
                    progress["preview"] = rec.preview
                progress["steps"].append((rec.index, rec.total, rec.seconds))
                self._step_s.append(rec.seconds)
                self._notify()

            result = self.side.denoise(payload, call, on_step=on_step, validated=True,
                                       should_cancel=lambda: request_id in self._cancelled,
                                       ready_timeout=wait_timeout)
            info = self._serving(result.swap_s)
            if result.parallel:  # one rank of a DiT group: its share of the time in collectives
                info.update(result.parallel, comm_s=round(result.comm_s, 5), machine=self.machine)
            if result.preview:  # what the live previews cost B
                info["preview"] = result.preview
            if result.reload_s:  # the model was released on request: this request reloaded it
                info["reloaded_after_release_s"] = round(result.reload_s, 4)
            den = StageRecord(request_id, "denoise", self.machine, self.node_ip, t_recv, time.time(),
                              compute_s=result.compute_s, bytes=result.latents.field_bytes(),
                              steps=tuple(s.seconds for s in result.steps),
                              load_s=result.swap_s + result.adapter_s + result.reload_s,
                              note=result.schedule_note(call.adapters), info=info)
            progress["state"] = "done"
            self.denoises += 1
            self.recent.append({"request_id": request_id, "workflow": payload.workflow, "steps": len(result.steps),
                                "compute_s": round(result.compute_s, 4), "finished": time.time(),
                                "client": entry.get("client")})
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
            self._notify()  # a watcher waiting for the next step learns the request ended
            with self._lock:
                self._queue.pop(request_id, None)
                self._cancelled.discard(request_id)
                # keep only the most recent progress entries
                while len(self._progress) > 64:
                    self._progress.pop(next(iter(self._progress)))

    # ------------------------------------------------------------------------------------------------ one forward
    @ray.method(concurrency_group="denoise")
    def forward(self, refs: list, call: ForwardCall, wait_timeout: float = 60.0):
        """One forward of a ComfyUI sampler on A (the remote ``MODEL``): ``refs[0]`` is the sampling's
        :class:`ForwardContext`, fetched once per sampling (bounded) and kept by its object id. Returns
        ``(ForwardResult, info)``: ``info`` has B's clock at arrival and end, the compute seconds and, on the first
        forward of a context, what fetching it took."""
        arrived = time.time()
        key = refs[0].hex()
        info = {"arrived": arrived, "node_ip": self.node_ip}
        entry = self._contexts.get(key)
        if entry is None:
            ctx, wait_s, fetch_s = receive(refs[0], wait_timeout, self.machine, "sampling context", call.sampling_id)
            ctx.validate(text_dim=self.side.text_dim)
            device = self.side.device  # on B's device once, not per forward
            entry = (ctx, {**{name: t.to_torch().to(device) for name, t in ctx.tensors().items()},
                           "partition": ctx.partition})
            self._contexts[key] = entry
            while len(self._contexts) > 4:  # a few samplings in turn (CFG's two conds ride in one context)
                self._contexts.popitem(last=False)
            info.update(context_fetch_s=round(wait_s + fetch_s, 6), context_bytes=ctx.nbytes)
        else:
            self._contexts.move_to_end(key)
        ctx, tensors = entry
        call.validate(ctx)
        sid = call.sampling_id
        lora = (None, None)
        if len(refs) > 1:  # the sampling's LoRA patches: fetched once per set, kept by id
            lkey = refs[1].hex()
            lora_set = self._lora_sets.get(lkey)
            if lora_set is None:
                lora_set, wait_s, fetch_s = receive(refs[1], wait_timeout, self.machine, "LoRA set", sid)
                lora_set.validate()
                self._lora_sets[lkey] = lora_set
                while len(self._lora_sets) > 4:
                    self._lora_sets.popitem(last=False)
                info.update(lora_fetch_s=round(wait_s + fetch_s, 6), lora_bytes=lora_set.nbytes)
            lora = (lkey, lora_set)
        try:
            video, audio, compute_s, reload_s, lora_modules = self.side.forward_rows(
                tensors, call, should_cancel=lambda: sid in self._cancelled, request_id=sid, lora=lora)
        except DenoiseCancelled as exc:
            with self._lock:
                self._cancelled.discard(sid)
            self.interrupts.append({"sampling_id": sid, "forward": call.index + 1, "message": str(exc),
                                    "at": time.time()})
            log.info("[%s] %s", sid, exc)
            raise
        self.forwards += 1
        self._step_s.append(compute_s)
        info.update(compute_s=compute_s, ended=time.time(), lora_modules=lora_modules)
        if reload_s:
            info["reloaded_after_release_s"] = round(reload_s, 4)
        if call.index == 0:
            self.recent.append({"request_id": sid, "workflow": "comfyui sampler", "steps": 0,
                                "compute_s": round(compute_s, 4), "finished": time.time(), "client": None})
        return ForwardResult(sid, call.index, wire.WireTensor.from_torch(video),
                                  wire.WireTensor.from_torch(audio)), info

    @ray.method(concurrency_group="control")
    def transformer_file(self, partition: str = "transformer") -> dict:
        """The transformer file ComfyUI's samplers run, as A's ComfyUI needs it to build its model (names, shapes,
        dtypes, metadata; no weights)."""
        return self.side.transformer_file(partition)

    # ------------------------------------------------------------------------------------------------ decode share
    @ray.method(concurrency_group="denoise")
    def decode_share(self, refs: list, request_id: str, start: int, stop: int, wait_timeout: float = 600.0,
                     first_tile: int = 0):
        """Clips ``[start, stop)`` of a request's video (of clip ``start`` only its tiles from ``first_tile`` on), from
        its latents in B's own object store (``refs[0]``, the ref ``denoise`` returned: nothing crosses the link). One
        ``wire.DecodedClip`` per clip, then B's record (``num_returns=stop - start + 1``); a cancel ends it."""
        t_start = time.time()
        with self._lock:
            self._decoding.add(request_id)
        try:
            if request_id in self._cancelled:
                raise DenoiseCancelled(f"request {request_id} was cancelled before B's decode share started")
            latents, wait_s, fetch_s = receive(refs[0], wait_timeout, "B", "latents (own)", request_id)
            share = self.side.decode_share(latents, start, stop, should_cancel=lambda: request_id in self._cancelled,
                                           first_tile=first_tile)
            clips = [wire.DecodedClip(request_id, start + j, share.of, *(  # whole clips, or the first one's tiles
                (wire.WireTensor.from_torch(c.tiles), c.first) if isinstance(c, split_decode.Tiles)
                else (wire.WireTensor.from_torch(c), 0))) for j, c in enumerate(share.clips)]
            rec = StageRecord(request_id, "decode", "B", self.node_ip, t_start, time.time(), producer_wait_s=wait_s,
                              fetch_s=fetch_s, compute_s=share.compute_s, bytes={"frames": sum(c.nbytes for c in clips)},
                              note=f"split decode: B clips {start}-{stop - 1} of {share.of}"
                              + (f" (clip {start} from tile {first_tile} of {share.tiles})" if first_tile else ""),
                              info={"clips": [start, stop], "of": share.of, "first_tile": first_tile,
                                    "tiles": share.tiles, "clip_s": [round(x, 5) for x in share.seconds]})
            log.info("[%s] decoded clips %d-%d of %d in %.3f s", request_id, start, stop - 1, share.of,
                     share.compute_s)
            return (*clips, rec)
        finally:
            with self._lock:
                self._decoding.discard(request_id)
                self._cancelled.discard(request_id)

    # ------------------------------------------------------------------------------------------------ DiT group
    @ray.method(concurrency_group="control")
    def rendezvous(self) -> str:
        """``ip:port`` on this node where a DiT group with this worker as rank 0 meets (its store listens there now)."""
        return parallel.rendezvous(self.node_ip)

    @ray.method(concurrency_group="denoise")
    def join_group(self, group_id: str, address: str, rank: int, world: int, timeout_s: float,
                   join_timeout_s: float = 600.0) -> dict:
        """Join a DiT group (queued behind this worker's running denoise): every rank calls it at once; returns when
        all joined (at most ``join_timeout_s``); its collectives are bounded by ``timeout_s``."""
        reload_s = self.side.reload_if_released()  # a released rank loads its model again before the group forms
        parallel.join(group_id, address, rank, world, timeout_s, self.side.device, join_timeout_s)
        return {"group": group_id, "rank": rank, "world": world, "node_ip": self.node_ip, "machine": self.machine,
                "reloaded_s": round(reload_s or 0.0, 4),
                "heads": int(getattr(self.side._host, self.side.partition).config.num_attention_heads)}

    @ray.method(concurrency_group="control")
    def group_of(self) -> str | None:
        """The DiT group this worker is in now (another caller may have formed a new one with it since)."""
        group = parallel.current()
        return group.group_id if group else None

    @ray.method(concurrency_group="control")
    def leave_group(self, group_id: str | None = None) -> bool:
        """Leave the DiT group (``group_id``: only that one); its peers' collectives fail at once."""
        group = parallel.current()
        if group is None or (group_id is not None and group.group_id != group_id):
            return False
        return parallel.leave()

    # ------------------------------------------------------------------------------------------------ control
    @ray.method(concurrency_group="control")
    def enqueue(self, request_id: str, steps: int, client: str | None = None) -> int:
        """Pool: a client announces the denoise it submits next (its steps), so every client sees this worker's
        queue; ``denoise`` drops the entry when it ends, ``dequeue`` when the client withdraws it. Returns the
        steps queued here, this one included."""
        with self._lock:
            ttl = float(os.environ.get("H3_POOL_QUEUE_TTL_S", "3600"))
            for rid in [r for r, e in self._queue.items() if e["state"] == "queued" and time.time() - e["since"] > ttl]:
                self._queue.pop(rid)  # announced, never submitted (its client died in between)
            self._queue.setdefault(request_id, {"request_id": request_id, "steps": int(steps), "client": client,
                                                "since": time.time(), "state": "queued"})
            return self._queued_steps()

    @ray.method(concurrency_group="control")
    def dequeue(self, request_id: str) -> bool:
        """Pool: withdraw an announced denoise that will not be submitted (or was cancelled while queued)."""
        with self._lock:
            e = self._queue.get(request_id)
            if e is None or e["state"] != "queued":
                return False
            del self._queue[request_id]
            return True

    def _queued_steps(self) -> int:
        total = 0
        for rid, e in self._queue.items():
            done = len((self._progress.get(rid) or {}).get("steps", ())) if e["state"] == "running" else 0
            total += max(int(e["steps"]) - done, 0)
        return total

    @ray.method(concurrency_group="control")
    def pool_status(self) -> dict:
        """Pool: what this worker holds and has to do, cheaply (no memory probe): the routing and ``/h3/status``."""
        with self._lock:
            queue = [{k: e[k] for k in ("request_id", "steps", "client", "state")} for e in self._queue.values()]
            queued = self._queued_steps()
            running = next((e for e in self._queue.values() if e["state"] == "running"), None)
            cur = None
            if running is not None:
                p = self._progress.get(running["request_id"]) or {}
                cur = {"request_id": running["request_id"], "client": running["client"],
                       "step": len(p.get("steps", ())), "total": p.get("total") or running["steps"]}
        side = self.side
        steps = sorted(self._step_s)
        return {"name": ray.get_runtime_context().get_actor_name() or self.config.get("name"),
                "node_ip": self.node_ip, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "ok": side is not None, "partition": side.partition if side else None,
                "resident_partitions": list(side.resident_partitions) if side else [],
                "precision": self.config.get("precision") or "auto", "dtype": side.dtype if side else None,
                "device": side.device if side else None,
                "model": self.config.get("model_dir"), "model_name": self._model_name(),
                "memory_plan": {"summary": side.memory_plan.summary(), "canvas": list(side.memory_plan.canvas)}
                if side else None,
                "resident_bytes": self._held_bytes() if side else {}, "released": side.released if side else None,
                "plan": side.plan_bytes() if side else None,  # what a new worker's plan counts of this one
                "current": cur, "queue": queue, "queued_steps": queued,
                "step_s": steps[len(steps) // 2] if steps else None}

    @ray.method(concurrency_group="watch")
    def progress(self, request_id: str, after: int = -1, wait: float = 0.0) -> dict:
        """A request's progress. With ``wait`` > 0 it answers once the request has more than ``after`` steps or has
        ended, or after ``wait`` seconds (a long poll: A learns of a step when it ends with one call per step, not
        ten a second; its own group of threads, so a watcher never holds up a cancel or a health check)."""
        deadline = time.monotonic() + max(0.0, min(float(wait), 30.0))
        with self._changed:
            while True:
                p = self._progress.get(request_id)
                left = deadline - time.monotonic()
                if left <= 0 or (p is not None and (len(p["steps"]) > after
                                                    or p["state"] in ("done", "failed", "cancelled"))):
                    break
                self._changed.wait(left)
        if p is None:
            return {"state": "queued", "steps": [], "total": 0, "error": None}
        return {"state": p["state"], "steps": list(p["steps"]), "total": p["total"], "error": p["error"],
                "cancel_at_step": p.get("cancel_at_step"), "preview": p.get("preview")}

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    @ray.method(concurrency_group="control")
    def cancel(self, request_id: str) -> bool:
        """Flag a request; B stops it before its next step (or refuses it if it has not started)."""
        with self._lock:
            if request_id in self._decoding:  # its decode share runs: stop it between two clips
                self._cancelled.add(request_id)
                return True
            p = self._progress.get(request_id)
            if p is not None and p["state"] in ("done", "failed", "cancelled"):
                return False
            if p is not None and "cancel_at_step" not in p:
                p["cancel_at_step"] = len(p["steps"])
            self._cancelled.add(request_id)
            while len(self._cancelled) > 256:  # a cancel for a request that never came: bounded, never kept
                self._cancelled.pop()
        return True

    def _held_bytes(self) -> dict:
        held = self.side.resident_bytes()
        if self.side.vae is not None:
            held["vae decoder"] = int(sum(t.numel() * t.element_size()
                                          for t in (*self.side.vae.parameters(), *self.side.vae.buffers())))
        return held

    def _serving(self, swap_s: float = 0.0) -> dict:
        """What this B serves (and so what a request it just finished ran on)."""
        return {"model": self.config["model_dir"], "model_name": self._model_name(),
                "model_dir": str(self.side.model_dir),
                "partition": self.side.partition, "resident": sorted(self.side.resident()),
                "dtype": self.side.dtype, "attention_backend": self.config.get("attention_backend", "sdpa"),
                "precision": self.config.get("precision") or "auto", "weights": self.side.weights(),
                "swapped_s": round(swap_s, 4), "vsa": self.side.vsa_info() or None}

    def _model_name(self) -> str:
        """The model served, named as this machine's picker lists it (relative to its model roots, where it can)."""
        return catalog.name_under(self.config["model_dir"], model_roots.name_roots(self.config))

    @ray.method(concurrency_group="denoise")
    def reconfigure(self, changes: dict) -> dict:
        """Serve other settings (``RECONFIGURABLE`` keys): queued behind running requests, then a reload.

        Cheap checks come first (names, attention backend import, model roots, folder), while the old model still
        serves; then the old model is dropped (two would not fit B's memory) and the new one loaded. If that load
        fails, B reloads what it had and the error says so. Returns ``{key: [old, new]}`` and the seconds it took.
        ``changes`` may carry ``search_roots`` (where a model name is looked up when B has no roots of its own): kept,
        never a reload by itself; and ``asked_by``, the node input a refused name is said to come from."""
        changes = dict(changes)
        search = changes.pop("search_roots", None)
        asked_by = changes.pop("asked_by", None)  # the node input the name came from: for a refusal's sentence only
        asked = {"asked_by": asked_by or ""}  # never the asker that started this worker
        unknown = sorted(set(changes) - set(RECONFIGURABLE))
        if unknown:
            raise ValueError(f"B cannot change {', '.join(unknown)}; it can change {', '.join(RECONFIGURABLE)}.")
        new = {**self.config, **changes, **({"search_roots": list(search)} if search is not None else {})}
        if "model_dir" in changes:  # a name: the path it names here (one that names nothing: the node's sentence)
            why = model_roots.preflight({**new, **asked})
            if why:
                raise ModelFolderError(why)
            new["model_dir"] = model_roots.resolve_model(new)
        diff = {k: [self.config.get(k), new[k]] for k in changes if self.config.get(k) != new[k]}
        if not diff:
            self.config = {**self.config, **({"search_roots": new["search_roots"]} if search is not None else {})}
            return {"changed": {}, "seconds": 0.0}
        t0 = time.perf_counter()
        resolve_attention_backend(new.get("attention_backend", "sdpa"))  # a missing flash-attn fails here, loaded
        why = model_roots.preflight({**new, **asked})  # roots, existence, a folder's partition: the node's sentence
        if why:
            raise ModelFolderError(why)
        if not catalog.is_tiny(new["model_dir"]):
            path, partition = model_roots.enforce(new), new.get("partition", "transformer")
            if path.is_file():
                formats.detect(path, partition)  # a transformer file: refused here if it is not one B can load
        old = self.config
        self.earlier_loads += len(self.side.load_records)
        self.side = None  # drop the old model first: B's memory holds one
        try:
            self.side = self.make_side(new)
        except Exception as exc:
            log.warning("reconfigure %s failed (%s); reloading the previous settings", diff, exc)
            self.side = self.make_side(old)
            raise RuntimeError(f"B could not load {', '.join(f'{k} {v[1]}' for k, v in diff.items())} "
                               f"({type(exc).__name__}: {exc}); it serves its previous settings again.") from exc
        self.config, self.reconfigures = new, self.reconfigures + 1
        log.info("reconfigured %s in %.2f s", diff, time.perf_counter() - t0)
        return {"changed": diff, "seconds": time.perf_counter() - t0}

    @ray.method(concurrency_group="denoise")
    def release(self, cause: str = "a release on request") -> dict:
        """Drop the model's weights and keep this actor (its name, its place, its settings): queued behind the
        running requests; the next denoise reloads and its record says so. Returns what was released."""
        out = self.side.release(cause)
        out["name"] = ray.get_runtime_context().get_actor_name() or self.config.get("name")
        out["rss_mb_after"] = memory_info(self.side.device)["rss_mb"]
        log.info("released %s (%s): %.1f MiB", out["partitions"], cause, out["total_bytes"] / 2**20)
        return out

    @ray.method(concurrency_group="control")
    def check_adapter(self, path: str) -> dict:
        """Whether B can use the LoRA ``path`` (inside its model roots, a file, its tensors fitting the resident
        transformer), without loading it: ``{"ok": True, "path": resolved}`` or ``{"ok": False, "error": ...}``."""
        if self.side.released is not None:  # no transformer to check the tensors against: the roots only
            try:
                found = self.side.path_check(path) if self.side.path_check is not None else path
                return {"ok": True, "path": str(found)}
            except (ValueError, OSError) as exc:
                return {"ok": False, "error": str(exc)}
        try:
            return {"ok": True, "path": self.side.adapters.check(path)}
        except (ValueError, OSError) as exc:  # AdapterError, ModelFolderError: the sentence for the node
            return {"ok": False, "error": str(exc)}

    @ray.method(concurrency_group="control")
    def models(self, search_roots: list | None = None) -> dict:
        """The models this machine has, for A's pickers: diffusers folders and MiniMax-H3 transformer files
        (``.safetensors``/``.gguf``, recognised by their keys) under B's model roots (or, where B has none, under
        ``search_roots``: the embedded single-machine cluster), then ``tiny-random``; each named relative to its root
        (absolute where that would be ambiguous: ``catalog.named_models``), the names this actor resolves."""
        roots = model_roots.own_roots(self.config)
        search = roots or list(search_roots or model_roots.parse_roots(self.config.get("search_roots")))
        return {"models": catalog.named_models(search), "roots": roots or None}

    @ray.method(concurrency_group="control")
    def health(self) -> dict:
        if self.side is None:
            raise RuntimeError("B is reloading its model (reconfigure); ask again in a moment.")
        info = base_health("B", self.side, self.started)
        info.update({k: v for k, v in self._serving().items() if k != "resident"})  # base_health's has the classes
        info["attention_backend"] = self.side.attention_backend
        info["attention_choice"] = self.config.get("attention_backend", "sdpa")
        info["partition"] = self.side.partition
        info["text_dim"] = self.side.text_dim
        info["trained_steps"] = self.side.trained_steps()  # FastH3 partitions: the only step count they take
        info["video_vae"] = self.side.decoder_info()  # can B take a split-decode share (and at which dtype)
        info["memory_plan"] = self.side.memory_report()  # the plan B loaded by, and what it measures it holds
        info["resident_bytes"] = self._held_bytes()  # per partition (and the decoder): what the panel shows
        info["released"] = self.side.released  # set while the weights are released on request
        info["reloads"] = self.side.reloads
        info["loads"], info["reconfigures"] = self.earlier_loads + info["loads"], self.reconfigures  # never backwards
        info["recent"] = list(self.recent)[-10:]
        info["busy"] = any(p["state"] in ("waiting", "running") for p in list(self._progress.values()))
        info["forwards"] = {"served": self.forwards, "interrupted": list(self.interrupts)}
        info["denoises"] = {"served": self.denoises}
        # what this worker keeps per request, each bounded (the soak watches them): progress 64, the rest below
        info["caches"] = {"progress": len(self._progress), "queue": len(self._queue), "recent": len(self.recent),
                          "contexts": len(self._contexts), "lora_sets": len(self._lora_sets),
                          "cancelled": len(self._cancelled)}
        return info



#: ``watch``: A's long polls of progress (one per request followed; each waits at most ``progress``'s bound)
CONCURRENCY_GROUPS = {"denoise": 1, "control": 4, "watch": 8}
_CLASS = None


def dit_actor_class(impl: type = DiTActorImpl):
    """The Ray actor class of ``impl`` (the DiT actor, or a subclass of it), decorated once."""
    global _CLASS
    if impl is not DiTActorImpl:
        return ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(impl)
    if _CLASS is None:
        _CLASS = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(DiTActorImpl)
    return _CLASS


def start_dit(config: dict, *, node_id: str | None = None, env: dict | None = None, impl: type = DiTActorImpl,
              detached: bool = True, get_if_exists: bool = True, role: str = "B"):
    """The one factory of a DiT worker: a named actor on a node with role B (``node_id``: pinned to that node, as
    ``setup`` pins it to its own machine), restarted as ``config["max_restarts"]`` says but never replaying a
    denoise (``max_task_retries=0``), with the pack and the forwarded environment in its ``runtime_env``. Used by
    ``setup``, the executor's embedded mode and the benchmarks; returns the handle (the actor loads its model in
    the background: its first call waits for that)."""
    config = {**config, "role": role}  # "A": a DiT rank on A's machine, for parallel denoise
    opts = {"name": config["name"], "namespace": config.get("namespace") or NAMESPACE,
            "resources": {ROLE_A if role == "A" else ROLE_B: 1}, "num_cpus": ACTOR_CPUS,
            "max_restarts": int(config.get("max_restarts", -1)), "max_task_retries": 0,
            "runtime_env": runtime_env({**parallel.gloo_interface_env(), **(env or {})})}
    if detached:
        opts["lifetime"] = "detached"
    if get_if_exists:
        opts["get_if_exists"] = True
    if node_id is not None:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    if get_if_exists and not _exists(opts["name"], opts["namespace"]):
        _preflight(config, opts, float(config.get("preflight_timeout_s", 60.0)))
    return dit_actor_class(impl).options(**opts).remote(config)


def _exists(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
        return True
    except ValueError:
        return False


def _preflight(config: dict, opts: dict, timeout: float) -> None:
    """Before a new DiT worker loads torch and its model: a light task where it will run checks the model path
    (seconds instead of the actor's start), and a path it cannot load is refused with the way out."""
    task = ray.remote(num_cpus=0)(model_roots.preflight).options(
        resources={k: 0.001 for k in opts["resources"]}, runtime_env=opts["runtime_env"],
        **({"scheduling_strategy": opts["scheduling_strategy"]} if "scheduling_strategy" in opts else {}))
    ref = task.remote(config)
    try:
        why = ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:  # no answer (B busy starting): the actor's own load checks the same
        ray.cancel(ref, force=True)
        log.warning("the model check on B did not answer in %.0f s; the DiT worker checks its model itself", timeout)
        return
    if why:
        raise ModelFolderError(why)
