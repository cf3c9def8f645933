"""What the resident actors' processes share: their environment, set up, health facts and optional profiling.

Every actor runs in a Ray worker process of its own. Environment choices (attention backend, profiling, CPU threads,
payload caps) reach it through :func:`runtime_env` before its first import, and are applied again in
:func:`setup_process`. :func:`base_health` is the part of both actors' ``health()`` that says where they run, what
they hold and which versions they speak.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import psutil
import ray
import torch

from .contract.versions import PACK_ROOT, versions

log = logging.getLogger("comfy_h3")

#: Environment variables forwarded to every actor (read there before any model import).
FORWARDED_ENV = ("H3_PROFILE", "H3_MAX_PAYLOAD_BYTES", "DIFFUSERS_ATTN_BACKEND", "HF_HUB_OFFLINE", "H3_CACHE",
                 "OMP_NUM_THREADS", "H3_LOG_LEVEL", "H3_MEMORY_LIMIT_BYTES", "H3_MEMORY_MARGIN")


def runtime_env(extra: dict | None = None) -> dict:
    """The ``runtime_env`` of an actor this process starts: the pack importable (``PYTHONPATH``), the forwarded
    environment of this process, then ``extra``. Ray does not pass the driver's environment on by itself."""
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra or {})
    pypath = os.environ.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACK_ROOT), pypath) if p)
    return {"env_vars": env}


def setup_process(threads: int | None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=os.environ.get("H3_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    if threads:
        torch.set_num_threads(int(threads))


def profiling() -> bool:
    return os.environ.get("H3_PROFILE", "") not in ("", "0", "false")


def memory_info(device: str) -> dict:
    info = {"rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
            "host_available_mb": round(psutil.virtual_memory().available / 2**20, 1)}
    if device.startswith("cuda"):
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
        "load_s": round(sum(r.seconds for r in side.load_records), 3),  # this process's loads, its start's among them
    }


class _Profile:
    def __init__(self):
        self.path = None


class maybe_profile:
    """With ``H3_PROFILE=1`` (forwarded to the actors before their imports), a torch.profiler Chrome trace of the
    wrapped stage is written to ``H3_PROFILE_DIR`` (default ``/tmp/h3_profiles``); otherwise nothing happens."""

    def __init__(self, label: str, cuda: bool):
        self.label, self.cuda, self.result, self._prof = label, cuda, _Profile(), None

    def __enter__(self):
        if not profiling():
            return self.result
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = torch.profiler.profile(activities=acts)
        self._prof.__enter__()
        return self.result

    def __exit__(self, *exc):
        if self._prof is None:
            return False
        self._prof.__exit__(*exc)
        if exc[0] is None:
            folder = os.environ.get("H3_PROFILE_DIR", "/tmp/h3_profiles")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{self.label}.json")
            self._prof.export_chrome_trace(path)
            self.result.path = path
        return False
