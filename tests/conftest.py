"""Shared fixtures: one tiny checkpoint and (lazily) one real two-node Ray cluster per test session."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPT = "a small robot dances on a table while a piano plays"


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    from comfy_h3_nodes.engine.model.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-h3", seed=0)


@pytest.fixture(scope="session")
def tiny_fasth3(tmp_path_factory):
    """The tiny checkpoint in FastH3's layout (VSA gates in every block, a ``vsa`` config block; tiny_fasth3.py)."""
    from comfy_h3_nodes.engine.model.tiny_fasth3 import build_tiny_fasth3

    return build_tiny_fasth3(tmp_path_factory.mktemp("ckpt-fasth3") / "tiny-h3-fasth3", seed=0)


@pytest.fixture(scope="session", autouse=True)
def _pin_threads():
    import torch

    torch.set_num_threads(1)  # exactness: the same CPU thread count as the actors (design.md pitfall 2)


@pytest.fixture(scope="session")
def media():
    """Deterministic keyframes, references and an audio clip at the tiny audio VAE's rate (160 Hz)."""
    from PIL import Image

    from comfy_h3_nodes.engine.contract.request import AudioClip

    rng = np.random.default_rng(1234)
    return {
        "first": Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)),
        "last": Image.fromarray(rng.integers(0, 255, (48, 80, 3), dtype=np.uint8)),
        "ref": Image.fromarray(rng.integers(0, 255, (72, 128, 3), dtype=np.uint8)),
        "audio": AudioClip(rng.uniform(-0.5, 0.5, (2, 480)).astype(np.float32), 160),
    }


def workflow_request(workflow: str, media, **kw):
    """An H3Request of the workflow, plus the matching kwargs of diffusers' single-process pipeline."""
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3AudioReference, MiniMaxH3ImageReference

    from comfy_h3_nodes.engine.contract.request import H3Request
    import torch

    base = dict(prompt=PROMPT, height=64, width=64, num_frames=124, steps=3, seed=7)
    base.update(kw)
    if workflow == "t2va":
        return H3Request(**base), {}
    if workflow == "fl2va":
        return (H3Request(first_image=media["first"], last_image=media["last"], **base),
                {"image": media["first"], "last_image": media["last"]})
    audio = media["audio"]
    return (H3Request(reference_images=[media["ref"]], reference_audio=audio, **base),
            {"references": [MiniMaxH3ImageReference(image=media["ref"]),
                            MiniMaxH3AudioReference(audio=torch.from_numpy(audio.waveform),
                                                    sample_rate=audio.sample_rate)]})


def call_of(req, payload=None):
    """The denoise call of a request (its seed, steps, adapters) for its encoded ``payload``."""
    rid = payload.request_id if payload is not None else req.request_id
    return req.params().call(rid, rid)


def denoise(b, a, req, **kw):
    """``req`` encoded on A side ``a`` and denoised on B side ``b`` (in this process): B's result."""
    payload = a.encode(req)
    return b.denoise(payload, call_of(req, payload), **kw)


def encode_each(a, workflows, media) -> dict:
    """Per workflow: its request encoded on A side ``a`` and its denoise call (``b.denoise(*out[wf])``)."""
    out = {}
    for wf in workflows:
        req = workflow_request(wf, media)[0]
        payload = a.encode(req)
        out[wf] = (payload, call_of(req, payload))
    return out


def denoise_each(ckpt, encoded: dict, dtype: str = "bfloat16") -> dict:
    """Per workflow: the latents a B side on the diffusers folder ``ckpt`` (in this process) makes of ``encoded``."""
    from remote_worker.b_side import BSide  # B's side: only the tests that denoise in this process load it

    b = BSide(ckpt, dtype=dtype)
    return {wf: b.denoise(*enc).latents for wf, enc in encoded.items()}


def add_b2(cluster, ip: str):
    """A second B node for a module's tests (``yield from``): removed afterwards unless a test removed it."""
    node = cluster.add_b_node(ip, num_cpus=2)
    yield node
    try:
        cluster.remove_node(node)
    except Exception:  # noqa: BLE001 - a test removed it already (the worker that leaves)
        pass


_REFERENCE_CACHE: dict = {}


def single_process_reference(ckpt, workflow: str, media, dtype: str = "float32", **kw):
    """diffusers' own single-process MiniMaxH3 pipeline output (np frames, audio tensor), cached per case."""
    key = (str(ckpt), workflow, dtype, tuple(sorted(kw.items())))
    if key in _REFERENCE_CACHE:
        return _REFERENCE_CACHE[key]
    import torch
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    from comfy_h3_nodes.engine.model.compat import ensure_processor_compat

    ensure_processor_compat()
    req, extra = workflow_request(workflow, media, **kw)
    pipe = MiniMaxH3Blocks().get_workflow(workflow).init_pipeline(str(ckpt))
    pipe.load_components(dtype=getattr(torch, dtype))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=req.prompt, height=req.height, width=req.width, num_frames=req.num_frames,
               num_inference_steps=req.steps, generator=torch.Generator("cpu").manual_seed(req.seed),
               output_type="np", output=["videos", "audio"], **extra)
    _REFERENCE_CACHE[key] = out
    return out


def plasma_objects() -> int:
    """Objects in the object stores of *this* session's cluster (the address is explicit: other Ray clusters may run
    on the machine, and Ray's default picks the most recent one)."""
    import ray
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    line = next(l for l in text.splitlines() if "Plasma memory usage" in l)
    return int(line.split(",")[1].split()[0])


def wait_store_empty(timeout: float = 15.0) -> int:
    """Plasma object count once it reaches 0 (Ray frees objects asynchronously after the last ref goes), or the
    count still there at the deadline."""
    import gc
    import time

    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        n = plasma_objects()
        if n == 0 or time.monotonic() > deadline:
            return n
        time.sleep(0.25)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real two-node Ray cluster (A at 127.0.0.2, B at 127.0.0.3), one per session."""
    import comfy_h3_nodes.placement  # noqa: F401 - the composition root: registers the actor classes executors place
    from comfy_h3_nodes.cluster.ray_cluster import EmbeddedCluster

    cluster = EmbeddedCluster(object_store_mb=256, num_cpus=4,
                              system_config={"health_check_period_ms": 1000, "health_check_failure_threshold": 2})
    cluster.start()
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def local_host(ray_cluster):
    """This process as ComfyUI's A: joined to the session cluster as its ``local`` one, with a fresh local host
    (events, interrupt flag, output folder) for the module."""
    from comfy_h3_nodes.engine import session
    from comfy_h3_nodes.host import LocalHost, set_host

    session.adopt_cluster(ray_cluster.address)
    h = LocalHost()
    set_host(h)
    return h


@pytest.fixture(scope="session")
def executor(ray_cluster, tiny_ckpt):
    """Resident A and B actors on the session cluster (fp32, one CPU thread each, short timeouts)."""
    from comfy_h3_nodes import placement
    from comfy_h3_nodes.engine.executor import H3Executor
    from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts

    ex = H3Executor(SideConfig(str(tiny_ckpt), dtype="float32", threads=1),
                    BConfig(str(tiny_ckpt), dtype="float32", threads=1, name="h3_dit_test"),
                    max_in_flight=2, timeouts=Timeouts(start=120, health=10, encode=60, handoff=60, stall=60,
                                                       decode=60, poll=0.05),
                    actors=placement.ACTORS)
    ex.start()
    yield ex
    ex.shutdown(kill_b=True)
