"""Benchmarks of the two-node split: ``python -m comfy_h3_nodes bench VERB [options]``.

Verbs (each starts the embedded two-node Ray cluster, or reuses the one this process already joined):

* ``handoff``: the A->B and B->A payloads at their real shapes (shared/design.md section 2), received by an actor on
  the other node exactly as the A/B actors receive them (ref inside a list, ``receive`` + ``materialize``), next to
  Ray's own floor for the same bytes (one plain uint8 numpy array, same path) and a memcpy of the same bytes.
  ``--tensor-transport`` adds Ray's direct tensor transport (gloo collective on CPU) for the same byte counts.
* ``pipeline``: N requests with synthetic, balanced stage times through the real executor (tiny model, resident A/B
  actors), pipelined versus one at a time, next to the ideal bound ``fill + (N-1) x slower machine``.
* ``step-overhead``: B's per-step control overhead (the two step hook blocks, progress bookkeeping, cancel check).
* ``warm``: first versus second request through the executor; the second must load nothing.
* ``memory``: the memory plan of B's transformer residency against what B's actor really holds, for the tiny model in
  three plans (``bf16-one``, ``fp8-both``, ``gguf-q8_0-both``), and the plan's arithmetic at the released model's size.
* ``decode``: one request's video decode by A alone versus split with B (``decode_on`` ``A`` vs ``A+B``, shares
  from the measured clip times) at 124 and 345 frames, each actor pinned to one CPU thread, with a larger random video
  VAE (the real diffusers class, random weights, built here) so the decode is compute-bound like the released one.
* ``all``: every bench above in one cluster.

``--json`` makes the LAST line of output one JSON object; ``--quick`` shrinks counts for the smoke test.
Numbers are medians; the goals (ratio_vs_raw <= 1.2, makespan <= 1.05 x ideal, >= 1.6 x sequential, step overhead
<= 1 ms, warm load 0) are reported, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import warnings

from ... import PACK_ROOT
GOALS = {"plan_vs_measured": 0.02, "fp8_both_vs_bf16_one": 1.05, "ratio_vs_raw": 1.2, "makespan_vs_ideal": 1.05, "speedup_vs_sequential": 1.6, "step_overhead_us": 1000.0,
         "warm_load_s": 0.0}

# Balanced synthetic stage times of ``bench pipeline`` (seconds). A: encode + decode = 0.30 s plus ~0.1 s of real
# tiny-model work; B: denoise 0.40 s plus ~0.01 s of real work, so both machines spend ~0.41 s per request.
DEFAULT_SYNTHETIC = {"encode": 0.15, "denoise": 0.40, "decode": 0.15}


def _median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else float("nan")


def _ms(s: float) -> float:
    return round(s * 1e3, 3)


def _runtime_env() -> dict:
    pypath = os.environ.get("PYTHONPATH", "")
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (str(PACK_ROOT), pypath) if p),
                         "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}}


@contextlib.contextmanager
def cluster(object_store_mb: int = 1024):
    """The embedded two-node cluster, or the one this process already joined (topology validated either way)."""
    import ray

    from ... import placement  # noqa: F401 - the composition root: registers the actor classes executors place
    from ...cluster import ray_cluster as cl

    if ray.is_initialized():
        cl.validate_topology()
        yield None
        return
    c = cl.EmbeddedCluster(object_store_mb=object_store_mb).start()
    try:
        cl.validate_topology()
        yield c
    finally:
        c.shutdown()


# ==================================================================================================== handoff
def handoff_shapes() -> list[dict]:
    """The real payloads of shared/design.md section 2 (256 prompt tokens; one 16:9 ref2va image = 7,296 tokens)."""
    return [
        {"name": "t2va 832x480x124 A->B", "direction": "A->B", "kind": "encoded", "workflow": "t2va",
         "height": 480, "width": 832, "frames": 124, "tokens": 256},
        {"name": "832x480x124 B->A", "direction": "B->A", "kind": "latents", "height": 480, "width": 832,
         "frames": 124},
        {"name": "1344x768x124 B->A", "direction": "B->A", "kind": "latents", "height": 768, "width": 1344,
         "frames": 124},
        {"name": "1344x768x345 B->A", "direction": "B->A", "kind": "latents", "height": 768, "width": 1344,
         "frames": 345},
        {"name": "ref2va 1344x768x124 +1 image A->B", "direction": "A->B", "kind": "encoded", "workflow": "ref2va",
         "height": 768, "width": 1344, "frames": 124, "tokens": 256 + 7296, "ref_latent_hw": (128, 224)},
    ]


def build_payload(spec: dict, seed: int = 0):
    """A real, valid EncodedRequest / DenoisedLatents of ``spec``'s shapes with random data."""
    import torch

    from ...engine.contract import wire

    g = torch.Generator().manual_seed(seed)
    h, w, f = spec["height"], spec["width"], spec["frames"]
    rid = f"bench-{spec['name'].split()[0]}-{seed}"
    if spec["kind"] == "latents":
        lat = torch.randn((1, wire.VIDEO_LATENT_CHANNELS, wire.video_latent_frames(f), h // 16, w // 16), generator=g)
        audio = torch.randn((wire.AUDIO_CHANNELS, wire.AUDIO_LATENT_CHANNELS, wire.audio_latent_frames(f)),
                            generator=g)
        return wire.DenoisedLatents(rid, "t2va", h, w, f, wire.WireTensor.from_torch(lat),
                                    wire.WireTensor.from_torch(audio)).validate()
    tokens = spec["tokens"]
    embeds = torch.randn((1, tokens, 5120), generator=g).to(torch.bfloat16)
    tags = torch.zeros(tokens, dtype=torch.int64)
    extra = {}
    if spec["workflow"] == "ref2va":
        tags[256:] = 1
        rh, rw = spec["ref_latent_hw"]
        cond = torch.randn((1, wire.VIDEO_LATENT_CHANNELS, 1, rh, rw), generator=g)
        extra = {"condition_latents": (wire.WireTensor.from_torch(cond),),
                 "references": (wire.ReferenceMeta("image", False),)}
    return wire.EncodedRequest(rid, spec["workflow"], h, w, f, 50, seed, wire.WireTensor.from_torch(embeds),
                               wire.WireTensor.from_torch(tags), **extra).validate(text_dim=5120)


def zero_copy_report(payload) -> dict:
    """Per wire tensor: is it a read-only view of the object store, and is its torch tensor the same memory?"""
    out = {}
    for name, t in payload.tensors().items():
        view = t.to_torch()
        out[name] = bool(not t.data.flags.owndata and not t.data.flags.writeable
                         and view.data_ptr() == t.data.ctypes.data)
    return out


class HandoffEndpoint:
    """One end of the hand-off bench, resident on a node: builds payloads, produces them, receives them."""

    def __init__(self, role: str, threads: int = 1):
        import ray

        from ...engine import process as common

        common.setup_process(threads)
        self.role = role
        self.node_ip = ray.util.get_node_ip_address()
        self.payloads: dict = {}
        self.raws: dict = {}
        self.dst: dict = {}

    def ip(self) -> str:
        return self.node_ip

    def prepare(self, spec: dict) -> dict:
        import numpy as np

        payload = build_payload(spec)
        self.payloads[spec["name"]] = payload
        raw = np.random.default_rng(0).integers(0, 255, payload.nbytes, dtype=np.uint8)
        self.raws[spec["name"]] = raw
        return {"bytes": payload.nbytes, "fields": payload.field_bytes()}

    def produce(self, name: str, what: str):
        """Return the payload (or the raw array): Ray serialises it into this node's object store as a task return,
        like ``encode``/``denoise`` return theirs."""
        return self.payloads[name] if what == "payload" else self.raws[name]

    def serialize(self, name: str, what: str, repeats: int) -> list[float]:
        """Producer-side ``ray.put`` time of the payload (or the raw array)."""
        import ray

        obj = self.payloads[name] if what == "payload" else self.raws[name]
        out = []
        del_first = ray.put(obj)  # the first put of a size may fault in fresh object-store pages: not counted
        del del_first
        for _ in range(repeats):
            t0 = time.perf_counter()
            ref = ray.put(obj)
            out.append(time.perf_counter() - t0)
            del ref
        return out

    def receive(self, refs: list, name: str, what: str, text_dim: int | None = None) -> dict:
        """What the A/B actors do with a hand-off: bounded wait + fetch, then materialise (timed like them)."""
        import numpy as np
        import ray
        import torch

        from ...engine import process as common
        from ...engine.contract import wire

        obj, wait_s, fetch_s = common.receive(refs[0], 120.0, self.role, "bench", name)
        out = {"producer_wait_s": wait_s, "fetch_s": fetch_s}
        if what == "payload":
            out["materialize_s"] = common.materialize(obj)
            t0 = time.perf_counter()
            if isinstance(obj, wire.EncodedRequest):
                obj.validate(text_dim=text_dim)
            else:
                obj.validate()
            out["validate_s"] = time.perf_counter() - t0
            out["zero_copy"] = zero_copy_report(obj)
        else:
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                torch.from_numpy(obj)
            out["materialize_s"] = time.perf_counter() - t0
            out["zero_copy"] = {"raw": bool(not obj.flags.owndata and not obj.flags.writeable)}
            dst = self.dst.get(obj.nbytes)
            if dst is None:
                dst = self.dst[obj.nbytes] = np.ones(obj.nbytes, dtype=np.uint8)  # faulted in before timing
            t0 = time.perf_counter()
            np.copyto(dst, obj)
            out["memcpy_s"] = time.perf_counter() - t0
        del obj
        # The same object again, now local: Ray's local get + deserialisation (the pickled dataclass's own cost).
        t0 = time.perf_counter()
        again = ray.get(refs[0], timeout=60)
        out["local_get_s"] = time.perf_counter() - t0
        del again
        return out


def _endpoints(cls, **opts):
    import ray

    from ...cluster import ray_cluster as cl

    remote = ray.remote(cls) if not hasattr(cls, "remote") else cls
    a = remote.options(resources={cl.ROLE_A: 1}, runtime_env=_runtime_env(), **opts).remote("A")
    b = remote.options(resources={cl.ROLE_B: 1}, runtime_env=_runtime_env(), **opts).remote("B")
    topo = cl.validate_topology()
    ips = ray.get([a.ip.remote(), b.ip.remote()], timeout=300)
    if ips != [topo.a.ip, topo.b.ip]:
        raise RuntimeError(f"bench endpoints landed on {ips}, expected A={topo.a.ip} B={topo.b.ip}")
    return a, b


def run_handoff(repeats: int = 10, warmup: int = 2, shapes: list[dict] | None = None,
                tensor_transport: bool = False, log=print) -> dict:
    import ray

    shapes = shapes or handoff_shapes()
    ep = dict(zip("AB", _endpoints(HandoffEndpoint)))
    info = {}
    for spec in shapes:
        producer = ep[spec["direction"][0]]
        info[spec["name"]] = ray.get(producer.prepare.remote(spec), timeout=300)
    samples = {s["name"]: {"payload": [], "raw": []} for s in shapes}  # paired: same repeat, back to back
    for rep in range(warmup + repeats):
        for spec in shapes:
            producer, receiver = ep[spec["direction"][0]], ep[spec["direction"][-1]]
            order = ("payload", "raw") if rep % 2 == 0 else ("raw", "payload")
            for what in order:
                ref = producer.produce.remote(spec["name"], what)
                ray.wait([ref], fetch_local=False, timeout=120)  # producer done: receive measures the hand-off only
                text_dim = 5120 if spec["kind"] == "encoded" else None
                res = ray.get(receiver.receive.remote([ref], spec["name"], what, text_dim), timeout=300)
                del ref
                if rep >= warmup:
                    samples[spec["name"]][what].append(res)
    result = {}
    for spec in shapes:
        name = spec["name"]
        producer = ep[spec["direction"][0]]
        ser_p = ray.get(producer.serialize.remote(name, "payload", max(3, repeats)), timeout=300)
        ser_r = ray.get(producer.serialize.remote(name, "raw", max(3, repeats)), timeout=300)
        p, r = samples[name]["payload"], samples[name]["raw"]
        recv = [x["fetch_s"] + x["materialize_s"] for x in p]
        raw = [x["fetch_s"] + x["materialize_s"] for x in r]
        nbytes = info[name]["bytes"]
        row = {
            "direction": spec["direction"],
            "bytes": nbytes,
            "fields": info[name]["fields"],
            "receive_ms": _ms(_median(recv)),
            "fetch_ms": _ms(_median([x["fetch_s"] for x in p])),
            "materialize_ms": _ms(_median([x["materialize_s"] for x in p])),
            "raw_ms": _ms(_median(raw)),
            "memcpy_ms": _ms(_median([x["memcpy_s"] for x in r])),
            "serialize_ms": _ms(_median(ser_p)),
            "raw_serialize_ms": _ms(_median(ser_r)),
            "validate_ms": _ms(_median([x["validate_s"] for x in p])),
            "local_get_ms": _ms(_median([x["local_get_s"] for x in p])),
            "raw_local_get_ms": _ms(_median([x["local_get_s"] for x in r])),
            "ratio_paired": round(_median([a / b for a, b in zip(recv, raw) if b > 0]), 3) if raw else None,
            "receive_min_ms": _ms(min(recv)) if recv else None,
            "raw_min_ms": _ms(min(raw)) if raw else None,
            "zero_copy": all(all(x["zero_copy"].values()) for x in p) and bool(p),
            "raw_zero_copy": all(all(x["zero_copy"].values()) for x in r) and bool(r),
            "repeats": len(p),
        }
        row["ratio_vs_raw"] = round(row["receive_ms"] / row["raw_ms"], 3) if row["raw_ms"] else None
        row["receive_gbps"] = round(nbytes / (row["receive_ms"] / 1e3) / 1e9, 3) if row["receive_ms"] else None
        row["raw_gbps"] = round(nbytes / (row["raw_ms"] / 1e3) / 1e9, 3) if row["raw_ms"] else None
        result[name] = row
    for handle in ep.values():
        ray.kill(handle)
    out = {"bench": "handoff", "repeats": repeats, "warmup": warmup, "shapes": result,
           "goal_ratio_vs_raw": GOALS["ratio_vs_raw"],
           "goal_met": all((r["ratio_vs_raw"] or 99) <= GOALS["ratio_vs_raw"] for r in result.values())}
    log(format_handoff(out))
    if tensor_transport:
        out["tensor_transport"] = run_tensor_transport([info[s["name"]]["bytes"] for s in shapes],
                                                       [s["name"] for s in shapes], repeats, warmup, log)
    return out


def format_handoff(out: dict) -> str:
    head = (f"{'shape':34} {'dir':4} {'MiB':>6} {'receive':>8} {'raw':>7} {'ratio':>5} {'paired':>6} "
            f"{'memcpy':>6} {'mat.':>5} {'get2':>5} {'raw get2':>8} {'serial.':>7} {'validate':>8} {'GB/s':>5} "
            f"{'0-copy':>6}")
    lines = [f"hand-off between the two nodes, median of {out['repeats']} (ms). receive = fetch + materialise on the "
             "receiving node's actor; raw = one uint8 array of the same bytes, same path; paired = median of "
             "back-to-back receive/raw; get2 = second (local) ray.get: deserialisation; serial. = ray.put on the "
             "producer; validate is not part of receive", head, "-" * len(head)]
    for name, r in out["shapes"].items():
        lines.append(
            f"{name:34} {r['direction']:4} {r['bytes'] / 2**20:6.2f} {r['receive_ms']:8.2f} {r['raw_ms']:7.2f} "
            f"{r['ratio_vs_raw'] or float('nan'):5.2f} {r['ratio_paired'] or float('nan'):6.2f} "
            f"{r['memcpy_ms']:6.2f} {r['materialize_ms']:5.2f} {r['local_get_ms']:5.2f} {r['raw_local_get_ms']:8.2f} "
            f"{r['serialize_ms']:7.2f} {r['validate_ms']:8.2f} {r['receive_gbps'] or 0:5.2f} "
            f"{'yes' if r['zero_copy'] else 'NO':>6}")
    lines.append(f"goal ratio_vs_raw <= {GOALS['ratio_vs_raw']}: {'met' if out['goal_met'] else 'NOT met'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- tensor transport
class TransportEndpoint:
    """Experiment only: Ray's direct tensor transport (RDT) over a gloo collective group, on CPU."""

    def __init__(self, role: str):
        import torch

        torch.set_num_threads(1)
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.tensors: dict = {}

    def ip(self) -> str:
        return self.node_ip

    def make(self, nbytes: int) -> int:
        import torch

        self.tensors[nbytes] = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        return nbytes

    def send_store(self, nbytes: int):
        return self.tensors[nbytes].numpy()  # the object-store path (zero-copy numpy)

    def send_gloo(self, nbytes: int):  # decorated with tensor_transport="gloo" when the class is made remote
        return self.tensors[nbytes]

    def arrived(self, tensor, sent: float) -> float:
        """Called with the tensor as a top-level argument: Ray resolved it before the call started."""
        return time.time() - sent


def run_tensor_transport(sizes: list[int], names: list[str], repeats: int, warmup: int, log=print) -> dict:
    """End to end (driver submits the consumer call -> consumer starts with the tensor in hand), both paths the
    same way: the object store (numpy, zero-copy) versus Ray's tensor transport over gloo."""
    import ray

    try:
        from ray.experimental.collective import create_collective_group

        cls = type("TransportEndpointRDT", (TransportEndpoint,), {
            "send_gloo": ray.method(tensor_transport="gloo")(TransportEndpoint.send_gloo)})
        remote = ray.remote(enable_tensor_transport=True)(cls)
        a, b = _endpoints(remote)
        create_collective_group([a, b], backend="torch_gloo")
    except Exception as exc:  # noqa: BLE001 - an experiment: report why it could not run
        log(f"tensor transport: could not set up ({type(exc).__name__}: {exc})")
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = {}
    for name, nbytes in zip(names, sizes):
        ray.get(a.make.remote(nbytes), timeout=120)
        t = {"store": [], "gloo": [], "call": []}
        for rep in range(warmup + repeats):
            for path in ("store", "gloo"):
                ref = (a.send_store if path == "store" else a.send_gloo).remote(nbytes)
                ray.wait([ref], fetch_local=False, timeout=120)
                dt = ray.get(b.arrived.remote(ref, time.time()), timeout=300)
                del ref
                if rep >= warmup:
                    t[path].append(dt)
            dt = ray.get(b.arrived.remote(None, time.time()), timeout=60)  # the empty call, same measure
            if rep >= warmup:
                t["call"].append(dt)
        row = {"bytes": nbytes, "store_ms": _ms(_median(t["store"])), "gloo_ms": _ms(_median(t["gloo"])),
               "empty_call_ms": _ms(_median(t["call"]))}
        row["gloo_vs_store"] = round(row["gloo_ms"] / row["store_ms"], 3) if row["store_ms"] else None
        out[name] = row
    ray.kill(a)
    ray.kill(b)
    head = f"{'bytes (as shape)':36} {'MiB':>7} {'store':>8} {'gloo':>8} {'gloo/store':>10} {'empty call':>10}"
    lines = ["direct tensor transport experiment (end to end incl. the actor call, median ms; A -> B)", head,
             "-" * len(head)]
    for name, r in out.items():
        lines.append(f"{name:36} {r['bytes'] / 2**20:7.2f} {r['store_ms']:8.2f} {r['gloo_ms']:8.2f} "
                     f"{r['gloo_vs_store'] or float('nan'):10.2f} {r['empty_call_ms']:10.2f}")
    log("\n".join(lines))
    return out


# ==================================================================================================== executor
def tiny_checkpoint(path: str | None = None) -> pathlib.Path:
    """The tiny random checkpoint (real classes), built once into a cache folder (or ``path``)."""
    from ...engine.model.tiny import build_tiny_checkpoint

    if path:
        p = pathlib.Path(path)
        if not (p / "modular_model_index.json").is_file():
            build_tiny_checkpoint(p, seed=0)
        return p
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "comfy-h3"
    target = cache / "bench-tiny-h3"
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-tiny-h3.", dir=cache))
    build_tiny_checkpoint(tmp, seed=0)
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race: use theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _make_executor(ckpt, tag: str, synthetic: dict | None = None, max_in_flight: int = 2):
    from ...engine.executor.executor import BConfig, H3Executor, SideConfig, Timeouts

    synthetic = synthetic or {}
    a = SideConfig(str(ckpt), dtype="float32", threads=1,
                   synthetic_stages={k: v for k, v in synthetic.items() if k in ("encode", "decode")})
    b = BConfig(str(ckpt), dtype="float32", threads=1, name=f"h3_dit_bench_{tag}_{os.getpid()}",
                synthetic_stages={k: v for k, v in synthetic.items() if k == "denoise"})
    timeouts = Timeouts(start=600, health=30, encode=120, handoff=120, stall=120, decode=120, poll=0.05)
    return H3Executor(a, b, max_in_flight=max_in_flight, timeouts=timeouts,
                      a_name=f"h3_enc_bench_{tag}_{os.getpid()}")


def _request(i: int, steps: int = 2, size: int = 32):
    from ...engine.contract.request import H3Request

    return H3Request(prompt=f"bench request {i}: a robot dances while a piano plays", height=size, width=size,
                     num_frames=124, steps=steps, seed=1000 + i, request_id=f"bench-{i:03d}-{os.getpid()}")


def _busy(records) -> dict:
    """Seconds each machine was occupied by one request (its calls, minus waiting for the producer)."""
    r = {x.stage: x for x in records}
    a = r["encode"].compute_s + r["b_to_a"].receive_s + r["b_to_a"].validate_s + r["decode"].compute_s
    b = r["a_to_b"].receive_s + r["a_to_b"].validate_s + r["denoise"].compute_s
    return {"A": a, "B": b}


def _stage_medians(results) -> dict:
    from ...engine.contract.timing import summarize

    per = [summarize(res.records) for res in results]
    return {k: round(_median([p.get(k, 0.0) for p in per]), 4) for k in ("encode", "a_to_b", "denoise", "b_to_a",
                                                                          "decode")}


def run_pipeline(requests: int = 8, in_flight: tuple[int, ...] = (2, 3), synthetic: dict | None = None,
                 ckpt=None, log=print) -> dict:
    synthetic = dict(DEFAULT_SYNTHETIC if synthetic is None else synthetic)
    ckpt = ckpt or tiny_checkpoint()
    ex = _make_executor(ckpt, "pipe", synthetic, max_in_flight=max(in_flight))
    seq = None
    try:
        t0 = time.perf_counter()
        ex.start()
        start_s = time.perf_counter() - t0
        ex.generate(_request(900))  # warm: lazy pipelines built, nothing measured
        seq = _make_executor(ckpt, "pipe", synthetic, max_in_flight=1)  # the same resident actors, one at a time
        seq.start()
        t0 = time.perf_counter()
        seq_results = seq.run_many([_request(i) for i in range(requests)])
        seq_makespan = time.perf_counter() - t0
        busy = [_busy(r.records) for r in seq_results]
        t_a, t_b = _median([x["A"] for x in busy]), _median([x["B"] for x in busy])
        fill = seq_makespan / requests  # one request alone, end to end, as the executor runs it
        ideal = fill + (requests - 1) * max(t_a, t_b)
        nominal_fill = synthetic.get("encode", 0) + synthetic.get("denoise", 0) + synthetic.get("decode", 0)
        nominal_ideal = nominal_fill + (requests - 1) * max(synthetic.get("encode", 0) + synthetic.get("decode", 0),
                                                            synthetic.get("denoise", 0))
        runs = {}
        for k in in_flight:
            ex.set_max_in_flight(k)
            ex.max_seen_in_flight = 0
            t0 = time.perf_counter()
            results = ex.run_many([_request(100 * k + i) for i in range(requests)])
            makespan = time.perf_counter() - t0
            den = sorted((r for res in results for r in res.records if r.stage in ("a_to_b", "denoise")),
                         key=lambda r: r.start)
            b_busy = sum(_busy(res.records)["B"] for res in results)
            b_span = max(r.end for r in den) - min(r.start for r in den)
            runs[str(k)] = {
                "max_in_flight": k,
                "makespan_s": round(makespan, 3),
                "ratio_vs_ideal": round(makespan / ideal, 3),
                "ratio_vs_b_bound": round(makespan / (fill + (requests - 1) * t_b), 3),
                "speedup_vs_sequential": round(seq_makespan / makespan, 3),
                "max_seen_in_flight": ex.max_seen_in_flight,
                "b_utilisation": round(b_busy / b_span, 3) if b_span > 0 else None,
                "stage_medians_s": _stage_medians(results),
            }
        out = {
            "bench": "pipeline", "requests": requests, "synthetic_s": synthetic, "actor_start_s": round(start_s, 2),
            "sequential_makespan_s": round(seq_makespan, 3), "fill_s": round(fill, 4),
            "a_per_request_s": round(t_a, 4), "b_per_request_s": round(t_b, 4), "ideal_s": round(ideal, 3),
            "nominal_ideal_s": round(nominal_ideal, 3), "nominal_sequential_s": round(requests * nominal_fill, 3),
            "sequential_stage_medians_s": _stage_medians(seq_results), "runs": runs,
        }
        best = runs[str(min(in_flight))]
        out["goal_met"] = {"makespan_vs_ideal": best["ratio_vs_ideal"] <= GOALS["makespan_vs_ideal"],
                           "speedup_vs_sequential": best["speedup_vs_sequential"] >= GOALS["speedup_vs_sequential"]}
        log(format_pipeline(out))
        return out
    finally:
        if seq is not None:
            seq._loop.stop()  # shares ex's actors: only its loop thread is its own
        ex.shutdown(kill_b=True)


def format_pipeline(out: dict) -> str:
    s = out["synthetic_s"]
    lines = [
        f"pipeline: {out['requests']} requests, tiny model + synthetic stages encode {s.get('encode', 0)} s, "
        f"denoise {s.get('denoise', 0)} s, decode {s.get('decode', 0)} s",
        f"  per request, measured one at a time: A busy {out['a_per_request_s']:.3f} s (encode + receive + decode), "
        f"B busy {out['b_per_request_s']:.3f} s (receive + denoise), end to end {out['fill_s']:.3f} s",
        f"  sequential (max_in_flight=1): {out['sequential_makespan_s']:.3f} s "
        f"(nominal {out['nominal_sequential_s']:.3f} s)",
        f"  ideal = fill + (N-1) x slower machine = {out['ideal_s']:.3f} s (nominal {out['nominal_ideal_s']:.3f} s)",
        "  (A runs encode and decode in two concurrency groups, so A's two stages may overlap and a makespan a little "
        "under the ideal is possible when A measures slower; /B-bound uses B's time alone)",
        f"  {'in flight':>9} {'makespan':>9} {'/ideal':>7} {'/B-bound':>8} {'speedup':>8} {'B util':>7}",
    ]
    for r in out["runs"].values():
        lines.append(f"  {r['max_in_flight']:9d} {r['makespan_s']:9.3f} {r['ratio_vs_ideal']:7.3f} "
                     f"{r['ratio_vs_b_bound']:8.3f} {r['speedup_vs_sequential']:8.3f} {r['b_utilisation'] or 0:7.3f}")
    lines.append(f"  goals (default max_in_flight): makespan <= {GOALS['makespan_vs_ideal']} x ideal "
                 f"{'met' if out['goal_met']['makespan_vs_ideal'] else 'NOT met'}; speedup >= "
                 f"{GOALS['speedup_vs_sequential']} {'met' if out['goal_met']['speedup_vs_sequential'] else 'NOT met'}")
    return "\n".join(lines)


def run_warm(ckpt=None, log=print) -> dict:
    ckpt = ckpt or tiny_checkpoint()
    ex = _make_executor(ckpt, "warm")
    try:
        t0 = time.perf_counter()
        ex.start()
        start_s = time.perf_counter() - t0
        loads0 = ex.load_records()
        rows = []
        for i in range(2):
            before = ex.load_records()
            t0 = time.perf_counter()
            res = ex.generate(_request(500 + i, steps=3, size=64))
            wall = time.perf_counter() - t0
            after = ex.load_records()
            new = {side: after[side][len(before[side]):] for side in after}
            swap = sum(r.load_s for r in res.records)
            rows.append({
                "wall_s": round(wall, 4),
                "load_s": round(sum(r.seconds for recs in new.values() for r in recs) + swap, 4),
                "loads": sum(len(v) for v in new.values()),
                "stages_s": {k: round(v, 4) for k, v in res.stage_seconds().items()},
            })
        out = {
            "bench": "warm", "actor_start_s": round(start_s, 2),
            "startup_load_s": {side: round(sum(r.seconds for r in recs), 3) for side, recs in loads0.items()},
            "startup_loads": {side: [r.component for r in recs] for side, recs in loads0.items()},
            "first": rows[0], "second": rows[1],
            "goal_met": rows[1]["load_s"] == GOALS["warm_load_s"] and rows[1]["loads"] == 0,
        }
        lines = [f"warm: actors started in {out['actor_start_s']:.2f} s; loads at start A "
                 f"{out['startup_load_s'].get('A', 0):.3f} s, B {out['startup_load_s'].get('B', 0):.3f} s",
                 f"  {'request':8} {'wall s':>8} {'loads':>6} {'load s':>7}  stages"]
        for label, r in (("first", rows[0]), ("second", rows[1])):
            lines.append(f"  {label:8} {r['wall_s']:8.3f} {r['loads']:6d} {r['load_s']:7.3f}  "
                         + " ".join(f"{k}={v:.3f}" for k, v in r["stages_s"].items()))
        lines.append(f"  goal: second request loads nothing: {'met' if out['goal_met'] else 'NOT met'}")
        log("\n".join(lines))
        return out
    finally:
        ex.shutdown(kill_b=True)


# ==================================================================================================== step overhead
def run_step_overhead(iterations: int = 10_000, model_steps: int = 20, model_repeats: int = 3, ckpt=None,
                      with_model: bool = True, log=print) -> dict:
    """Per-step control cost on B: diffusers' loop dispatch of our two hook blocks, the StepMonitor (cancel check,
    step timing, record) and the actor's progress bookkeeping, each step as B runs it, with a step that costs 0."""
    from types import SimpleNamespace

    from remote_worker.b_side import MonitorSlot, StepMonitor, _hook_block

    from ...engine.model import split

    denoise = split.split_workflow("t2va")["denoise"]
    loop = next(b for b in denoise.sub_blocks.values() if hasattr(b, "loop_step"))
    loop.sub_blocks.clear()  # an empty loop: diffusers' per-step dispatch with nothing in it (the baseline)
    slot = MonitorSlot()
    total = 50
    state = SimpleNamespace(timesteps=list(range(total)))
    cancelled: set = set()

    def one_request(rid):  # what DiTActorImpl.denoise sets up around BSide.denoise
        progress = {"state": "running", "steps": [], "total": total, "error": None}

        def on_step(rec):
            progress["steps"].append((rec.index, rec.total, rec.seconds))

        return StepMonitor(total=total, on_step=on_step, should_cancel=lambda: rid in cancelled, request_id=rid)

    def run(n):
        t0 = time.perf_counter()
        for k in range(n):
            i = k % total
            if i == 0:
                slot.monitor = one_request(f"r{k}")
            loop.loop_step(None, state, i=i, t=i)
        return time.perf_counter() - t0

    reps = 5
    base, hooked = [], []
    for _ in range(reps):
        loop.sub_blocks.clear()
        base.append(run(iterations) / iterations)
        loop.sub_blocks["h3_step_start"] = _hook_block("start", slot)
        loop.sub_blocks["h3_step_end"] = _hook_block("end", slot)
        hooked.append(run(iterations) / iterations)
    slot.monitor = None
    # The executor polls B's progress every 0.1 s; one poll copies the step list (50 steps).
    monitor = one_request("poll")
    for i in range(total):
        monitor.start(i)
        monitor.end(i)
    p = {"state": "running", "steps": [(s.index, s.total, s.seconds) for s in monitor.steps], "total": total,
         "error": None}
    t0 = time.perf_counter()
    for _ in range(iterations):
        {"state": p["state"], "steps": list(p["steps"]), "total": p["total"], "error": p["error"]}
    poll_us = (time.perf_counter() - t0) / iterations * 1e6
    out = {
        "bench": "step-overhead", "iterations": iterations, "repeats": reps,
        "hooked_step_us": round(_median(hooked) * 1e6, 3),
        "empty_step_us": round(_median(base) * 1e6, 3),
        "overhead_us": round((_median(hooked) - _median(base)) * 1e6, 3),
        "progress_poll_us": round(poll_us, 3),
        "goal_step_overhead_us": GOALS["step_overhead_us"],
    }
    out["goal_met"] = out["hooked_step_us"] <= GOALS["step_overhead_us"]
    lines = [f"step overhead on B ({iterations} steps x {reps}, a step costing 0; median us per step)",
             f"  {'diffusers loop dispatch, no hooks':52} {out['empty_step_us']:9.3f} us",
             f"  {'+ our 2 hook blocks, StepMonitor, progress, cancel':52} {out['hooked_step_us']:9.3f} us "
             f"(overhead {out['overhead_us']:.3f} us)",
             f"  {'one progress poll (50 steps copied; every 0.1 s)':52} {out['progress_poll_us']:9.3f} us"]
    if with_model:
        out["tiny_model"] = _step_overhead_model(model_steps, model_repeats, ckpt)
        m = out["tiny_model"]
        lines.append(f"  tiny model, {m['steps']} forwards per request, median of {m['repeats']}: "
                     f"{m['with_hooks_ms_per_step']:.3f} ms/step with hooks vs {m['without_hooks_ms_per_step']:.3f} "
                     f"without (difference {m['difference_us_per_step']:.1f} us; run-to-run spread "
                     f"{m['noise_us_per_step']:.1f} us)")
    lines.append(f"  goal <= {GOALS['step_overhead_us']:.0f} us: {'met' if out['goal_met'] else 'NOT met'}")
    log("\n".join(lines))
    return out


def _step_overhead_model(steps: int, repeats: int, ckpt=None) -> dict:
    """The tiny model's step time through BSide's hooked pipeline versus diffusers' own denoise blocks."""
    import torch

    from remote_worker.b_side import BSide, StepMonitor

    from ...engine.model import split
    from ...engine.contract import wire

    ckpt = ckpt or tiny_checkpoint()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        side = BSide(ckpt, dtype="float32", device="cpu")
        g = torch.Generator().manual_seed(0)
        payload = wire.EncodedRequest("step-bench", "t2va", 32, 32, 124, steps + 1, 0,
                                      wire.WireTensor.from_torch(torch.randn((1, 16, side.text_dim), generator=g)),
                                      wire.WireTensor.from_torch(torch.zeros(16, dtype=torch.int64))).validate()
        hooked = side._pipe("t2va")
        plain = split.make_group_pipeline(split.split_workflow("t2va")["denoise"], side.model_dir, side._host,
                                          split.b_components(side.partition))
        progress = []

        def call(pipe, monitor):
            side._slot.monitor = monitor
            t0 = time.perf_counter()
            pipe(**payload.pipeline_inputs(), generator=torch.Generator("cpu").manual_seed(0),
                 output=["latents", "audio_latents"])
            side._slot.monitor = None
            return (time.perf_counter() - t0) / steps

        call(hooked, None)
        call(plain, None)
        w, wo = [], []
        for _ in range(repeats):
            mon = StepMonitor(total=steps, on_step=lambda r: progress.append((r.index, r.total, r.seconds)),
                              should_cancel=lambda: False, request_id="step-bench")
            w.append(call(hooked, mon))
            wo.append(call(plain, None))
        noise = statistics.pstdev(wo) if len(wo) > 1 else float("nan")
        return {"steps": steps, "repeats": repeats, "with_hooks_ms_per_step": round(_median(w) * 1e3, 4),
                "without_hooks_ms_per_step": round(_median(wo) * 1e3, 4),
                "difference_us_per_step": round((_median(w) - _median(wo)) * 1e6, 2),
                "noise_us_per_step": round(noise * 1e6, 2)}
    finally:
        torch.set_num_threads(threads)


# ==================================================================================================== memory
#: the plans ``bench memory`` checks: (precision, residency, source format)
MEMORY_PLANS = {"bf16-one": ("bf16", "one", "folder"), "fp8-both": ("fp8", "both", "folder"),
                "gguf-q8_0-both": ("gguf", "both", "gguf")}


def _formats_checkpoint(ckpt) -> pathlib.Path:
    """A tiny checkpoint that also holds the single-file and GGUF fixtures (an older cached one may lack them)."""
    ckpt = pathlib.Path(ckpt) if ckpt else tiny_checkpoint()
    if (ckpt / "gguf" / "transformer-Q8_0.gguf").is_file():
        return ckpt
    from ...engine.model.tiny import build_tiny_checkpoint

    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "comfy-h3"
    target = cache / "bench-tiny-h3-formats"
    if not (target / "gguf" / "wide" / "transformer-Q6_K.gguf").is_file():  # written last: a complete build
        build_tiny_checkpoint(target, seed=0)
    return target


def run_memory(ckpt=None, log=print) -> dict:
    """For each plan: what B's actor holds for the tiny model (its own accounting of parameters and buffers), what
    the plan predicted before loading, and the plan at the released model's size (resident weights only; working
    memory is reported apart, it is an estimate and not part of the comparison)."""
    import ray

    from ...cluster import ray_cluster as cl
    from ...engine.model import memory_plan as mp
    from ...engine.executor.executor import BConfig
    from remote_worker.actor import dit_actor_class

    ckpt = _formats_checkpoint(ckpt)
    real = {"folder": mp.real_sources("single_file"), "gguf": mp.real_sources("gguf", "Q8_0")}
    plans, lines = {}, []
    for label, (precision, residency, kind) in MEMORY_PLANS.items():
        sources = ({p: str(ckpt / "gguf" / f"{p}-Q8_0.gguf") for p in ("transformer", "transformer_ref")}
                   if kind == "gguf" else None)
        cfg = dataclasses.asdict(BConfig(str(ckpt), dtype="bfloat16", threads=1, precision=precision,
                                         name=f"h3_dit_bench_memory_{label}_{os.getpid()}"))
        cfg.update(residency=residency, sources=sources)
        actor = dit_actor_class().options(name=cfg["name"], namespace=cfg["namespace"], resources={cl.ROLE_B: 1},
                                          max_restarts=0, runtime_env=_runtime_env()).remote(cfg)
        try:
            report = ray.get(actor.health.remote(), timeout=600)["memory_plan"]
        finally:
            ray.kill(actor, no_restart=True)
        measured = sum(report["measured_bytes"].values())
        planned = int(report["resident_bytes"])
        parts = ("transformer", "transformer_ref") if residency == "both" else ("transformer",)
        rplan = mp.plan_b(real[kind], parts, precision, "bfloat16", "cuda", limit_bytes=10**15)
        plans[label] = {"tiny_measured_bytes": measured, "tiny_planned_bytes": planned,
                        "real_planned_bytes": rplan.resident_bytes}
        lines.append(f"  {label:15} tiny measured {measured:9d} B, planned {planned:9d} B "
                     f"({(planned - measured) / measured * 100:+.2f} %); real {mp.human(rplan.resident_bytes)} "
                     f"+ working {mp.human(rplan.working_bytes)} (estimate, 1344x768x124)")
    ratio = plans["fp8-both"]["real_planned_bytes"] / plans["bf16-one"]["real_planned_bytes"]
    worst = max(abs(v["tiny_planned_bytes"] - v["tiny_measured_bytes"]) / v["tiny_measured_bytes"]
                for v in plans.values())
    lines.append(f"  goals: plan within {GOALS['plan_vs_measured'] * 100:.0f} % of measured: "
                 f"{'met' if worst <= GOALS['plan_vs_measured'] else 'NOT met'} (worst {worst * 100:.2f} %); "
                 f"real fp8-both / bf16-one = {ratio:.3f} (goal <= {GOALS['fp8_both_vs_bf16_one']}): "
                 f"{'met' if ratio <= GOALS['fp8_both_vs_bf16_one'] else 'NOT met'}")
    log("memory plans (B's transformer partitions):\n" + "\n".join(lines))
    return {"plans": plans}


# ==================================================================================================== decode
#: the bench's video VAE: the tiny checkpoint's encoder, a ViT decoder wide and deep enough that one clip takes about a
#: second on one CPU thread at DECODE_CANVAS (the released decoder is 36 layers x 2048; the tiny one 1 x 16)
DECODE_VAE = {"decoder_num_layers": 4, "decoder_num_attention_heads": 16, "decoder_attention_head_dim": 64,
              "decoder_ffn_mult": 4}
DECODE_VAE_QUICK = {"decoder_num_layers": 1, "decoder_num_attention_heads": 4, "decoder_attention_head_dim": 32,
                    "decoder_ffn_mult": 2}
DECODE_CANVAS = (128, 128)


def decode_checkpoint(quick: bool = False) -> pathlib.Path:
    """The tiny checkpoint with its ``vae/`` replaced by a larger random ``AutoencoderKLMiniMaxH3`` (same encoder and
    latent statistics, the decoder of ``DECODE_VAE``); every other component is the tiny one's, copied. Built once."""
    import shutil

    from diffusers import AutoencoderKLMiniMaxH3

    tiny = tiny_checkpoint()
    spec = DECODE_VAE_QUICK if quick else DECODE_VAE
    tag = "-".join(f"{v}" for v in spec.values())
    target = tiny.parent / f"bench-decode-h3-{tag}"
    if (target / ".complete").is_file():
        return target
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=tiny.parent))
    for item in tiny.iterdir():  # copies: B refuses component folders that resolve outside the model folder
        if item.name not in ("vae", ".complete"):
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
    config = {k: v for k, v in json.loads((tiny / "vae" / "config.json").read_text()).items()
              if not k.startswith("_")}
    config.update(spec)
    import torch

    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3(**config).eval()
    vae.save_pretrained(str(tmp / "vae"))
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_decode(frames: tuple[int, ...] = (124, 345), repeats: int = 2, quick: bool = False, log=print) -> dict:
    """Per frame count: one request encoded and denoised once, then its decode timed ``repeats`` times by A alone and
    split (A+B), alternating, after one unmeasured round of each (it measures both sides' clip times)."""
    import numpy as np

    from ...engine.executor.executor import BConfig, H3Executor, SideConfig, Timeouts
    from ...engine.contract.request import H3Request

    ckpt = decode_checkpoint(quick)
    spec = DECODE_VAE_QUICK if quick else DECODE_VAE
    height, width = (64, 64) if quick else DECODE_CANVAS
    log(f"decode: a larger random video VAE for this bench (diffusers' AutoencoderKLMiniMaxH3, random weights, ViT "
        f"decoder {spec['decoder_num_layers']} layers x {spec['decoder_num_attention_heads'] * spec['decoder_attention_head_dim']}"
        f" wide; the tiny model's decoder is 1 x 16), so the decode is compute-bound like the released one; "
        f"canvas {width}x{height}, each actor on one CPU thread, fp32")
    tag = f"decode_{os.getpid()}"
    ex = H3Executor(SideConfig(str(ckpt), dtype="float32", threads=1),
                    BConfig(str(ckpt), dtype="float32", threads=1, name=f"h3_dit_bench_{tag}"),
                    timeouts=Timeouts(start=600, health=30, encode=300, handoff=300, stall=300, decode=600,
                                      poll=0.05), a_name=f"h3_enc_bench_{tag}")
    out: dict = {"frames": {}}
    detail: dict = {}
    try:
        ex.start()
        import psutil

        health = ex.check_health()
        procs = {side: psutil.Process(health[side]["pid"]) for side in ("A", "B")}  # both on this machine

        def cpu() -> dict:
            return {side: sum(p.cpu_times()[:2]) for side, p in procs.items()}

        for n in frames:
            req = H3Request(prompt="bench decode: a robot dances while a piano plays", height=height, width=width,
                            num_frames=n, steps=2, seed=4242, request_id=f"bench-decode-{n}-{os.getpid()}")
            den = ex.denoise(ex.encode(req))
            times = {"A": [], "A+B": []}
            cpu_s = {"A": [], "A+B": []}  # CPU seconds of the actors' processes: the wall time with a free core each
            last = {}
            for rnd in range(repeats + 1):
                for mode in ("A", "A+B"):
                    c0, t0 = cpu(), time.perf_counter()
                    media, recs = ex.decode(den, decode_on=mode)
                    wall, c1 = time.perf_counter() - t0, cpu()
                    if rnd:
                        times[mode].append(wall)
                        cpu_s[mode].append(max(c1[k] - c0[k] for k in c0))
                    last[mode] = (media, recs)
            a_only, split = round(_median(times["A"]), 4), round(_median(times["A+B"]), 4)
            out["frames"][str(n)] = {"a_only_s": a_only, "split_s": split, "ratio": round(split / a_only, 3)}
            recs = last["A+B"][1]
            a_rec = next(r for r in recs if r.stage == "decode" and r.machine == "A")
            b_rec = next((r for r in recs if r.stage == "decode" and r.machine == "B"), None)
            got = a_rec.bytes.get("b_frames", 0)
            hand = a_rec.fetch_s + a_rec.materialize_s
            detail[str(n)] = {
                "clips": a_rec.info.get("clips"), "b_clips": a_rec.info.get("b_clips"),
                "a_clip_s": round(ex.clip_clock.clip_s("A", height, width) or 0, 4),
                "b_clip_s": round(ex.clip_clock.clip_s("B", height, width) or 0, 4),
                "b_frames_bytes": got, "b_frames_fetch_s": round(a_rec.fetch_s, 4),
                "b_frames_materialize_s": round(a_rec.materialize_s, 5),
                "b_frames_wait_s": round(a_rec.producer_wait_s, 4),
                "b_frames_mb_per_s": round(got / hand / 1e6, 1) if hand > 0 and got else None,
                "b_compute_s": round(b_rec.compute_s, 3) if b_rec else None,
                "identical": bool(np.array_equal(last["A"][0].frames, last["A+B"][0].frames)
                                  and np.array_equal(last["A"][0].audio, last["A+B"][0].audio)),
                "note": a_rec.note, "load_average": round(os.getloadavg()[0], 2),
                "cpu_a_only_s": round(_median(cpu_s["A"]), 3), "cpu_split_max_side_s": round(_median(cpu_s["A+B"]), 3),
                "cpu_ratio": round(_median(cpu_s["A+B"]) / _median(cpu_s["A"]), 3),
                "a_alone_clip_s": round(_median(times["A"]) / (a_rec.info.get("clips") or 1), 4),
            }
            del den
        lines = [f"  {'frames':>6} {'clips':>5} {'B clips':>8} {'A only s':>9} {'split s':>8} {'ratio':>6} {'goal':>5}"
                 f" {'A s/clip':>8} {'B s/clip':>8} {'B->A frames':>12} {'fetch s':>8} {'MB/s':>7} identical"]
        for n, row in out["frames"].items():
            d = detail[n]
            goal = DECODE_GOALS.get(n)
            lines.append(f"  {n:>6} {d['clips']:5d} {str(d['b_clips']):>8} {row['a_only_s']:9.3f} {row['split_s']:8.3f}"
                         f" {row['ratio']:6.3f} {goal if goal else '-':>5} {d['a_clip_s']:8.3f} {d['b_clip_s']:8.3f}"
                         f" {d['b_frames_bytes'] / 2**20:9.1f} MiB {d['b_frames_fetch_s']:8.4f}"
                         f" {d['b_frames_mb_per_s'] or 0:7.0f} {d['identical']}")
        met = all(row["ratio"] <= DECODE_GOALS.get(n, 1.0) for n, row in out["frames"].items())
        lines.append(f"  goal (ratio <= {', '.join(f'{g} at {n}' for n, g in DECODE_GOALS.items())}): "
                     f"{'met' if met else 'NOT met'}; A-only decode >= 5 s at 124 frames: "
                     f"{'yes' if out['frames'].get('124', {}).get('a_only_s', 0) >= 5 else 'no'}")
        for n, d in detail.items():
            lines.append(f"  {n}: {d['note']}; A alone {d['a_alone_clip_s']:.3f} s/clip (whole decode / clips), "
                         f"load average {d['load_average']} on {os.cpu_count()} CPUs; CPU seconds of the busier "
                         f"actor: A alone {d['cpu_a_only_s']:.2f} s, split {d['cpu_split_max_side_s']:.2f} s "
                         f"(ratio {d['cpu_ratio']:.3f}: the split's ratio with a free core per side)")
        log("decode, A alone vs split with B (medians of %d):\n" % repeats + "\n".join(lines))
        out["_detail"] = detail
        return out
    finally:
        ex.shutdown(kill_b=True)


DECODE_GOALS = {"124": 0.6, "345": 0.55}


# ==================================================================================================== CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m comfy_h3_nodes bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)

    def common(sp):
        sp.add_argument("--json", action="store_true", help="print one JSON object as the last line")
        sp.add_argument("--quick", action="store_true", help="tiny counts (the smoke test)")
        sp.add_argument("--object-store-mb", type=int, default=1024, help="object store per node (embedded cluster)")
        return sp

    h = common(sub.add_parser("handoff", help="A<->B payload hand-off vs Ray's raw floor and memcpy"))
    h.add_argument("--repeats", type=int, default=None, help="measured repeats per shape (default 10; quick 2)")
    h.add_argument("--warmup", type=int, default=None, help="unmeasured repeats first (default 2; quick 1)")
    h.add_argument("--only", default="", help="comma-separated substrings: run only matching shapes")
    h.add_argument("--tensor-transport", action="store_true",
                   help="also measure Ray's direct tensor transport (gloo) for the same byte counts")
    pl = common(sub.add_parser("pipeline", help="N requests through the executor, pipelined vs sequential"))
    pl.add_argument("--requests", type=int, default=None, help="requests (default 8; quick 3)")
    pl.add_argument("--in-flight", default=None, help="comma-separated max_in_flight values (default 2,3; quick 2)")
    pl.add_argument("--stages", default=None,
                    help="synthetic seconds, e.g. encode=0.2,denoise=0.4,decode=0.15 (quick: a quarter of those)")
    pl.add_argument("--ckpt", default=None, help="tiny checkpoint folder (built there if missing)")
    so = common(sub.add_parser("step-overhead", help="per-step control overhead on B"))
    so.add_argument("--iterations", type=int, default=None, help="steps timed (default 10000; quick 2000)")
    so.add_argument("--no-model", action="store_true", help="skip the tiny-model with/without hooks comparison")
    so.add_argument("--ckpt", default=None)
    w = common(sub.add_parser("warm", help="first vs second request: the second loads nothing"))
    w.add_argument("--ckpt", default=None)
    m = common(sub.add_parser("memory", help="memory plan vs what B holds, tiny and at real size"))
    m.add_argument("--ckpt", default=None, help="tiny checkpoint folder (built with its format fixtures if missing)")
    d = common(sub.add_parser("decode", help="video decode by A alone vs split with B, at 124 and 345 frames"))
    d.add_argument("--repeats", type=int, default=None, help="measured rounds (default 2; quick 1)")
    d.add_argument("--frames", default="124,345", help="comma-separated frame counts (17n+5)")
    bt = common(sub.add_parser("batch", help="N prompts in one graph run vs N graph runs (headless runner)"))
    bt.add_argument("--requests", type=int, default=None, help="prompts (default 8; quick 3)")
    po = common(sub.add_parser("pool", help="B-bound requests through a pool of 1, then 2 DiT workers (bench_pool)"))
    po.add_argument("--requests", type=int, default=None, help="requests per run (default 8; quick 3)")
    po.add_argument("--ckpt", default=None)
    a = common(sub.add_parser("all", help="every bench, one cluster"))
    a.add_argument("--repeats", type=int, default=None)
    a.add_argument("--requests", type=int, default=None)
    a.add_argument("--ckpt", default=None)
    return p


def _stages(text: str | None, quick: bool) -> dict:
    if text:
        out = {}
        for part in text.split(","):
            k, _, v = part.partition("=")
            if k.strip() not in ("encode", "denoise", "decode"):
                raise SystemExit(f"--stages: unknown stage {k!r}; use encode, denoise, decode")
            out[k.strip()] = float(v)
        return out
    return {k: v / 4 for k, v in DEFAULT_SYNTHETIC.items()} if quick else dict(DEFAULT_SYNTHETIC)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    quick = args.quick
    log = (lambda s: print(s, flush=True))
    result: dict = {}
    verb = args.verb
    if verb == "pool":  # its own three-node cluster: comfy_h3_nodes/bench_pool.py
        from .pool import main_json, run_pool

        res = run_pool(args.requests or (3 if quick else 8), ckpt=args.ckpt and tiny_checkpoint(args.ckpt), log=log)
        if args.json:
            print(main_json(res), flush=True)
        return 0
    needs_cluster = verb in ("handoff", "pipeline", "warm", "memory", "decode", "all")
    with (cluster(args.object_store_mb) if needs_cluster else contextlib.nullcontext()):
        if verb in ("handoff", "all"):
            repeats = args.repeats or (2 if quick else 10)
            warmup = getattr(args, "warmup", None)
            warmup = warmup if warmup is not None else (1 if quick else 2)
            shapes = handoff_shapes()
            only = [s for s in (getattr(args, "only", "") or "").split(",") if s]
            if only:
                shapes = [s for s in shapes if any(o in s["name"] for o in only)]
            result["handoff"] = run_handoff(repeats, warmup, shapes, getattr(args, "tensor_transport", False), log)
        if verb in ("pipeline", "all"):
            n = args.requests or (3 if quick else 8)
            inflight = getattr(args, "in_flight", None) or ("2" if quick else "2,3")
            result["pipeline"] = run_pipeline(n, tuple(int(x) for x in inflight.split(",")),
                                              _stages(getattr(args, "stages", None), quick), args.ckpt and
                                              tiny_checkpoint(args.ckpt), log)
        if verb in ("step-overhead", "all"):
            its = getattr(args, "iterations", None) or (2000 if quick else 10_000)
            result["step-overhead"] = run_step_overhead(
                its, model_steps=4 if quick else 20, model_repeats=2 if quick else 3,
                ckpt=args.ckpt and tiny_checkpoint(args.ckpt), with_model=not getattr(args, "no_model", False),
                log=log)
        if verb in ("warm", "all"):
            result["warm"] = run_warm(args.ckpt and tiny_checkpoint(args.ckpt), log)
        if verb == "memory":
            result["memory"] = run_memory(args.ckpt, log)
        if verb == "decode":
            result["decode"] = run_decode(tuple(int(x) for x in args.frames.split(",")),
                                          args.repeats or (1 if quick else 2), quick, log)
    if verb == "batch":  # the runner starts and joins its own embedded cluster, as `run` does
        from . import batch as bench_batch
        from .. import runner

        try:
            result["batch"] = bench_batch.run_batch(args.requests or (3 if quick else 8), log=log)
        finally:
            runner._shutdown_embedded()
        if args.json:
            print(json.dumps(result["batch"]), flush=True)  # exactly the keys
        return 0
    if verb == "decode":
        result["decode"].pop("_detail", None)
        if args.json:
            print(json.dumps(result["decode"]), flush=True)  # exactly {"frames": {"124": {...}, "345": {...}}}
        return 0
    if args.json and verb == "memory":
        print(json.dumps(result["memory"]), flush=True)  # exactly {"plans": {...}}, in the key order
        return 0
    if args.json:
        payload = result[verb] if verb != "all" else {"bench": "all", **result}
        payload["quick"] = quick
        print(json.dumps(payload, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
