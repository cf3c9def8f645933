"""What the A and B actors share: process setup, bounded receipt of a hand-off, health facts.

Everything here runs inside a Ray worker process. Environment choices (attention backend, profiling, CPU threads)
reach the worker through ``runtime_env`` before its first import, and are applied again in ``setup_process``.
"""

from __future__ import annotations

import logging
import os
import pathlib
import socket
import time
from importlib import metadata

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from .. import PACK_ROOT
from .contract import wire

log = logging.getLogger("comfy_h3")

#: Environment variables the executor forwards to both actors (read there before any model import).
FORWARDED_ENV = ("H3_PROFILE", "H3_MAX_PAYLOAD_BYTES", "DIFFUSERS_ATTN_BACKEND", "HF_HUB_OFFLINE", "H3_CACHE",
                 "OMP_NUM_THREADS", "H3_LOG_LEVEL", "H3_MEMORY_LIMIT_BYTES", "H3_MEMORY_MARGIN")


class HandoffError(RuntimeError):
    """A hand-off that did not arrive: the message names the receiving machine, the stage and the request."""


def setup_process(threads: int | None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=os.environ.get("H3_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def profiling() -> bool:
    return os.environ.get("H3_PROFILE", "") not in ("", "0", "false")


def unwrap_ray_error(exc: BaseException) -> BaseException:
    """The user's exception inside a RayTaskError, when there is one."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def receive(ref, timeout: float, machine: str, stage: str, request_id: str):
    """Wait for the producer, then fetch; returns ``(payload, producer_wait_s, fetch_s)``.

    Both waits are bounded by ``timeout``; a failure of the producer is re-raised with the stage named.
    """
    import ray

    t0 = time.perf_counter()
    ready, _ = ray.wait([ref], timeout=timeout, fetch_local=False)
    t1 = time.perf_counter()
    if not ready:
        raise HandoffError(
            f"{machine} waited {timeout:.0f} s for the {stage} payload of request {request_id} and the producer "
            "never finished; check the other machine's health."
        )
    try:
        payload = ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError as exc:
        raise HandoffError(
            f"{machine} could not fetch the {stage} payload of request {request_id} within {timeout:.0f} s; "
            "the link between the machines is down or saturated."
        ) from exc
    except ray.exceptions.RayTaskError as exc:
        inner = unwrap_ray_error(exc)
        raise HandoffError(f"the producer of the {stage} payload of request {request_id} failed: {inner}") from inner
    except ray.exceptions.RayError as exc:
        raise HandoffError(
            f"{machine} lost the {stage} payload of request {request_id}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    return payload, t1 - t0, time.perf_counter() - t1


class ShareReceiver:
    """A's side of B's split-decode share: ``refs`` are the share call's returns (one ``wire.DecodedClip`` per clip
    ``start``, ``start + 1``, ..., then B's decode record). Called with a clip index (``split_decode.serve_clips``
    asks for every clip in order), it returns B's clip as a tensor, or ``None`` for A to decode that clip itself:
    for clips before ``start`` (A's share) and, once B's share failed (B's actor died, B was cancelled, a bounded
    wait ran out), for every clip of it; ``failure`` then says why. B's record lands in ``record``; the producer
    wait, fetch and materialisation of B's frames are timed apart."""

    def __init__(self, refs: list, start: int, height: int, width: int, timeout: float, request_id: str,
                 should_cancel=None, poll: float = 0.05):
        self.clip_refs, self.record_ref = list(refs[:-1]), refs[-1]
        self.start, self.height, self.width = start, height, width
        self.timeout, self.request_id, self.should_cancel, self.poll = timeout, request_id, should_cancel, poll
        self.record = None
        self.failure = ""
        self.producer_wait_s = self.fetch_s = self.materialize_s = 0.0
        self.bytes = 0
        self.received: list[int] = []

    def _fail(self, why: str) -> None:
        self.failure = why
        log.warning("[%s] B's decode share is lost (%s); A decodes clips %d-%d itself", self.request_id, why,
                    self.start, self.start + len(self.clip_refs) - 1)

    def _await_b(self) -> bool:
        import ray

        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                ready, _ = ray.wait([self.record_ref], timeout=self.poll, fetch_local=False)
                if ready:
                    break
                if self.should_cancel is not None and self.should_cancel():
                    return False  # the blend raises the cancel at its next clip
                if time.monotonic() > deadline:
                    self._fail(f"B did not finish its share within {self.timeout:.0f} s")
                    return False
            self.record = ray.get(self.record_ref, timeout=self.timeout)
        except ray.exceptions.RayError as exc:
            inner = unwrap_ray_error(exc)
            self._fail(f"{type(exc).__name__}: {str(inner).strip().splitlines()[0] if str(inner).strip() else ''}")
            return False
        finally:
            self.producer_wait_s += time.perf_counter() - t0
        return True

    def __call__(self, index: int):
        import ray

        if index < self.start or self.failure:
            return None
        if self.record is None and not self._await_b():
            return None
        t0 = time.perf_counter()
        try:
            clip = ray.get(self.clip_refs[index - self.start], timeout=self.timeout)
        except ray.exceptions.RayError as exc:  # the object was lost with B's node
            self._fail(f"clip {index}: {type(exc).__name__}")
            return None
        finally:
            self.fetch_s += time.perf_counter() - t0
        clip.validate(self.height, self.width)
        if clip.index != index or clip.request_id != self.request_id:
            raise HandoffError(f"A asked B's share for clip {index} of request {self.request_id} and received clip "
                               f"{clip.index} of request {clip.request_id}.")
        t1 = time.perf_counter()
        tensor = clip.frames.to_torch()
        self.materialize_s += time.perf_counter() - t1
        self.bytes += clip.nbytes
        self.received.append(index)
        self.clip_refs[index - self.start] = None  # A holds the frames now; B's copy can go
        return tensor


def synthetic_delay(config: dict, stage: str) -> float:
    """Sleep for the benchmark-only synthetic time of ``stage`` (config key ``synthetic_stages``); returns it.

    ``python -m comfy_h3_nodes bench pipeline`` uses it to give the stages known, balanced costs; it is 0 (no
    sleep) in every normal run.
    """
    seconds = float((config.get("synthetic_stages") or {}).get(stage, 0.0))
    if seconds > 0:
        time.sleep(seconds)
    return max(seconds, 0.0)


def materialize(payload) -> float:
    """Turn every wire tensor into a torch view (what the blocks will read); returns the seconds it took."""
    t0 = time.perf_counter()
    for t in payload.tensors().values():
        t.to_torch()
    return time.perf_counter() - t0


PYPROJECT = PACK_ROOT / "pyproject.toml"


def pack_version(pyproject: pathlib.Path = PYPROJECT) -> str:
    """comfy-h3's version: from the checkout's ``pyproject.toml`` when the code runs from one (a git clone into
    ``custom_nodes/`` has no installed-package metadata, and an editable install's metadata can be stale), else from
    the installed package's metadata."""
    try:
        text = pyproject.read_text()
    except OSError:
        text = ""
    if text:
        project = tomllib.loads(text).get("project", {})
        if project.get("name") == "comfy-h3" and project.get("version"):
            return str(project["version"])
    try:
        return metadata.version("comfy-h3")
    except metadata.PackageNotFoundError:
        return "unknown (no pyproject.toml beside the code and no installed comfy-h3)"


def versions() -> dict[str, str]:
    def v(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    return {"comfy-h3": pack_version(), "diffusers": v("diffusers"), "torch": v("torch"),
            "transformers": v("transformers"), "ray": v("ray"), "wire_schema": str(wire.SCHEMA_VERSION)}


def memory_info(device: str) -> dict:
    info = {}
    try:
        import psutil

        info["rss_mb"] = round(psutil.Process().memory_info().rss / 2**20, 1)
        info["host_available_mb"] = round(psutil.virtual_memory().available / 2**20, 1)
    except Exception:  # noqa: BLE001 - psutil is optional
        pass
    if device.startswith("cuda"):
        import torch

        info["cuda_allocated_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        info["cuda_total_mb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**20, 1)
    return info


class ResidentActorMixin:
    """Cheap methods both resident actors share (``side`` and ``node_ip`` are set in their ``__init__``). They run in
    Ray's default concurrency group, apart from the encode/decode/denoise groups, so they answer during a request."""

    def load_records(self) -> list:
        return list(self.side.load_records)

    def ping(self) -> str:
        return self.node_ip

    def clock(self) -> float:
        return time.time()


def base_health(role: str, side, started: float) -> dict:
    import ray

    return {
        "role": role,
        "ok": True,
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "device": side.device,
        "dtype": side.dtype,
        "attention_backend": side.attention_backend,
        "model_dir": str(side.model_dir),
        "resident": side.resident(),
        "versions": versions(),
        "memory": memory_info(side.device),
        "uptime_s": round(time.time() - started, 1),
        "loads": len(side.load_records),
    }
