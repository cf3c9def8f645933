"""Ready for the GPU it is for (issue #40): the CUDA paths run here, on a CPU-only torch, with tensors on a ``cuda``
device (:mod:`fake_cuda`: real values, a device mismatch or a host read of a device tensor raises) and a stand-in
``torch.cuda`` that counts synchronizes, cache flushes and clock reads. Each test names the point of the issue it
proves; where the point was found to hold, its docstring says why.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import subprocess
import sys
import threading
import types
import weakref

import pytest
import torch

from comfy_h3_nodes.engine.contract import wire
from comfy_h3_nodes.engine.model import backends, memory_plan, parallel, preview, split_decode, vsa
from comfy_h3_nodes.engine.model.vsa_kernels import TorchKernel
from fake_cuda import CudaCounts, FakeCuda, stand_in_cuda, unsynced_clock_reads
from remote_worker import warmup
from remote_worker.b_side import BSide

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FACTORS = tuple((0.1 * (c % 3), -0.05 * (c % 5), 0.02 * c) for c in range(24))


@pytest.fixture(scope="module")
def b_side(tiny_ckpt):
    return BSide(tiny_ckpt, dtype="float32", device="cpu")


@contextlib.contextmanager
def on_cuda(side, *modules, counts: CudaCounts | None = None, clock_log: bool = False):
    """``side`` (a BSide or ASide) with ``modules`` of its host moved onto the fake ``cuda`` device for the block,
    then back."""
    counts = counts or CudaCounts()
    with stand_in_cuda(counts, clock_log=clock_log), FakeCuda(log=counts.log if clock_log else None) as fc:
        for name in modules:
            getattr(side._host, name).to("cuda")
        side.device, side._pipes = "cuda", {}
        try:
            yield fc, counts
        finally:
            for name in modules:
                getattr(side._host, name).to("cpu")
            side.device, side._pipes = "cpu", {}


def _request(side, steps: int = 3, preview_spec=None):
    pay = warmup.payload("transformer", side.text_dim, "float32", request_id="cuda-ready")
    return pay, wire.DenoiseCall(pay.request_id, pay.request_id, seed=0, num_inference_steps=steps,
                                 preview=preview_spec)


# ---------------------------------------------------------------------------------------------------- CUDA on CPU
def test_cuda_ready_b_denoise_runs_on_a_cuda_device(b_side):
    """B's denoise with the transformer on ``cuda`` gives the CPU's latents. It failed: ``prompt_embeds`` arrive on
    the host from the wire and diffusers' blocks move the layout and latents to the device, not them."""
    pay, call = _request(b_side)
    ref = b_side.denoise(pay, call).latents.latents.to_torch().clone()
    with on_cuda(b_side, "transformer") as (fc, counts):
        res = b_side.denoise(pay, call)
    assert fc.cuda_ops > 100, "the transformer did not run on the cuda device"
    got = res.latents.latents.to_torch()
    assert got.device.type == "cpu" and torch.allclose(got, ref, atol=1e-5)
    assert counts.syncs >= 2 * len(res.steps)  # each step: the queue drained before its clock starts and ends


def test_cuda_ready_previews_every_method_on_cuda(b_side):
    """Point 2: a live preview (every method: ``latent2rgb`` JPEG, ``latent`` frame for A's tiny decoder) from
    B's CUDA latents. It failed: the factors were made on the CPU (device mismatch) and the latent frame was read
    with ``.numpy()`` on the device."""
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(4 * 2 * 2, 96, generator=g)  # one latent frame group of a 64x64 canvas
    for method in ("latent2rgb", "latent"):
        spec = wire.PreviewSpec(method, FACTORS, (0.1, -0.1, 0.0))
        ref = preview.Previewer(spec, "r").make(0, 3, rows, rows[None], 0.5, condition_rows=0, grid=(1, 4, 4),
                                                patch=(1, 2, 2), step_s=1.0)
        with stand_in_cuda(), FakeCuda():
            got = preview.Previewer(spec, "r").make(0, 3, rows.to("cuda"), rows[None].to("cuda"), 0.5,
                                                    condition_rows=0, grid=(1, 4, 4), patch=(1, 2, 2), step_s=1.0)
        assert (got.width, got.height) == (ref.width, ref.height) and got.jpeg == ref.jpeg
        if method == "latent":
            assert got.latent.shape == ref.latent.shape and (got.latent == ref.latent).all()
    pay, call = _request(b_side, 3, wire.PreviewSpec("latent2rgb", FACTORS, every=1))
    with on_cuda(b_side, "transformer"):
        res = b_side.denoise(pay, call)
    assert res.preview["count"] == 2 and all(s.preview is not None for s in res.steps)


def test_cuda_ready_remote_model_forward_rows_on_cuda(tiny_ckpt):
    """The remote MODEL's forward (``forward_rows``) on ``cuda`` equals the CPU's, each clock read after the queue
    drained. Holds on today's code: every input is moved with ``.to(self.device)``, the output rows copied back with
    ``.cpu()``, and the forward synchronises before its clock is read; this test keeps it so."""
    import test_core_model as core  # noqa: PLC0415 - its context and call builders, so they cannot drift apart
    from comfy_h3_nodes.engine.model.tiny_comfy import fixture  # noqa: PLC0415

    files = {p: str(fixture(tiny_ckpt, f"{p}:pruned_bf16")) for p in ("transformer", "transformer_ref")}
    b = BSide(tiny_ckpt, dtype="float32", residency="one", sources=files)
    ctx = core._context(b)
    call = core._call(ctx)
    ref_v, ref_a, *_ = b.forward_rows(core._tensors(ctx), call)
    counts = CudaCounts()
    with on_cuda(b, "transformer", counts=counts, clock_log=True) as (fc, _):
        v, a, compute_s, *_ = b.forward_rows(core._tensors(ctx), call)
    assert fc.cuda_ops > 50 and v.device.type == "cpu" and compute_s > 0
    assert torch.allclose(v, ref_v, atol=1e-5) and torch.allclose(a, ref_a, atol=1e-5)
    assert unsynced_clock_reads(counts.log, counts.where) == []


def test_cuda_ready_vsa_denoise_on_cuda(tiny_fasth3):
    """FastH3's VSA-H3 attention (torch kernel) inside B's denoise on ``cuda`` equals the CPU run. It failed with
    every CUDA denoise (``prompt_embeds`` left on the host, above); VSA's own code held: the tile geometry is built on
    the device of the positions and the kernel makes its index tensors on ``q.device``."""
    b = BSide(tiny_fasth3, dtype="float32", device="cpu", vsa_kernel="torch")
    steps = b.trained_steps()["transformer"]
    pay, call = _request(b, steps)
    ref = b.denoise(pay, call).latents.latents.to_torch().clone()
    with on_cuda(b, "transformer") as (fc, _):
        got = b.denoise(pay, call).latents.latents.to_torch()
    assert fc.cuda_ops > 100 and torch.allclose(got, ref, atol=1e-5)


def test_cuda_ready_split_decode_and_a_decode_on_cuda(tiny_ckpt, media):
    """A's encode and decode (diffusers' blocks) and a split-decode share with A's models on ``cuda`` give the CPU's
    results, every clock read after a synchronize or a copy to the host. It failed: A's decode got the wire's
    latents on the host while diffusers' decode block makes its statistics on the device; a share's first clip
    started its clock with the latents' normalisation queued. (A's encode held: its output is copied to the host
    for the wire before the clock is read.)"""
    import test_split_decode as tsd  # noqa: PLC0415 - the same latents builder as the split-decode tests
    from comfy_h3_nodes.engine.a_side.side import ASide  # noqa: PLC0415
    from conftest import workflow_request  # noqa: PLC0415

    a = ASide(str(tiny_ckpt), dtype="float32")
    req = workflow_request("fl2va", media)[0]
    ref_enc = a.encode(req).prompt_embeds.to_torch().clone()
    lat = tsd._latents(39)
    ref = a.decode(lat)
    ref_share = a.decode_share(lat, 1, 2)
    counts = CudaCounts()
    with on_cuda(a, "text_encoder", "vae", "audio_vae", counts=counts, clock_log=True) as (fc, _):
        enc = a.encode(req).prompt_embeds.to_torch()
        decoded = a.decode(lat)
        share = split_decode.decode_share(a._host.vae, lat.latents.to_torch(), 1, 2)
        clip = share.clips[0].cpu()
    assert fc.cuda_ops > 50 and torch.allclose(enc, ref_enc, atol=1e-5)
    media = decoded
    assert abs(media.frames - ref.frames).max() < 1e-5 and abs(media.audio - ref.audio).max() < 1e-5
    assert torch.allclose(clip, ref_share.clips[0], atol=1e-5)
    assert counts.syncs >= 1 and unsynced_clock_reads(counts.log, counts.where) == []


# ---------------------------------------------------------------------------------------------------- timing
def test_cuda_ready_b_step_clock_reads_wait_for_the_gpu(b_side):
    """Every clock read of B's denoise (each step's start and end, the request's compute time), with previews on,
    follows a synchronize or a copy to the host when GPU work was queued before it. It failed twice: the first
    step's clock started with the noise and layout still queued, and ``compute_s`` was read with the blocks after
    the loop still queued."""
    pay, call = _request(b_side, 4, wire.PreviewSpec("latent2rgb", FACTORS, every=1))
    counts = CudaCounts()
    with on_cuda(b_side, "transformer", counts=counts, clock_log=True):
        res = b_side.denoise(pay, call)
    assert len(res.steps) == 3 and "op" in counts.log
    assert unsynced_clock_reads(counts.log, counts.where) == [], "a clock read timed the launches, not the GPU work"


def test_cuda_ready_bench_vsa_synchronizes_and_runs_bf16():
    """Point 6: ``bench vsa --device cuda`` waits for the GPU before each clock read and runs bf16 (B's dtype). It
    timed asynchronous launches in float32."""
    from comfy_h3_nodes.tools.bench import vsa as bench_vsa  # noqa: PLC0415

    counts = CudaCounts()
    with stand_in_cuda(counts, clock_log=True), FakeCuda(log=counts.log):
        res = bench_vsa.run_vsa(quick=True, repeats=1, device="cuda", kernel="torch", log=lambda *_: None)
    assert res["dtype"] == "bfloat16" and res["max_abs_diff"] < 0.1
    assert counts.syncs >= 4 and unsynced_clock_reads(counts.log, counts.where) == []


# ---------------------------------------------------------------------------------------------------- groups
def _rank(rank: int, port: int, out: str, ckpt: str) -> None:
    """One rank of a two-rank gloo group: three parallel requests through B's real path (``call.parallel``),
    counting the process groups and device meshes made after the group formed."""
    import torch.distributed as dist  # noqa: PLC0415
    import torch.distributed.device_mesh as dm  # noqa: PLC0415

    from comfy_h3_nodes.engine.model import parallel as par  # noqa: PLC0415

    torch.set_num_threads(1)
    counts = {"new_group": 0, "init_device_mesh": 0}
    real_new, real_mesh = dist.new_group, dm.init_device_mesh

    def new_group(*a, **k):
        counts["new_group"] += 1
        return real_new(*a, **k)

    def mesh(*a, **k):
        counts["init_device_mesh"] += 1
        return real_mesh(*a, **k)

    dist.new_group = new_group
    dm.init_device_mesh = par.init_device_mesh = mesh
    b = BSide(ckpt, dtype="float32", device="cpu")
    par.join("g-count", f"127.0.0.1:{port}", rank, 2, 30.0)
    after_join = dict(counts)
    per = []
    for i in range(3):
        pay = warmup.payload("transformer", b.text_dim, "float32", request_id=f"group-{i}")
        call = wire.DenoiseCall(pay.request_id, pay.request_id, seed=i, num_inference_steps=3,
                                parallel=wire.ParallelCall("g-count", rank, 2, "ulysses"))
        b.denoise(pay, call, ready_timeout=30.0)
        per.append(dict(counts))
    par.leave()
    with open(out, "w") as fh:
        json.dump({"after_join": after_join, "per_request": per}, fh)


def test_cuda_ready_dit_group_meshes_made_once(tmp_path, tiny_ckpt):
    """Point 3: the group's device meshes (and so its process groups) are made when it forms, not per forward: over
    three parallel requests (two forwards each) on two real gloo ranks, ``new_group`` and ``init_device_mesh`` calls stay flat. It
    failed: ``enable_parallelism`` built a mesh, and new groups, every request (on NCCL: a communicator each)."""
    import socket  # noqa: PLC0415

    import torch.multiprocessing as mp  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path / f"r{r}.json"), str(tiny_ckpt))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    for r in range(2):
        got = json.loads((tmp_path / f"r{r}.json").read_text())
        assert got["after_join"]["init_device_mesh"] == 2  # one mesh per method, made as the group formed
        assert got["per_request"] == [got["after_join"]] * 3, got


def test_cuda_ready_nccl_join_bound_device_id_and_gloo_agreement(monkeypatch):
    """Point 4: on CUDA the group is NCCL (tensors) plus gloo (the per-step agreement): NCCL's collectives get at
    least one forward's bound (its watchdog counts from when the CPU queues them), ``device_id`` is passed, and the
    short bound stays on the gloo agreement. It failed: no ``device_id``, and NCCL got the 6-15 s gloo bound."""
    seen = {}
    dist = parallel.dist
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: object())
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **k: seen.update(backend=backend, **k))
    monkeypatch.setattr(dist, "new_group", lambda **k: seen.setdefault("agree", k) and "agree-group")
    monkeypatch.setattr(parallel, "init_device_mesh", lambda *a, **k: ("mesh", a))
    monkeypatch.setattr(parallel, "_GROUP", None)
    with stand_in_cuda():
        group = parallel.join("g-nccl", "127.0.0.1:1", 0, 2, 8.0, device="cuda:0")
    monkeypatch.setattr(parallel, "_GROUP", None)
    assert seen["backend"] == "cpu:gloo,cuda:nccl" and seen["device_id"] == torch.device("cuda:0")
    assert seen["timeout"] >= datetime.timedelta(seconds=parallel.NCCL_TIMEOUT_FLOOR_S) > datetime.timedelta(
        seconds=60)
    assert seen["agree"]["backend"] == "gloo" and seen["agree"]["timeout"] == datetime.timedelta(seconds=8.0)
    assert group.meshes["ulysses"][1][:2] == ("cuda", (1, 2)) and group.meshes["ring"][1][:2] == ("cuda", (2, 1))


def test_cuda_ready_group_destroyed_only_by_its_collectives_thread(monkeypatch):
    """Point 4: ``leave_group`` runs on the actor's control thread; while a request runs the group's collectives on
    the denoise thread, the group is left at once (``current()`` is None) and destroyed by the denoise thread when
    the request ends, never under a running collective. It failed: the control thread destroyed it mid-request."""
    destroyed = []
    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: not destroyed)
    monkeypatch.setattr(parallel.dist, "destroy_process_group",
                        lambda *a: destroyed.append(threading.get_ident()))
    group = parallel.Group("g-thread", 0, 2, 8.0, "gloo", owner=threading.get_ident())
    monkeypatch.setattr(parallel, "_GROUP", group)
    with parallel.running(group):
        t = threading.Thread(target=parallel.leave)
        t.start()
        t.join(5)
        assert parallel.current() is None and group.doomed and destroyed == []
    assert destroyed == [threading.get_ident()]
    monkeypatch.setattr(parallel, "_GROUP", parallel.Group("g-idle", 0, 2, 8.0, "gloo",
                                                           owner=threading.get_ident()))
    destroyed.clear()
    assert parallel.leave() and len(destroyed) == 1  # no request running: left and destroyed at once


def test_cuda_ready_uneven_gather_takes_nccl_on_cuda(monkeypatch):
    """Point 8: the output gather is padded only where gloo carries the tensor. It failed: the test for "gloo" in
    ``cpu:gloo,cuda:nccl`` was always true, so NCCL always took the padded gather."""
    assert parallel.uneven_gather_ok("cpu:gloo,cuda:nccl", "cuda")
    assert not parallel.uneven_gather_ok("cpu:gloo,cuda:nccl", "cpu")
    assert not parallel.uneven_gather_ok("gloo", "cpu") and parallel.uneven_gather_ok("nccl", "cuda")
    took = []
    monkeypatch.setattr(parallel.dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    monkeypatch.setattr(parallel, "_REAL_GATHER", lambda t, d, g: took.append("uneven") or t)
    monkeypatch.setattr(parallel, "_padded", lambda t, d, g: took.append("padded") or t)
    with stand_in_cuda(), FakeCuda():
        parallel._all_gather_padded(torch.ones(3, 2).to("cuda"), 0, None)
    parallel._all_gather_padded(torch.ones(3, 2), 0, None)
    assert took == ["uneven", "padded"]


# ---------------------------------------------------------------------------------------------------- backends
@pytest.fixture
def fake_wheels(monkeypatch):
    """``flash_attn`` and ``flash_attn_interface`` importable (as a wheel built for another GPU would be)."""
    for name in ("flash_attn", "flash_attn_interface"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    backends.probe.cache_clear()
    real = backends.probe
    yield
    real.cache_clear()


def test_cuda_ready_backend_checked_by_running_it(fake_wheels):
    """Point 5: a GPU backend is resolved by a tiny attention call on the device, and a wheel that imports but
    cannot run is refused in one sentence naming it and the GPU. It failed: an import was the whole check, so the
    error came at the first kernel, after the weights loaded. SDPA's probe really runs (on the fake device)."""
    with stand_in_cuda(CudaCounts(capability=(12, 1))), FakeCuda():
        with pytest.raises(backends.AttentionBackendError) as err:
            backends.resolve_attention_backend("flash")
        assert backends.probe("native") == ""
    msg = str(err.value)
    assert "'flash'" in msg and "flash_attn" in msg and "NVIDIA GB10 (sm_121)" in msg and "'sdpa'" in msg
    assert msg.count(". ") == 0 and "\n" not in msg  # one sentence


def test_cuda_ready_flash3_only_on_hopper_and_not_a_ring_backend(fake_wheels, monkeypatch):
    """Point 5: ``flash3`` (FlashAttention 3) is Hopper-only: refused on a Spark's sm_121 by name, accepted on
    capability 9.0 when its probe runs; and it is no ring backend (diffusers' ``_flash_3`` has no context-parallel
    support). It failed: offered on any GPU, and listed among the ring backends."""
    assert "_flash_3" not in parallel.RING_BACKENDS
    with stand_in_cuda(CudaCounts(capability=(12, 1))):
        with pytest.raises(backends.AttentionBackendError, match=r"sm_90 GPUs only and this is NVIDIA GB10 \(sm_121"):
            backends.resolve_attention_backend("flash3")
    monkeypatch.setattr(backends, "probe", lambda backend, device="cuda": "")
    with stand_in_cuda(CudaCounts(capability=(9, 0), name="NVIDIA H200")):
        assert backends.resolve_attention_backend("flash3") == "_flash_3"


# ---------------------------------------------------------------------------------------------------- memory
def test_cuda_ready_unified_memory_free_figure(monkeypatch):
    """Point 7: on unified memory (CUDA's total ~ the machine's) the plan's free figure is MemAvailable plus the
    blocks this process's allocator holds reserved but unused. It failed: min(CUDA free, MemAvailable), where
    CUDA's free figure leaves out reclaimable page cache."""
    GiB = 1 << 30
    vm = types.SimpleNamespace(total=120 * GiB, available=50 * GiB)
    monkeypatch.setattr(memory_plan.psutil, "virtual_memory", lambda: vm)
    monkeypatch.delenv(memory_plan.LIMIT_ENV, raising=False)
    with stand_in_cuda(CudaCounts(free=30 * GiB, total=119 * GiB, reserved=10 * GiB, allocated=4 * GiB)):
        avail, where = memory_plan.available_memory("cuda:0")
    assert avail == 56 * GiB and "unified" in where
    with stand_in_cuda(CudaCounts(free=30 * GiB, total=141 * GiB * 4)):  # a discrete GPU: its own free figure
        assert memory_plan.available_memory("cuda:0") == (30 * GiB, "CUDA free")


def test_cuda_ready_fp8_cast_and_swap_give_memory_back(tiny_ckpt, monkeypatch):
    """Point 7: after the fp8 cast the freed bf16 blocks go back (``empty_cache``), and a partition swap frees the
    old partition before the next one loads. It failed on the first: the cast left its blocks reserved. The second
    held here without the swap's new ``gc.collect()`` (the tiny fp8 partition, hooks included, is freed by its last
    reference); the collect stays for hook cycles a release model may have, and this test keeps the order."""
    from comfy_h3_nodes.engine.model import split  # noqa: PLC0415

    b = BSide(tiny_ckpt, dtype="float32", device="cpu", residency="one", precision="fp8")
    old = weakref.ref(b._host.transformer)
    alive_at_load = []
    real_load = split.load_checked

    def load_checked(model_dir, names, dtype, device, **kw):
        alive_at_load.append(old() is not None)
        return real_load(model_dir, names, dtype, "cpu", **kw)  # the weights stay on the CPU: only the calls count

    monkeypatch.setattr(split, "load_checked", load_checked)
    gc.disable()  # only the swap's own collect may free the cycle
    try:
        counts = CudaCounts()
        with stand_in_cuda(counts):
            b.device = "cuda"
            b._swap_to("transformer_ref")
            b.device = "cpu"
    finally:
        gc.enable()
    assert alive_at_load == [False], "the old partition was still alive when the next one loaded"
    assert counts.empty_caches >= 2  # after dropping the old one, and after the new one's fp8 cast
    assert counts.log.index("empty_cache") >= 0 and counts.log[-1] == "empty_cache"


# ---------------------------------------------------------------------------------------------------- smaller
def test_cuda_ready_text_encoder_file_holds_no_zero_lm_head():
    """Point 8: a text encoder file without ``lm_head`` (Comfy-Org's) gets a head that holds no weight (A never reads
    logits): no 1.5 GB of zeros on A's device, and A's plan counts exactly what is held. It failed: a zero matrix of
    vocabulary x hidden was allocated (and counted)."""
    from comfy_h3_nodes.engine.model import comfy_files  # noqa: PLC0415

    head = comfy_files.ZeroHead(8, 151_936)
    out = head(torch.ones(1, 5, 8))
    assert out.shape == (1, 5, 151_936) and out.stride()[-1] == 0 and not any(True for _ in head.parameters())
    assert float(out.abs().sum()) == 0.0


def test_cuda_ready_warmup_at_the_sequence_lengths_used():
    """Point 8: on CUDA B's warm-up also runs at the plan's canvas (FastH3's kernels and cuDNN/flash pick tiles per
    sequence length), not only at 64x64. It failed: one canvas, 64x64."""
    cpu = warmup.canvases_for({"device": "cpu", "memory_plan": {"canvas": [768, 1344, 124]}})
    gpu = warmup.canvases_for({"device": "cuda", "memory_plan": {"canvas": [768, 1344, 124]}})
    assert cpu == [(64, 64, 124)] and gpu == [(64, 64, 124), (768, 1344, 124)]
    pay = warmup.payload("transformer", 32, "float32", canvas=(768, 1344, 124))
    assert (pay.height, pay.width, pay.num_frames) == (768, 1344, 124)


# ---------------------------------------------------------------------------------------------------- the script
def test_cuda_ready_gpu_step_bench_cpu_dry_run():
    """Point 1: ``scripts/gpu_step_bench.py --cpu-dry-run --json`` runs every section at a tiny size and ends with
    one JSON line holding ``b_step_ms`` and no ``*_error`` key (the script exits non-zero on one). It failed: B's
    section built the old ``EncodedRequest`` and called ``denoise`` without its ``DenoiseCall``, and the error was
    swallowed."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_step_bench.py"), "--cpu-dry-run",
                           "--json"], capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])

    def keys(d, path=""):
        for k, v in d.items():
            yield f"{path}{k}"
            if isinstance(v, dict):
                yield from keys(v, f"{path}{k}.")

    assert not [k for k in keys(last) if k.endswith("_error")], last
    assert isinstance(last["b_step_ms"], float) and "single_step_ms" in last["backends"]["sdpa"]  # noise may flip a tiny difference
    for section in ("vsa", "remote_model", "preview", "memory"):
        assert section in last, section
    assert "nccl" in last["not_measured"].lower()
