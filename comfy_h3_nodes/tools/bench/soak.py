"""``bench soak``: a long day of use through a running ComfyUI's HTTP API and websocket, and what it leaves behind.

Prompts alternate between the pack's t2va template (tiny-random pickers, 64x64, 2 steps) and ComfyUI's own H3 graph
with ``H3RemoteModel`` (tests/comfyui_test_nodes give its tiny CLIP and VAEs), queued two at a time by two clients.
Every 4th prompt runs ``parallel`` A+B, every 5th switches its LoRA (strength on the pack's H3LoRA, core's
LoraLoaderModelOnly on/off), every 10th is interrupted once B works on it, every 15th carries a bad input (refused
by ``POST /prompt``), every 7th is the previous prompt again, unchanged (ComfyUI's cache), every 3rd asks for live
previews (latent2rgb). Every 10 prompts it samples
ComfyUI's RSS, open files and threads, the RSS of Ray's workers (B's DiT workers; A's: the rest of ComfyUI's Ray
workers), object-store bytes per node, the number of processes, the size of Ray's session folder and the pack's cache
folder, the pack's own caches (A: ``/h3/status?resources=1``; B: its health's ``caches``) and the Python objects of
ComfyUI's process.

Growth per metric is the least-squares slope over the samples after the warm-up (default: the first 20 prompts),
per 100 prompts; sizes in MiB, counts as counts. With no ``--url`` it starts ComfyUI (``--comfyui`` checkout and its
``--python``) in a temporary folder, and at the end stops it with SIGTERM and counts what of its process tree is left.
Last line with ``--json``: ``{"prompts", "failed_unexpectedly", "growth": {metric: {"after_warmup",
"per_100_prompts"}}, "worst_growth_per_100_mib", "leaked_processes_after_stop"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

REPO = pathlib.Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "example_workflows" / "h3_t2va_turbo.json"
NATIVE_DIT = "minimax_h3_t2va_pruned_bf16.safetensors"
LORA = "h3_soak_lora.safetensors"
MIB = 2 ** 20
#: metrics in bytes (reported in MiB); the others are counts
SIZE_METRICS = ("comfyui_rss", "a_workers_rss", "b_workers_rss", "object_store_a", "object_store_b",
                "ray_session_dir", "pack_cache_dir")


# ------------------------------------------------------------------------------------------------ processes
def _tree(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for e in pathlib.Path("/proc").iterdir():
        if e.name.isdigit():
            try:
                ppid = int((e / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(e.name))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _proc_status(pid: int) -> dict:
    out = {}
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            out[k] = v.strip()
    except OSError:
        pass
    return out


def _rss(pid: int) -> int:
    return int(_proc_status(pid).get("VmRSS", "0 kB").split()[0]) * 1024


def _du(path) -> int:
    total = 0
    for root, _, files in os.walk(path or "/nonexistent"):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


# ------------------------------------------------------------------------------------------------ ComfyUI
def _http(base: str, method: str, path: str, body=None, timeout: float = 60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.strip() else None)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode() or "null")


def _write_lora(dit_file: pathlib.Path, out: pathlib.Path) -> None:
    """A rank-2 ComfyUI-format LoRA of the tiny DiT's block projections (random, fixed seed)."""
    import torch  # noqa: PLC0415 - only when starting a ComfyUI
    from safetensors import safe_open  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    with safe_open(str(dit_file), "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    g, sd = torch.Generator().manual_seed(7), {}
    for k, (o, i) in ((k, s) for k, s in shapes.items() if k.startswith("blocks.") and k.endswith(".qkv_proj.weight")):
        layer = k[: -len(".weight")]
        sd[f"diffusion_model.{layer}.lora_A.weight"] = torch.randn(2, i, generator=g) * 0.3
        sd[f"diffusion_model.{layer}.lora_B.weight"] = torch.randn(o, 2, generator=g) * 0.3
        sd[f"diffusion_model.{layer}.alpha"] = torch.tensor(1.0)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out))


@contextlib.contextmanager
def started_comfyui(comfy_dir: str, python: str, root: pathlib.Path, log=print, start_timeout: float = 300.0):
    """ComfyUI with this pack and the test-only tiny H3 nodes, its folders under ``root``; yields ``(base, pid)``
    and stops it with SIGTERM at the end (the tree's leftovers are counted by the caller)."""
    from ...engine.model.tiny import build_tiny_checkpoint  # noqa: PLC0415
    from ...engine.model.tiny_comfy import fixture  # noqa: PLC0415

    packs = root / "packs"
    packs.mkdir(parents=True, exist_ok=True)
    (packs / "comfy-h3").symlink_to(REPO, target_is_directory=True)
    (packs / "h3-test-nodes").symlink_to(REPO / "tests" / "comfyui_test_nodes", target_is_directory=True)
    models = root / "models"
    ckpt = build_tiny_checkpoint(root / "tiny-h3", seed=0)
    (models / "diffusion_models").mkdir(parents=True)
    shutil.copy(fixture(ckpt, "transformer:pruned_bf16"), models / "diffusion_models" / NATIVE_DIT)
    shutil.copytree(ckpt / "comfy" / "diffusion_models" / "transformer", models / "diffusion_models" / "transformer")
    _write_lora(models / "diffusion_models" / NATIVE_DIT, models / "loras" / LORA)
    yaml = root / "extra_model_paths.yaml"
    yaml.write_text(f"comfy_h3_soak:\n  custom_nodes: {packs}\n  diffusion_models: {models / 'diffusion_models'}\n"
                    f"  loras: {models / 'loras'}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dirs = {n: root / n for n in ("output", "input", "temp", "user")}
    for d in dirs.values():
        d.mkdir(exist_ok=True)
    cmd = [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--disable-auto-launch",
           "--disable-api-nodes", "--extra-model-paths-config", str(yaml), "--disable-all-custom-nodes",
           "--whitelist-custom-nodes", "comfy-h3", "h3-test-nodes", "--output-directory", str(dirs["output"]),
           "--input-directory", str(dirs["input"]), "--temp-directory", str(dirs["temp"]),
           "--user-directory", str(dirs["user"]), "--database-url", f"sqlite:///{root / 'comfyui.db'}"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", H3_CACHE=str(root / "h3_cache"))
    with open(root / "comfyui.log", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=comfy_dir, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout
    try:
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (root / "comfyui.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"ComfyUI did not start (exit {proc.poll()}):\n{tail}")
            with contextlib.suppress(OSError, ValueError):
                if _http(base, "GET", "/object_info/H3SaveVideo", timeout=5)[0] == 200:
                    break
            time.sleep(1.0)
        log(f"[soak] ComfyUI at {base} (pid {proc.pid}), folders under {root}")
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


# ------------------------------------------------------------------------------------------------ prompts
def pack_prompt(seed: int, lora_strength: float, parallel: bool) -> dict:
    from ..runner import load_workflow  # noqa: PLC0415

    api, _ = load_workflow(TEMPLATE)
    for node in api.values():
        ct, inp = node["class_type"], node["inputs"]
        if ct in ("H3LoadEncoders", "H3RemoteDiT"):
            inp.update(model_path="tiny-random", dtype="float32")
        if ct == "H3RemoteDiT":
            inp.update(cluster_address="local", parallel="A+B" if parallel else "off")
        if ct == "H3LoRA":
            inp.update(lora_path="tiny-random", strength=lora_strength)
        if ct == "H3TextEncode":
            inp.update(width=64, height=64, num_frames=124)
        if ct == "H3RemoteDenoise":
            inp.update(seed=seed, steps=2)
        if ct == "H3Decode":
            inp.update(decode_on="A")
        if ct == "H3SaveVideo":
            inp.update(filename_prefix="soak/pack")
    return api


def core_prompt(seed: int, lora_strength: float, parallel: bool) -> dict:
    """ComfyUI's own H3 graph (as its t2v template's subgraph) with H3RemoteModel, tiny CLIP/VAEs, 2 steps."""
    model = ["4", 0]
    api = {
        "1": {"class_type": "H3TestTinyCLIP", "inputs": {"seed": 0}},
        "2": {"class_type": "H3TestTinyVAE", "inputs": {"kind": "video", "seed": 0}},
        "3": {"class_type": "H3TestTinyVAE", "inputs": {"kind": "audio", "seed": 0}},
        "4": {"class_type": "H3RemoteModel", "inputs": {"unet_name": NATIVE_DIT, "dtype": "float32", "precision": "auto",
                                                        "cluster_address": "local",
                                                        "parallel": "A+B" if parallel else "off"}},
        "5": {"class_type": "MiniMaxH3ImageToVideo", "inputs": {"clip": ["1", 0], "vae": ["2", 0], "width": 64,
                                                                 "height": 64, "length": 22,
                                                                 "prompt": "a red fox runs through snow, wind howls"}},
        "6": {"class_type": "RandomNoise", "inputs": {"noise_seed": seed}},
        "8": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "11": {"class_type": "VAEDecode", "inputs": {"samples": ["10", 0], "vae": ["2", 0]}},
        "12": {"class_type": "VAEDecodeAudio", "inputs": {"samples": ["10", 0], "vae": ["3", 0]}},
        "13": {"class_type": "CreateVideo", "inputs": {"images": ["11", 0], "fps": 24.0, "audio": ["12", 0]}},
        "14": {"class_type": "SaveVideo", "inputs": {"video": ["13", 0], "filename_prefix": "soak/core",
                                                      "format": "auto", "codec": "auto"}},
    }
    if lora_strength:
        api["30"] = {"class_type": "LoraLoaderModelOnly", "inputs": {"model": model, "lora_name": LORA,
                                                                     "strength_model": lora_strength}}
        model = ["30", 0]
    api["7"] = {"class_type": "BasicGuider", "inputs": {"model": model, "conditioning": ["5", 0]}}
    api["9"] = {"class_type": "BasicScheduler", "inputs": {"model": model, "scheduler": "simple", "steps": 2,
                                                            "denoise": 1.0}}
    api["10"] = {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["6", 0], "guider": ["7", 0],
                                                                    "sampler": ["8", 0], "sigmas": ["9", 0],
                                                                    "latent_image": ["5", 1]}}
    return api


def schedule(i: int, last: dict | None) -> tuple[str, dict, str]:
    """Prompt ``i`` (1-based) of the day: ``(kind, api, expect)``; expect is ``ok``, ``interrupt`` or ``refused``."""
    if i % 7 == 0 and last is not None:
        return "requeue", copy.deepcopy(last), "ok"
    core = i % 2 == 0
    lora = (1.0 if (i // 5) % 2 == 0 else 0.5) if not core else (0.8 if (i // 5) % 2 == 0 else 0.0)
    api = (core_prompt if core else pack_prompt)(1000 + i, lora, parallel=i % 4 == 0)
    kind = "core" if core else "pack"
    if i % 15 == 0:  # a value the node refuses before anything runs
        if core:
            api["9"]["inputs"]["steps"] = 0
        else:
            next(n for n in api.values() if n["class_type"] == "H3TextEncode")["inputs"]["width"] = 500
        return kind + "-bad", api, "refused"
    if i % 10 == 0:
        return kind + "-interrupted", api, "interrupt"
    return kind, api, "ok"


async def run_prompt(base: str, api: dict, expect: str, timeout: float = 600.0,
                     extra: dict | None = None) -> tuple[bool, str, float]:
    """Queue ``api`` on its own websocket client; interrupt it once its B node runs when ``expect`` says so.
    ``(as expected, how it ended, seconds)``."""
    import aiohttp  # noqa: PLC0415 - ComfyUI's own dependency; the bench runs beside it

    cid, t0 = uuid.uuid4().hex, time.monotonic()
    b_nodes = {nid for nid, n in api.items() if n["class_type"] in ("H3RemoteDenoise", "SamplerCustomAdvanced")}
    tmo = aiohttp.ClientTimeout(total=None, sock_connect=60, sock_read=60)
    async with aiohttp.ClientSession(timeout=tmo) as http:
        async with http.ws_connect(f"{base.replace('http', 'ws', 1)}/ws?clientId={cid}", heartbeat=20) as ws:
            async with http.post(f"{base}/prompt", json={"prompt": api, "client_id": cid, "extra_data": extra or {}}) as r:
                answer = await r.json()
            if r.status != 200:
                return expect == "refused", f"refused ({r.status})", time.monotonic() - t0
            if expect == "refused":
                return False, "accepted a bad input", time.monotonic() - t0
            pid, deadline = answer["prompt_id"], time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    msg = await ws.receive(timeout=30)
                except asyncio.TimeoutError:
                    continue
                if msg.type != aiohttp.WSMsgType.TEXT:
                    if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        return False, "websocket closed", time.monotonic() - t0
                    continue
                m = json.loads(msg.data)
                data = m.get("data") or {}
                if data.get("prompt_id") != pid:
                    continue
                if expect == "interrupt" and m["type"] == "executing" and data.get("node") in b_nodes:
                    await asyncio.sleep(0.3)
                    async with http.post(f"{base}/interrupt", json={"prompt_id": pid}) as r2:
                        await r2.read()
                if m["type"] == "execution_success":
                    return True, "success", time.monotonic() - t0  # an interrupt may land after B finished
                if m["type"] == "execution_interrupted":
                    return expect == "interrupt", "interrupted", time.monotonic() - t0
                if m["type"] == "execution_error":
                    return False, f"error: {data.get('exception_message', '')[:300]}", time.monotonic() - t0
            return False, "timed out", time.monotonic() - t0


# ------------------------------------------------------------------------------------------------ metrics
def sample(base: str, comfy_pid: int | None) -> dict:
    _, st = _http(base, "GET", "/api/h3/status?resources=1")
    st = st or {}
    res = st.get("resources") or {}
    out: dict = {}
    b_pids = {w["pid"] for w in st.get("workers", []) if w.get("machine", "B") == "B" and w.get("pid")}
    if comfy_pid:
        tree = _tree(comfy_pid)
        ps = _proc_status(comfy_pid)
        out["comfyui_rss"] = _rss(comfy_pid)
        out["comfyui_threads"] = int(ps.get("Threads", 0))
        with contextlib.suppress(OSError):
            out["comfyui_open_files"] = len(os.listdir(f"/proc/{comfy_pid}/fd"))
        out["processes"] = len(tree)
        ray_workers = set()
        for p in tree:
            with contextlib.suppress(OSError):
                if pathlib.Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"ray::"):
                    ray_workers.add(p)
        out["b_workers_rss"] = sum(_rss(p) for p in ray_workers & b_pids)
        out["a_workers_rss"] = sum(_rss(p) for p in ray_workers - b_pids)
    stores = res.get("object_store") or {}
    out["object_store_a"] = stores.get("127.0.0.2", sum(v for k, v in stores.items() if k != "127.0.0.3"))
    out["object_store_b"] = stores.get("127.0.0.3", 0)
    out["ray_session_dir"] = _du(res.get("ray_session_dir"))
    out["pack_cache_dir"] = _du(res.get("pack_cache_dir"))
    for k, v in (res.get("caches") or {}).items():
        out[f"a_cache_{k}"] = v
    for a in st.get("actors", []):
        for k, v in ((a.get("health") or {}).get("B", {}).get("caches") or {}).items():
            out[f"b_cache_{k}"] = max(out.get(f"b_cache_{k}", 0), v)
    return out


def growth(samples: list[tuple[int, dict]], warmup: int) -> dict:
    """Least-squares slope of each metric over the samples after ``warmup`` prompts, per 100 prompts."""
    after = [(n, m) for n, m in samples if n >= warmup]
    out = {}
    for key in sorted({k for _, m in after for k in m}):
        pts = [(n, m[key]) for n, m in after if key in m]
        scale = MIB if key in SIZE_METRICS else 1
        name = f"{key}_mib" if scale == MIB else key  # sizes in MiB, the rest counts
        if len(pts) < 2:
            out[name] = {"after_warmup": round(pts[0][1] / scale, 3) if pts else None, "per_100_prompts": 0.0}
            continue
        mx = sum(n for n, _ in pts) / len(pts)
        my = sum(v for _, v in pts) / len(pts)
        den = sum((n - mx) ** 2 for n, _ in pts)
        slope = sum((n - mx) * (v - my) for n, v in pts) / den if den else 0.0
        out[name] = {"after_warmup": round(pts[0][1] / scale, 3), "per_100_prompts": round(slope * 100 / scale, 3)}
    return out


async def _day(base: str, prompts: int, comfy_pid, every: int, log) -> tuple[list, list]:
    samples, failures, last, i = [(0, sample(base, comfy_pid))], [], None, 0
    while i < prompts:
        batch = []
        for _ in range(min(2, prompts - i)):  # two clients queue at once
            i += 1
            kind, api, expect = schedule(i, last)
            if expect == "ok" and kind != "requeue":
                last = api
            batch.append((i, kind, api, expect))
        # every 3rd prompt with live previews (B's JPEGs through ComfyUI's preview), as the frontend's setting sends
        results = await asyncio.gather(*(run_prompt(base, api, expect,
                                                    extra={"preview_method": "latent2rgb"} if n % 3 == 0 else None)
                                         for n, _, api, expect in batch))
        for (n, kind, _, expect), (fine, how, secs) in zip(batch, results):
            log(f"[soak] {n:4d} {kind:18s} {how:12.12s} {secs:6.2f} s")
            if not fine:
                failures.append({"prompt": n, "kind": kind, "expected": expect, "got": how})
            if n % every == 0:
                samples.append((n, await asyncio.to_thread(sample, base, comfy_pid)))
                log(f"[soak] sample at {n}: " + ", ".join(
                    f"{k}={v / MIB:.1f}MiB" if k in SIZE_METRICS else f"{k}={v}" for k, v in samples[-1][1].items()))
    return samples, failures


def run_soak(prompts: int, url: str | None = None, pid: int | None = None, comfy_dir: str | None = None,
             python: str | None = None, warmup: int = 20, every: int = 10, log=print) -> dict:
    comfy_dir = comfy_dir or os.environ.get("COMFYUI_DIR") or str(REPO.parent / "shared" / "comfyui")
    python = python or os.environ.get("COMFYUI_PYTHON") or str(REPO / ".comfyui-venv" / "bin" / "python")
    leaked = None
    if url:
        samples, failures = asyncio.run(_day(url.rstrip("/"), prompts, pid, every, log))
    else:
        root = pathlib.Path(tempfile.mkdtemp(prefix="h3_soak_"))
        tree: set = set()
        with started_comfyui(comfy_dir, python, root, log) as (base, proc):
            try:
                samples, failures = asyncio.run(_day(base, prompts, proc.pid, every, log))
            finally:
                tree = _tree(proc.pid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.5)
        left = [p for p in tree if _alive(p)]
        leaked = len(left)
        for p in left:  # not ours to keep: killed, and counted
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
    g = growth(samples, warmup)
    sizes = [v["per_100_prompts"] for k, v in g.items() if k.endswith("_mib")]
    return {"prompts": prompts, "failed_unexpectedly": len(failures), "failures": failures[:20], "growth": g,
            "worst_growth_per_100_mib": round(max(sizes), 3) if sizes else 0.0,
            "leaked_processes_after_stop": leaked, "samples": [[n, m] for n, m in samples]}


def main_json(res: dict) -> str:
    """The issue's last line, exactly its keys."""
    return json.dumps({k: res[k] for k in ("prompts", "failed_unexpectedly", "growth", "worst_growth_per_100_mib",
                                           "leaked_processes_after_stop")})
