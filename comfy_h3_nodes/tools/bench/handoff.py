"""``bench handoff``: the A->B and B->A payloads at their real shapes (shared/design.md section 2), received by an
actor on the other node exactly as the A/B actors receive them, next to Ray's own floor for the same bytes (one plain
uint8 numpy array, same path) and a memcpy of the same bytes; ``--tensor-transport`` adds Ray's direct tensor
transport (gloo collective on CPU)."""

from __future__ import annotations

import time
import warnings

import numpy as np
import ray
import torch
from ray.experimental.collective import create_collective_group

from ...cluster import ray_cluster as cl
from ...engine.contract import wire
from ...engine.executor.handoff import materialize, receive
from ...engine.process import runtime_env, setup_process
from .common import GOALS, _median, _ms


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
    return wire.EncodedRequest(rid, spec["workflow"], h, w, f, wire.WireTensor.from_torch(embeds),
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
        setup_process(threads)
        self.role = role
        self.node_ip = ray.util.get_node_ip_address()
        self.payloads: dict = {}
        self.raws: dict = {}
        self.dst: dict = {}

    def ip(self) -> str:
        return self.node_ip

    def prepare(self, spec: dict) -> dict:
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
        obj, wait_s, fetch_s = receive(refs[0], 120.0, self.role, "bench", name)
        out = {"producer_wait_s": wait_s, "fetch_s": fetch_s}
        if what == "payload":
            out["materialize_s"] = materialize(obj)
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
    remote = ray.remote(cls) if not hasattr(cls, "remote") else cls
    a = remote.options(resources={cl.ROLE_A: 1}, runtime_env=runtime_env(), **opts).remote("A")
    b = remote.options(resources={cl.ROLE_B: 1}, runtime_env=runtime_env(), **opts).remote("B")
    topo = cl.validate_topology()
    ips = ray.get([a.ip.remote(), b.ip.remote()], timeout=300)
    if ips != [topo.a.ip, topo.b.ip]:
        raise RuntimeError(f"bench endpoints landed on {ips}, expected A={topo.a.ip} B={topo.b.ip}")
    return a, b


def run_handoff(repeats: int = 10, warmup: int = 2, shapes: list[dict] | None = None,
                tensor_transport: bool = False, log=print) -> dict:
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
        torch.set_num_threads(1)

        self.node_ip = ray.util.get_node_ip_address()
        self.tensors: dict = {}

    def ip(self) -> str:
        return self.node_ip

    def make(self, nbytes: int) -> int:
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
    try:
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
