"""The pack inside a real ComfyUI: loading, routes, a t2va prompt over HTTP + websocket, validation, interrupt,
every shipped template to an MP4 with the ``tiny-random`` model pickers, and the H3 panel in a real browser.

ComfyUI is not on PyPI, so this needs a checkout of its public source: ``make test-comfyui`` sets ``COMFYUI_DIR`` to
``../shared/comfyui`` (or yours) and ``COMFYUI_PYTHON`` to an environment built like a user's
(``scripts/comfyui_env.py``: ComfyUI's requirements, then the pack's ``install.py``). Without ``COMFYUI_DIR`` every
test here is skipped, saying so; ``.ci/run`` fails when any is skipped while ComfyUI is there. The server runs as a subprocess on a free loopback port with
its output, input, temp and user folders and its database under pytest's tmp folder; the pack is added through an
``--extra-model-paths-config`` YAML (``custom_nodes``) pointing at a folder that holds a ``comfy-h3`` symlink to this
repository (and an ``h3-test-nodes`` symlink to ``tests/comfyui_test_nodes``, the test-only nodes that give ComfyUI's
own H3 CLIP and VAEs at a tiny size for ComfyUI's own H3 graph), and only these packs are loaded. ``H3RemoteDiT`` with ``cluster_address`` ``local`` starts the embedded
two-node Ray cluster inside the ComfyUI process; ComfyUI and everything it started are killed at the end.

The templates in example_workflows/ run as shipped (canvas, frames; steps only with ``H3_TEMPLATE_STEPS=shipped``,
by default at most 3) except for the pickers: ``tiny-random`` on
``H3LoadEncoders`` and ``H3RemoteDiT`` (and ``H3LoRA``; a FastH3 template: ``tiny-random-fasth3``),
``cluster_address`` ``local``; their inputs are copied into
the test's ComfyUI input folder and the tiny model is built on first use into the test's own ``H3_CACHE``. The issue's
goal is each template to an MP4 in <= 120 s on a 2-core CPU machine: every template's wall time is printed, and
asserted only with ``H3_TEMPLATE_MAX_S=<seconds per video>`` (on a shared machine the time depends on the other work). A
``diffusers`` model folder holding a link to a tiny checkpoint is given to ComfyUI, so both pickers list a found
model besides ``tiny-random``. The browser tests (Debian's ``chromium`` + PyPI's ``playwright``; missing either fails
unless ``H3_SKIP_BROWSER=1``) open ComfyUI's own page with each frontend of ``browser_support.FRONTEND_VERSIONS``
(the installed one, and the others through a second ComfyUI started with ``--front-end-root``, installed into
``H3_FRONTEND_CACHE`` on first use), in the classic canvas and with Vue nodes: every template opened as a file on a
laptop's first screen (zoom, nothing under the frontend's bars, no overlaps), the turbo template queued like a user
(no overlaps after the run, every readout complete, the H3 panel's row named, its totals adding up), and the batch
template in two of them. Screenshots go to ``H3_SCREENSHOTS`` (default: <tmp>/comfy-h3-screenshots).

``H3_COMFYUI_TRACE_OUT=<file>`` also writes the websocket messages of the successful run there (that is how
``tests/web/fixtures/comfyui_ws_h3_trace.jsonl`` was recorded).

Comfy-Org's files: the tiny fixtures are also put in ComfyUI's ``text_encoders``, ``vae`` and ``diffusion_models``
folders under Comfy-Org's file names, and a template naming them on both machines runs; and
``tests/comfyui_crosscheck.py`` (in ComfyUI's Python) compares the pack's loading of every layout with ComfyUI's own H3
modules (see ``test_comfy_org_files_match_comfyuis_own_modules`` for the tolerances and the measured figures).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import io
import json
import os
import pathlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from browser_support import (
    FIRST_SCREEN, FRONTEND_VERSIONS, JS_NODE_BOXES, JS_WAIT_QUIET,
    frontend_static, launched_chromium, opened_problems, overlaps, stable_free_mask,
)
from comfy_h3_nodes.engine.model.tiny_comfy import fixture

pytestmark = pytest.mark.skipif(not os.environ.get("COMFYUI_DIR"), reason=(
    "COMFYUI_DIR is not set: `make test-comfyui` runs this suite (ComfyUI's source from ../shared/comfyui, or "
    "COMFYUI_DIR=<a ComfyUI checkout>)"))

REPO = pathlib.Path(__file__).resolve().parents[1]
PACK = "comfy-h3"
#: the test-only node pack (tests/comfyui_test_nodes: ComfyUI's own H3 CLIP and VAEs at a tiny size), loaded beside ours
TEST_PACK = "h3-test-nodes"
WORKFLOW = REPO / "example_workflows" / "h3_t2va.json"
START_TIMEOUT = float(os.environ.get("H3_COMFYUI_START_TIMEOUT", "300"))
PROMPT_TIMEOUT = float(os.environ.get("H3_COMFYUI_PROMPT_TIMEOUT", "900"))
HTTP_TIMEOUT = 60.0
TERMINAL = ("execution_success", "execution_error", "execution_interrupted")
H3_NODES = {"1": "H3LoadEncoders", "2": "H3RemoteDiT", "3": "H3TextEncode", "5": "H3RemoteDenoise",
            "6": "H3Decode", "7": "H3SaveVideo"}
EXAMPLES = REPO / "example_workflows"
ALL_TEMPLATES = sorted(p.stem for p in EXAMPLES.glob("*.json"))
#: the templates of ComfyUI's own H3 graph with H3RemoteModel (#28): run from the page (test_core_model_templates_*)
CORE_TEMPLATES = [t for t in ALL_TEMPLATES if t.startswith("h3_core_")]
#: the templates of the pack's own nodes
TEMPLATES = [t for t in ALL_TEMPLATES if t not in CORE_TEMPLATES]
TINY = "tiny-random"
TINY_FASTH3 = "tiny-random-fasth3"  # a FastH3 template's pickers: the tiny model in FastH3's layout
#: what a user changes in a template to try the pack without weights (everything else stays as shipped)
PICKERS = {"H3LoadEncoders": {"model_path": TINY}, "H3RemoteDiT": {"model_path": TINY, "cluster_address": "local"},
           "H3LoRA": {"lora_path": TINY}}
TEMPLATE_GOAL_S = 120.0  # the issue's goal per template on this 2-core machine
TEMPLATE_MAX_S = float(os.environ["H3_TEMPLATE_MAX_S"]) if os.environ.get("H3_TEMPLATE_MAX_S") else None
#: the steps each template runs with here: at most 3 by default (the suite proves the graph, its canvas and frames to an
#: MP4; 47 more steps of a random tiny DiT prove nothing more), ``H3_TEMPLATE_STEPS=shipped`` for the shipped steps (the
#: wall times a user meets, printed per template), or a number
TEMPLATE_STEPS = os.environ.get("H3_TEMPLATE_STEPS", "3")
if TEMPLATE_STEPS != "shipped" and not TEMPLATE_STEPS.isdigit():
    raise ValueError(f"H3_TEMPLATE_STEPS={TEMPLATE_STEPS!r}: give 'shipped' or a number of steps (at least 2)")
FOUND_MODEL = "tiny-h3-found"  # the checkpoint linked into the test's diffusers model folder
WALL_S: dict[str, float] = {}  # template -> seconds from POST /prompt to execution_success
# the H3 tab's button: 1.49 names it by the tab's id, 1.58 by a test id and the tooltip
TAB_BUTTON = ('.comfy-h3-timeline-tab-button, [data-testid="comfy-h3-timeline-tab-button"], '
              '.side-bar-button[aria-label^="H3 timings"]')
VUE_SETTING = "Comfy.VueNodes.Enabled"
PREVIEW_SETTING = "Comfy.Execution.PreviewMethod"  # the frontend's Live preview method (per prompt)
BROWSER_TEMPLATE = "h3_t2va_turbo"  # 4 steps: the browser runs cost little besides the decode
#: tiny fixtures under the names Comfy-Org's files have, in ComfyUI's model folders (relative to models/)
COMFY_ORG_FILES = {"text_encoders/qwen3vl_32b_minimax_h3_int8_convrot.safetensors": "text_encoder:int8_convrot",
                   "vae/minimax_h3_video_vae_fp16.safetensors": "vae:fp16",
                   "vae/minimax_h3_audio_vae_fp32.safetensors": "audio_vae:fp32",
                   "diffusion_models/minimax_h3_t2va_pruned_fp8_scaled.safetensors": "transformer:pruned_fp8_scaled",
                   "diffusion_models/minimax_h3_t2va_pruned_bf16.safetensors": "transformer:pruned_bf16",
                   "diffusion_models/minimax_h3_ref2va_pruned_bf16.safetensors": "transformer_ref:pruned_bf16"}
#: the ComfyUI-native graph's DiT: a tiny Comfy-Org-layout file of the pack's tiny builder, through core's UNETLoader
NATIVE_DIT = "minimax_h3_t2va_pruned_bf16.safetensors"
#: ComfyUI's own H3 nodes (comfy_extras/nodes_minimax_h3.py), which the pack must leave loadable
CORE_H3_NODES = ("EmptyMiniMaxH3LatentAV", "MiniMaxH3ImageToVideo", "MiniMaxH3AddGuide", "MiniMaxH3ReferenceToVideo",
                 "MiniMaxH3SigmaShift")


# ------------------------------------------------------------------------------------------------ processes
def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def _descendants(pid: int) -> set[int]:
    kids, out, todo = _children_map(), set(), [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyUI:
    def __init__(self, proc: subprocess.Popen, base: str, log: pathlib.Path, output: pathlib.Path,
                 packs: pathlib.Path, found_model: pathlib.Path | None = None):
        self.proc, self.base, self.log, self.output, self.packs = proc, base, log, output, packs
        self.found_model = found_model  # a model folder ComfyUI's `diffusers` models path holds (absolute)

    def log_tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM ComfyUI (its Ray processes die with it), then SIGKILL whatever of its tree is left."""
        tree = _descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.5)
        for pid in tree:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _random_taeh3(comfy_dir: pathlib.Path, python: str, path: pathlib.Path) -> None:
    """ComfyUI's tiny preview decoder for H3 (its own ``TAEHV`` at H3's 24 latent channels), random weights, saved
    where ComfyUI's ``taesd`` previews look for ``taeh3``: built by ComfyUI's Python from ComfyUI's code."""
    path.parent.mkdir(parents=True, exist_ok=True)
    code = ("import sys; out = sys.argv[1]; sys.argv = [sys.argv[0], '--cpu']; import comfy.options; "
            "comfy.options.enable_args_parsing(); import torch; from safetensors.torch import save_file; "
            "from comfy.taesd.taehv import TAEHV; torch.manual_seed(0); m = TAEHV(latent_channels=24); "
            "save_file({k: v.contiguous() for k, v in m.state_dict().items()}, out)")
    proc = subprocess.run([python, "-c", code, str(path)], cwd=comfy_dir, timeout=120, capture_output=True, text=True)
    assert proc.returncode == 0, f"ComfyUI's TAEHV could not be built: {proc.stderr[-2000:]}"


@contextlib.contextmanager
def _started_comfyui(tmp_path_factory, tiny_ckpt, front_end_root: pathlib.Path | None = None,
                     cache: tuple = ("--cache-none",)):
    """A ComfyUI with this pack (and, with ``front_end_root``, another frontend version's files: ``--front-end-root``)
    in its own folders under pytest's tmp folder; stopped with everything it started when the block ends. ``cache``:
    its cache mode; by default ``--cache-none`` (every node runs every time), since this module's tests queue the
    same graphs again and read what B did each time; ComfyUI's other cache modes: tests/test_comfyui_cache.py."""
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"]).resolve()
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    assert (comfy_dir / "main.py").is_file(), f"COMFYUI_DIR={comfy_dir} holds no main.py"
    root = tmp_path_factory.mktemp("comfyui")
    packs = root / "packs"
    packs.mkdir()
    (packs / PACK).symlink_to(REPO, target_is_directory=True)
    (packs / TEST_PACK).symlink_to(REPO / "tests" / "comfyui_test_nodes", target_is_directory=True)
    dirs = {name: root / name for name in ("output", "input", "temp", "user")}
    for d in dirs.values():
        d.mkdir()
    for f in sorted((EXAMPLES / "inputs").iterdir()):  # what the fl2va / ref2va templates load
        if f.is_file():
            shutil.copy2(f, dirs["input"] / f.name)
    diffusers = root / "models" / "diffusers"
    diffusers.mkdir(parents=True)
    (diffusers / FOUND_MODEL).symlink_to(tiny_ckpt, target_is_directory=True)
    for rel, label in COMFY_ORG_FILES.items():  # Comfy-Org's names, in ComfyUI's own folders
        (root / "models" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(fixture(tiny_ckpt, label), root / "models" / rel)
    for part in ("transformer", "transformer_ref"):  # the tiny configs, beside the DiT files
        shutil.copytree(tiny_ckpt / "comfy" / "diffusion_models" / part, root / "models" / "diffusion_models" / part)
    taeh3 = tmp_path_factory.getbasetemp() / "taeh3.safetensors"  # built once per session, copied to each ComfyUI
    if not taeh3.is_file():
        _random_taeh3(comfy_dir, python, taeh3)
    (root / "models" / "vae_approx").mkdir(parents=True)
    shutil.copy(taeh3, root / "models" / "vae_approx" / "taeh3.safetensors")
    _write_core_loras(fixture(tiny_ckpt, "transformer:pruned_bf16"), root / "models" / "loras")
    yaml = root / "extra_model_paths.yaml"
    yaml.write_text(f"comfy_h3_test:\n  custom_nodes: {packs}\n  diffusers: {diffusers}\n"
                    f"  text_encoders: {root / 'models' / 'text_encoders'}\n  vae: {root / 'models' / 'vae'}\n"
                    f"  diffusion_models: {root / 'models' / 'diffusion_models'}\n"
                    f"  vae_approx: {root / 'models' / 'vae_approx'}\n  loras: {root / 'models' / 'loras'}\n")
    port = _free_port()
    # --disable-api-nodes: ComfyUI's partner-API nodes need the internet, which this machine has not (5 s less a start)
    cmd = [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--disable-auto-launch",
           "--disable-api-nodes",
           "--extra-model-paths-config", str(yaml), "--disable-all-custom-nodes", "--whitelist-custom-nodes", PACK, TEST_PACK,
           "--output-directory", str(dirs["output"]), "--input-directory", str(dirs["input"]),
           "--temp-directory", str(dirs["temp"]), "--user-directory", str(dirs["user"]),
           "--database-url", f"sqlite:///{root / 'comfyui.db'}"]
    if front_end_root is not None:
        cmd += ["--front-end-root", str(front_end_root)]
    cmd += list(cache)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0",
               H3_CACHE=str(root / "h3_cache"))  # tiny-random is built on first use, as on a new machine
    log = root / "comfyui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=comfy_dir, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = ComfyUI(proc, f"http://127.0.0.1:{port}", log, dirs["output"], packs,
                     found_model=(diffusers / FOUND_MODEL).absolute())
    server.models = root / "models"
    try:
        _wait_ready(server)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def comfyui(tmp_path_factory, tiny_ckpt):
    with _started_comfyui(tmp_path_factory, tiny_ckpt) as server:
        yield server


def _wait_ready(server: ComfyUI) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"ComfyUI exited with {server.proc.returncode} while starting:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.base}/object_info/H3SaveVideo", timeout=5) as r:
                if r.status == 200 and "H3SaveVideo" in json.loads(r.read()):
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(1.0)
    pytest.fail(f"ComfyUI did not answer with the H3 nodes within {START_TIMEOUT:.0f} s:\n{server.log_tail()}")


# ------------------------------------------------------------------------------------------------ HTTP + ws
def _prompt(model_path, steps: int = 3, width: int = 64, height: int = 64, seed: int = 42):
    from comfy_h3_nodes.tools.runner import load_workflow

    api, ui = load_workflow(WORKFLOW)
    for nid in ("1", "2"):
        api[nid]["inputs"].update(model_path=str(model_path), dtype="float32")
    api["2"]["inputs"]["cluster_address"] = "local"
    api["3"]["inputs"].update(width=width, height=height, num_frames=124)
    api["5"]["inputs"].update(steps=steps, seed=seed)
    return api, ui


def _decode(msg) -> dict | None:
    import aiohttp

    if msg.type == aiohttp.WSMsgType.TEXT:
        return json.loads(msg.data)
    if msg.type == aiohttp.WSMsgType.BINARY and len(msg.data) >= 8:
        (event,) = struct.unpack(">I", msg.data[:4])
        if event == 1:  # a preview: [u32 image type (1 JPEG, 2 PNG)][image]
            from PIL import Image

            (kind,) = struct.unpack(">I", msg.data[4:8])
            return {"type": "preview", "data": {"format": kind, "size": Image.open(io.BytesIO(msg.data[8:])).size,
                                                "bytes": len(msg.data) - 8}}
        if event == 4:  # a preview with metadata: [u32 len][json][image]
            from PIL import Image

            (n,) = struct.unpack(">I", msg.data[4:8])
            meta = json.loads(msg.data[8:8 + n])
            return {"type": "preview", "data": {"meta": meta, "size": Image.open(io.BytesIO(msg.data[8 + n:])).size,
                                                "bytes": len(msg.data) - 8 - n}}
        if event == 3:  # progress_text: [u32 len][node id][text], as ComfyUI's frontend decodes it
            (n,) = struct.unpack(">I", msg.data[4:8])
            return {"type": "progress_text",
                    "data": {"nodeId": msg.data[8:8 + n].decode(), "text": msg.data[8 + n:].decode()}}
    return None


async def _run(server: ComfyUI, api: dict, ui: dict | None = None, on_message=None, timeout: float = PROMPT_TIMEOUT,
               extra: dict | None = None):
    """Queue ``api`` and record the websocket until the prompt ends: ``(prompt_id, messages, history entry)``."""
    import aiohttp

    cid = uuid.uuid4().hex
    messages: list[dict] = []
    tmo = aiohttp.ClientTimeout(total=None, sock_connect=HTTP_TIMEOUT, sock_read=HTTP_TIMEOUT)
    async with aiohttp.ClientSession(timeout=tmo) as http:
        async with http.ws_connect(f"{server.base.replace('http', 'ws', 1)}/ws?clientId={cid}", heartbeat=20) as ws:
            body = {"prompt": api, "client_id": cid, "extra_data": dict(extra or {})}
            if ui is not None:
                body["extra_data"]["extra_pnginfo"] = {"workflow": ui}
            async with http.post(f"{server.base}/prompt", json=body) as r:
                answer = await r.json()
                assert r.status == 200, f"POST /prompt answered {r.status}: {answer}"
            pid = answer["prompt_id"]
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"prompt {pid} did not end within {timeout:.0f} s; last messages "
                                f"{[m['type'] for m in messages[-10:]]}\n{server.log_tail()}")
                try:
                    msg = await ws.receive(timeout=min(left, 30.0))
                except asyncio.TimeoutError:
                    if server.proc.poll() is not None:
                        pytest.fail(f"ComfyUI died during prompt {pid}:\n{server.log_tail()}")
                    continue
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    pytest.fail(f"websocket closed during prompt {pid}:\n{server.log_tail()}")
                m = _decode(msg)
                if m is None:
                    continue
                m["t"] = time.monotonic()  # when the test saw it (node times in the benchmark lines)
                messages.append(m)
                if on_message is not None:
                    await on_message(http, m)
                if m["type"] in TERMINAL and m["data"].get("prompt_id") == pid:
                    break
        entry = None
        for _ in range(100):  # ComfyUI files the history just after it sends the terminal event
            async with http.get(f"{server.base}/history/{pid}") as r:
                hist = await r.json()
            if pid in hist:
                entry = hist[pid]
                break
            await asyncio.sleep(0.2)
        assert entry is not None, f"/history/{pid} stayed empty"
    return pid, messages, entry


async def _get(server: ComfyUI, path: str):
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http:
        async with http.get(f"{server.base}{path}") as r:
            return r.status, r.headers.get("Content-Type", ""), await r.read()


async def _post_prompt(server: ComfyUI, api: dict):
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http:
        async with http.post(f"{server.base}/prompt", json={"prompt": api}) as r:
            return r.status, await r.json()


def _http_json(server: ComfyUI, method: str, path: str, body=None):
    """A plain blocking request (the browser tests run inside Playwright's event loop: no asyncio.run there)."""
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{server.base}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as r:
        text = r.read().decode()
    return json.loads(text) if text.strip() else None


def _of(messages, kind, pid=None):
    return [m["data"] for m in messages if m["type"] == kind and (pid is None or m["data"].get("prompt_id") == pid)]


# ------------------------------------------------------------------------------------------------ tests
def test_pack_loads_with_nodes_web_files_and_routes(comfyui):
    from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    log = comfyui.log.read_text(errors="replace")
    assert "IMPORT FAILED" not in log, comfyui.log_tail()
    assert f"seconds: {comfyui.packs / PACK}" in log, comfyui.log_tail()  # ComfyUI's import-times line

    status, _, body = asyncio.run(_get(comfyui, "/object_info"))
    assert status == 200
    info = json.loads(body)
    for name, cls in NODE_CLASS_MAPPINGS.items():
        assert name in info, f"/object_info lacks {name}"
        assert info[name]["display_name"] == NODE_DISPLAY_NAME_MAPPINGS[name]
        assert info[name]["category"] == "MiniMax-H3"
        assert info[name]["python_module"] == f"custom_nodes.{PACK}"
    assert info["H3SaveVideo"]["output_node"] is True
    # the model pickers: what A's `diffusers` model folders hold, then tiny-random; B's list before any connection
    a_choices = info["H3LoadEncoders"]["input"]["required"]["model_path"][0]
    # A's folders named as ComfyUI names its models: relative to its diffusers folder, no absolute paths
    assert FOUND_MODEL in a_choices and a_choices[-1] == TINY, a_choices
    assert not any(c.startswith("/") for c in a_choices), a_choices
    # B's before any run: 'local' (the default) is a B that searches A's folders, named as ComfyUI names its models
    b_choices = info["H3RemoteDiT"]["input"]["required"]["model_path"][0]
    assert FOUND_MODEL in b_choices and b_choices[-1] == TINY, b_choices
    assert not any(c.startswith("/") for c in b_choices), b_choices

    # the Templates dialog: ComfyUI lists the pack's templates and serves each one's own thumbnail beside it
    status, _, body = asyncio.run(_get(comfyui, "/workflow_templates"))
    assert status == 200 and sorted(json.loads(body)[PACK]) == ALL_TEMPLATES, body[:300]
    for name in ALL_TEMPLATES:
        status, ctype, body = asyncio.run(_get(comfyui, f"/api/workflow_templates/{PACK}/{name}.jpg"))
        assert status == 200 and ctype == "image/jpeg" and body == (EXAMPLES / f"{name}.jpg").read_bytes(), name

    status, _, body = asyncio.run(_get(comfyui, "/extensions"))
    assert status == 200
    listed = json.loads(body)
    for js in sorted((REPO / "web").glob("*.js")):
        url = f"/extensions/{PACK}/{js.name}"
        assert url in listed, f"/extensions lacks {url}: {listed}"
        status, ctype, body = asyncio.run(_get(comfyui, url))
        assert status == 200 and "javascript" in ctype and body == js.read_bytes()

    for path in ("/api/h3/status", "/h3/status"):
        status, ctype, body = asyncio.run(_get(comfyui, path))
        assert status == 200 and "json" in ctype, (path, status, body[:300])
        st = json.loads(body)
        assert {"connected", "cluster", "nodes", "actors", "error", "time", "models"} <= set(st)
        # before the first H3RemoteDiT run /h3/status knows no A model roots yet (they are set when it connects):
        # only tiny-random is certain here; the template runs check the full lists
        assert TINY in st["models"]["A"] and TINY in st["models"]["B"], st["models"]
    status, ctype, body = asyncio.run(_get(comfyui, "/api/h3/timings"))
    assert status == 200 and "json" in ctype
    assert isinstance(json.loads(body)["records"], list)


# ------------------------------------------------------------------------------------------------ ComfyUI's own H3
def _native_h3_prompt(steps: int = 3, width: int = 64, height: int = 64, length: int = 22, seed: int = 1,
                      sampler: str = "euler", prompt: str = "a red fox runs through snow, wind howls") -> dict:
    """ComfyUI's own H3 graph (the shape of its ``video_minimax_h3_t2v`` template's subgraph: UNETLoader,
    MiniMaxH3ImageToVideo, RandomNoise, BasicGuider, KSamplerSelect, BasicScheduler, SamplerCustomAdvanced, VAEDecode,
    VAEDecodeAudio, CreateVideo, SaveVideo) in API format, on A alone. Only the loaders of the text encoder and the
    VAEs differ: ComfyUI's CLIPLoader and VAELoader build those at their released sizes, so the test-only nodes of
    tests/comfyui_test_nodes give ComfyUI's own classes at a tiny size (random weights, fixed seed) instead."""
    return {
        "1": {"class_type": "H3TestTinyCLIP", "inputs": {"seed": 0}},
        "2": {"class_type": "H3TestTinyVAE", "inputs": {"kind": "video", "seed": 0}},
        "3": {"class_type": "H3TestTinyVAE", "inputs": {"kind": "audio", "seed": 0}},
        "4": {"class_type": "UNETLoader", "inputs": {"unet_name": NATIVE_DIT, "weight_dtype": "default"}},
        "5": {"class_type": "MiniMaxH3ImageToVideo", "inputs": {"clip": ["1", 0], "vae": ["2", 0], "prompt": prompt,
                                                                 "width": width, "height": height, "length": length}},
        "6": {"class_type": "RandomNoise", "inputs": {"noise_seed": seed}},
        "7": {"class_type": "BasicGuider", "inputs": {"model": ["4", 0], "conditioning": ["5", 0]}},
        "8": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": sampler}},
        "9": {"class_type": "BasicScheduler", "inputs": {"model": ["4", 0], "scheduler": "simple", "steps": steps,
                                                          "denoise": 1.0}},
        "10": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["6", 0], "guider": ["7", 0],
                                                                 "sampler": ["8", 0], "sigmas": ["9", 0],
                                                                 "latent_image": ["5", 1]}},
        "11": {"class_type": "VAEDecode", "inputs": {"samples": ["10", 0], "vae": ["2", 0]}},
        "12": {"class_type": "VAEDecodeAudio", "inputs": {"samples": ["10", 0], "vae": ["3", 0]}},
        "13": {"class_type": "CreateVideo", "inputs": {"images": ["11", 0], "fps": 24.0, "audio": ["12", 0]}},
        "14": {"class_type": "SaveVideo", "inputs": {"video": ["13", 0], "filename_prefix": "video/h3_native",
                                                      "format": "auto", "codec": "auto"}},
    }


def test_comfyuis_own_h3_graph_runs_to_a_video_beside_the_pack(comfyui):
    """With the pack installed, ComfyUI's own H3 nodes still load, and ComfyUI's own H3 graph runs in the same
    ComfyUI, in one process, on A alone, to an H.264 + AAC MP4: core's UNETLoader detects the tiny Comfy-Org-layout
    DiT file of the pack's tiny builder from its keys, and ComfyUI's sampler, VAEDecode, VAEDecodeAudio, CreateVideo
    and SaveVideo do the rest. This graph is the baseline the same graph with its DiT on B is compared with."""
    status, _, body = asyncio.run(_get(comfyui, "/object_info"))
    info = json.loads(body)
    for name in CORE_H3_NODES:
        assert name in info and info[name]["python_module"] == "comfy_extras.nodes_minimax_h3", (name, info.get(name))
    assert NATIVE_DIT in info["UNETLoader"]["input"]["required"]["unet_name"][0]
    log = comfyui.log.read_text(errors="replace")
    assert "did not import correctly" not in log, comfyui.log_tail()

    api = _native_h3_prompt()
    pid, messages, entry = asyncio.run(_run(comfyui, api))
    errors = _of(messages, "execution_error", pid)
    assert not errors, f"{errors[0].get('exception_message')}\n{''.join(errors[0].get('traceback', []))}"
    assert entry["status"]["status_str"] == "success"
    ran = {d["node"] for d in _of(messages, "executing", pid) if d["node"] is not None}
    assert {"4", "5", "10", "11", "12", "13", "14"} <= ran, ran
    assert not _of(messages, "h3.timing", pid), "the pack took part in ComfyUI's own graph"
    bar = [d for d in _of(messages, "progress", pid) if d["node"] == "10"]  # ComfyUI's own sampler progress
    assert bar and bar[-1]["value"] == bar[-1]["max"] == 3, bar
    (video,) = entry["outputs"]["14"]["images"]
    mp4 = comfyui.output / video["subfolder"] / video["filename"]
    facts = _mp4_facts(mp4)
    assert facts["codecs"] == {"video": "h264", "audio": "aac"}, facts["codecs"]
    assert (facts["width"], facts["height"], facts["frames"]) == (64, 64, 22), facts
    assert facts["audio_samples"] > 0
    assert json.loads(facts["meta"]["prompt"])["4"]["inputs"]["unet_name"] == NATIVE_DIT


# ------------------------------------------------------------------------------------------------ core_model
#: the largest difference allowed between a sampling with core's local UNETLoader and with the DiT on B (same file,
#: fp32 on both): diffusers' modules match ComfyUI's to about 5e-6 per forward (tests/comfyui_crosscheck.py); after
#: three steps the tiny model's latents (magnitude about 4) differed by at most 1.4e-6 when measured (2026-12-02)
CORE_MODEL_TOLERANCE = 1e-4


NATIVE_REF_DIT = "minimax_h3_ref2va_pruned_bf16.safetensors"


def _core_model_prompt(remote: bool, name: str, workflow: str = "t2va", sampler: str = "euler",
                       cfg: float = 1.0, ksampler: bool = False, steps: int = 3, canvas: tuple = (64, 64, 22),
                       patch: bool = False, loras: tuple = (), shift: tuple | None = None, parallel: str = "off") -> dict:
    """ComfyUI's own H3 graph (:func:`_native_h3_prompt`) with its sampler's latent kept (``H3TestSaveLatent``).
    ``workflow``: t2va (MiniMaxH3ImageToVideo, no image), i2va (its ``first_frame`` from core's EmptyImage), r2va
    (MiniMaxH3ReferenceToVideo with one reference image, on the ref2va file); ``cfg`` > 1: CFGGuider with a second
    prompt as the negative; ``ksampler``: core's KSampler instead of SamplerCustomAdvanced. ``remote``: core's
    UNETLoader swapped for the pack's H3RemoteModel on the same file, fp32 on B. ``canvas``: (width, height,
    frames); ``patch``: core's PerturbedAttentionGuidance between the model and the sampler (it replaces the
    model's self-attention in a second forward per step: a patch of the model's inside); ``loras``: (file,
    strength) pairs, each through core's LoraLoaderModelOnly, stacked in order; ``shift``: (video, audio) through
    core's MiniMaxH3SigmaShift (its model_sampling and its transformer_options entries); ``parallel``: the remote
    MODEL's ``parallel`` (A+B: each forward on A's DiT rank and B's worker together)."""
    api = _native_h3_prompt(steps=steps, sampler=sampler, width=canvas[0], height=canvas[1], length=canvas[2])
    dit = NATIVE_REF_DIT if workflow == "r2va" else NATIVE_DIT
    api["4"]["inputs"]["unet_name"] = dit
    if remote:
        api["4"] = {"class_type": "H3RemoteModel", "inputs": {"unet_name": dit, "dtype": "float32",
                                                              "precision": "auto", "cluster_address": "local",
                                                              "parallel": parallel}}
    enc = api["5"]["inputs"]
    if workflow in ("i2va", "r2va"):
        api["20"] = {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1,
                                                            "color": 0xB04020}}
    if workflow == "i2va":
        enc["first_frame"] = ["20", 0]
    if workflow == "r2va":
        api["5"] = {"class_type": "MiniMaxH3ReferenceToVideo", "inputs": {
            "clip": enc["clip"], "vae": enc["vae"], "audio_vae": ["3", 0], "prompt": enc["prompt"],
            "width": enc["width"], "height": enc["height"], "length": enc["length"], "ref_image_size": "match",
            "ref_images.ref_image_0": ["20", 0]}}
    if cfg > 1.0:
        api["21"] = copy.deepcopy(api["5"])
        api["21"]["inputs"]["prompt"] = "blurry, still, silent"
        api["7"] = {"class_type": "CFGGuider", "inputs": {"model": ["4", 0], "positive": ["5", 0],
                                                          "negative": ["21", 0], "cfg": cfg}}
    if ksampler:
        for nid in ("6", "7", "8", "9"):
            api.pop(nid)
        negative = ["21", 0] if cfg > 1.0 else ["5", 0]
        api["10"] = {"class_type": "KSampler", "inputs": {
            "model": ["4", 0], "seed": 1, "steps": steps, "cfg": cfg, "sampler_name": sampler, "scheduler": "simple",
            "positive": ["5", 0], "negative": negative, "latent_image": ["5", 1], "denoise": 1.0}}
    source = ["4", 0]
    if shift is not None:
        api["29"] = {"class_type": "MiniMaxH3SigmaShift", "inputs": {"model": source, "shift_video": shift[0],
                                                                     "shift_audio": shift[1]}}
        source = ["29", 0]
    for i, (lora, strength) in enumerate(loras):
        api[f"3{i}"] = {"class_type": "LoraLoaderModelOnly", "inputs": {"model": source, "lora_name": lora,
                                                                       "strength_model": strength}}
        source = [f"3{i}", 0]
    if source != ["4", 0]:
        for nid, node in api.items():
            for k, v in node["inputs"].items():
                if v == ["4", 0] and not nid.startswith(("3", "29")):
                    node["inputs"][k] = source
    if patch:
        api["22"] = {"class_type": "PerturbedAttentionGuidance", "inputs": {"model": ["4", 0], "scale": 3.0}}
        for node in api.values():
            for k, v in node["inputs"].items():
                if v == ["4", 0] and node is not api["22"]:
                    node["inputs"][k] = ["22", 0]
    api["15"] = {"class_type": "H3TestSaveLatent", "inputs": {"samples": ["10", 0], "name": name}}
    return api


#: ComfyUI-format LoRAs of the tiny DiT (ComfyUI's names, ``lora_A``/``lora_B`` with ``alpha``), and a LoHa
CORE_LORAS = ("h3_test_lora_a.safetensors", "h3_test_lora_b.safetensors")
CORE_LOHA = "h3_test_loha.safetensors"


def _write_core_loras(dit_file: pathlib.Path, folder: pathlib.Path) -> None:
    """LoRAs for the tiny Comfy-Org DiT as ComfyUI's own loaders read them (``diffusion_model.<layer>.lora_A`` /
    ``lora_B`` / ``alpha`` for each block's qkv_proj, out_proj, mlp.fc1 and fc2; rank 2, random, a fixed seed
    each), and one LoHa (``hada_w1_a`` ...) of the same layers: a kind B refuses."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(dit_file), "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    layers = [k[: -len(".weight")] for k in shapes
              if k.startswith("blocks.") and k.endswith((".qkv_proj.weight", ".out_proj.weight", ".fc1.weight",
                                                         ".fc2.weight"))]
    assert layers, sorted(shapes)[:20]
    folder.mkdir(parents=True, exist_ok=True)
    for seed, name in enumerate(CORE_LORAS):
        g, sd = torch.Generator().manual_seed(100 + seed), {}
        for layer in layers:
            out_f, in_f = shapes[f"{layer}.weight"]
            sd[f"diffusion_model.{layer}.lora_A.weight"] = torch.randn(2, in_f, generator=g) * 0.3
            sd[f"diffusion_model.{layer}.lora_B.weight"] = torch.randn(out_f, 2, generator=g) * 0.3
            sd[f"diffusion_model.{layer}.alpha"] = torch.tensor(1.0 + seed)
        save_file(sd, str(folder / name))
    g, sd = torch.Generator().manual_seed(200), {}
    for layer in layers:
        out_f, in_f = shapes[f"{layer}.weight"]
        for w in ("w1", "w2"):
            sd[f"diffusion_model.{layer}.hada_{w}_a"] = torch.randn(out_f, 2, generator=g) * 0.1
            sd[f"diffusion_model.{layer}.hada_{w}_b"] = torch.randn(2, in_f, generator=g) * 0.1
        sd[f"diffusion_model.{layer}.alpha"] = torch.tensor(2.0)
    save_file(sd, str(folder / CORE_LOHA))


#: a canvas where one forward of the tiny DiT takes seconds on B (two cores): long enough to act mid-forward
SLOW_CANVAS = (1024, 1024, 124)


def _act_mid_sampling(comfyui, name: str, act, after_s: float = 1.0, parallel: str = "off") -> tuple:
    """Queue the remote core graph on :data:`SLOW_CANVAS` (2 steps) and call ``act(http)`` once, ``after_s`` after
    ComfyUI starts executing the sampler: ``(prompt id, messages, seconds from the act to the prompt's end)``."""
    done: dict = {}

    async def hook(http, m):
        if m["type"] == "executing" and m["data"].get("node") == "10" and not done:
            await asyncio.sleep(after_s)
            done["at"] = time.monotonic()
            await act(http)

    api = _core_model_prompt(True, name, steps=2, canvas=SLOW_CANVAS, parallel=parallel)
    pid, messages, _ = asyncio.run(_run(comfyui, api, on_message=hook))
    assert done, "the sampler never started"
    return pid, messages, time.monotonic() - done["at"]


def _b_forwards(comfyui) -> dict:
    st = _status(comfyui)
    (b,) = [a["health"]["B"] for a in st["actors"] if "health" in a][:1]
    return b["forwards"]


def test_core_model_interrupt_stops_b_mid_forward_and_next_prompt_runs(comfyui):
    """ComfyUI's Cancel during a forward on B (a canvas where one forward takes seconds): the prompt ends as
    interrupted on the sampler within seconds, B stops that forward before its next transformer block (B's health
    says which), and the next prompt runs to its video."""
    before = len(_b_forwards(comfyui)["interrupted"]) if _status(comfyui)["actors"] else 0

    async def interrupt(http):
        async with http.post(f"{comfyui.base}/interrupt", json={}) as r:
            assert r.status == 200

    pid, messages, ended = _act_mid_sampling(comfyui, "core_interrupted", interrupt)
    (stop,) = _of(messages, "execution_interrupted", pid)
    assert stop["node_id"] == "10", stop
    print(f"core_model interrupt: the prompt ended {ended:.2f} s after the interrupt")
    assert ended < 10, f"the prompt took {ended:.1f} s to stop after the interrupt"
    assert not _of(messages, "execution_success", pid)
    t0 = time.monotonic()
    while True:  # B notes the stop when its forward reaches the next block
        forwards = _b_forwards(comfyui)
        if len(forwards["interrupted"]) > before or time.monotonic() - t0 > 30:
            break
        time.sleep(0.25)
    assert len(forwards["interrupted"]) == before + 1, forwards
    assert "transformer block" in forwards["interrupted"][-1]["message"], forwards  # between blocks

    pid, messages, entry = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_after_interrupt")))
    _ok(messages, pid)


def test_core_model_refuses_a_dit_patch_b_cannot_apply_and_next_prompt_runs(comfyui):
    """Core's PerturbedAttentionGuidance puts a self-attention replacement in transformer_options: the sampler stops
    at the first forward that carries it with one sentence naming the entry (never silently sampled without it),
    and the next prompt without it runs."""
    pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_patched", patch=True)))
    (err,) = _of(messages, "execution_error", pid)
    assert err["node_id"] == "10", err
    assert "transformer_options['patches_replace'] holds ['attn1']" in err["exception_message"], err["exception_message"]
    assert "B" in err["exception_message"] and "UNETLoader" in err["exception_message"], err["exception_message"]
    pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_unpatched")))
    _ok(messages, pid)


def test_core_model_refuses_an_adapter_kind_b_cannot_apply_then_runs_without_the_lora(comfyui):
    """A LoHa through core's LoraLoaderModelOnly on the remote MODEL: the sampler is refused in one sentence naming
    the kind and the layer (B never samples without it); a LoRA's tensors cross once (the same file and strength
    on the next prompt: B fetches nothing); the same graph after a LoRA prompt and without any LoRA runs on B's
    untouched weights: within CORE_MODEL_TOLERANCE of core's UNETLoader on the plain graph."""
    pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_loha", loras=((CORE_LOHA, 1.0),))))
    (err,) = _of(messages, "execution_error", pid)
    msg = err["exception_message"]
    assert err["node_id"] == "10" and "the loha patch on blocks.0." in msg and "cannot apply" in msg, (err["node_id"], msg)
    fetched = []
    for name in ("core_lora_first", "core_lora_again"):  # the LoRA crosses once per (file, strength)
        pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, name, loras=((CORE_LORAS[0], 1.0),))))
        _ok(messages, pid)
        (t,) = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
        fetched.append(t["stages"][0]["info"]["lora_bytes_fetched"])
    assert fetched[0] > 0 and fetched[1] == 0, fetched
    pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_lora_removed")))
    _ok(messages, pid)
    pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(False, "core_lora_removed_local")))
    _ok(messages, pid)
    with_lora, removed = _latents(comfyui, "core_lora_first"), _latents(comfyui, "core_lora_removed")
    local = _latents(comfyui, "core_lora_removed_local")
    assert all(float((local[k] - removed[k]).abs().max()) <= CORE_MODEL_TOLERANCE for k in local)
    assert all(float((local[k] - with_lora[k]).abs().max()) > 1e-3 for k in local)


def test_core_model_b_killed_mid_sampling_is_reported_within_10_s_and_next_prompt_runs(comfyui):
    """B's DiT worker killed (SIGKILL) while a forward runs: the sampler fails within 10 s with a sentence that
    names B, the forward and what to do; the next prompt gets a worker again and runs to its video."""
    killed: dict = {}

    async def kill_b(http):
        async with http.get(f"{comfyui.base}/api/h3/status") as r:
            st = await r.json()
        (w,) = [w for w in st["workers"] if w.get("machine", "B") == "B"][:1]
        os.kill(w["pid"], signal.SIGKILL)
        killed["pid"] = w["pid"]

    pid, messages, ended = _act_mid_sampling(comfyui, "core_b_killed", kill_b)
    (err,) = _of(messages, "execution_error", pid)
    print(f"core_model B killed: the error came {ended:.2f} s after the kill: {err['exception_message']}")
    assert ended < 10, f"the error took {ended:.1f} s"
    assert err["node_id"] == "10", err
    msg = err["exception_message"]
    assert "B" in msg and "forward" in msg and "queue the prompt again" in msg, msg
    pid, messages, entry = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_after_kill")))
    _ok(messages, pid)
    st = _status(comfyui)
    assert all(w["pid"] != killed["pid"] for w in st["workers"]), st["workers"]


def test_core_model_parallel_rank_lost_mid_sampling_leaves_the_forwards_to_b(comfyui):
    """``parallel`` A+B on the remote MODEL, A's DiT rank killed (SIGKILL) while the group runs a forward: the
    sampling goes on on B's worker alone (that forward and the rest run again there), the prompt succeeds, the
    sampler's readout says which rank was lost at which forward, its latent is the one core's UNETLoader makes
    (within the tolerance), and the next parallel prompt forms a group again and runs."""
    warm_pid, warm, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_par_warm", parallel="A+B")))
    _ok(warm, warm_pid)  # the group formed and A's rank loaded: the kill below lands mid-forward
    killed: dict = {}

    async def kill_a_rank(http):
        async with http.get(f"{comfyui.base}/api/h3/status") as r:
            rank = (await r.json())["a_rank"]
        assert rank and rank.get("pid"), rank
        os.kill(rank["pid"], signal.SIGKILL)
        killed["pid"] = rank["pid"]

    pid, messages, ended = _act_mid_sampling(comfyui, "core_par_lost", kill_a_rank, after_s=1.5, parallel="A+B")
    _ok(messages, pid)
    (t,) = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
    stage = t["stages"][0]
    rerun = stage["info"]["rerun"]
    assert "A's rank" in rerun and "lost at forward" in rerun and "alone" in rerun, stage["info"]
    assert rerun in stage["note"], stage["note"]
    print(f"core_model parallel rank lost: {rerun}; the prompt ended {ended:.1f} s after the kill")
    local_pid, local_messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(False, "core_par_lost_local", steps=2,
                                                                                  canvas=SLOW_CANVAS)))
    _ok(local_messages, local_pid)
    got, want = _latents(comfyui, "core_par_lost"), _latents(comfyui, "core_par_lost_local")
    diffs = {k: float((got[k] - want[k]).abs().max()) for k in want}
    assert all(d <= CORE_MODEL_TOLERANCE for d in diffs.values()), diffs
    pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, "core_par_after", parallel="A+B")))
    _ok(messages, pid)
    (t,) = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
    assert len(t["stages"][0]["info"]["parallel"]["ranks"]) == 2 and not t["stages"][0]["info"]["rerun"], t
    assert _status(comfyui)["a_rank"]["pid"] != killed["pid"]


def _node_seconds(messages, pid, node: str) -> float:
    """How long ComfyUI executed ``node`` (from its ``executing`` message to the next one), as the test saw it."""
    ex = [m for m in messages if m["type"] == "executing" and m["data"].get("prompt_id") == pid]
    i = next(i for i, m in enumerate(ex) if m["data"]["node"] == node)
    return ex[i + 1]["t"] - ex[i]["t"]


def _latents(comfyui, name: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(comfyui.output / f"{name}.safetensors"))


#: (workflow, sampler, cfg, KSampler, LoRAs): ComfyUI's own graphs the remote MODEL must sample as core's
#: UNETLoader does
CORE_MODEL_CASES = {"t2va-euler": ("t2va", "euler", 1.0, False, ()),
                    "t2va-sigma-shift": ("t2va", "euler", 1.0, False, (), (6.0, 2.0)),
                    "i2va-res_multistep-cfg2-ksampler": ("i2va", "res_multistep", 2.0, True, ()),
                    "r2va-euler": ("r2va", "euler", 1.0, False, ()),
                    "t2va-lora": ("t2va", "euler", 1.0, False, ((CORE_LORAS[0], 0.8),)),
                    "t2va-two-loras": ("t2va", "euler", 1.0, False, ((CORE_LORAS[0], 0.8), (CORE_LORAS[1], -0.5))),
                    "t2va-lora-strength-0": ("t2va", "euler", 1.0, False, ((CORE_LORAS[0], 0.0),)),
                    "t2va-parallel": ("t2va", "euler", 1.0, False, (), None, "A+B")}


@pytest.mark.parametrize("case", list(CORE_MODEL_CASES))
def test_core_model_graph_matches_core_unetloader_with_the_dit_on_b(comfyui, case):
    """ComfyUI's own H3 graph on the same tiny Comfy-Org file (3 steps): once with core's UNETLoader, once with
    H3RemoteModel, where every forward runs on B's resident DiT (diffusers' transformer). The sampled latents
    (video and audio streams) agree within CORE_MODEL_TOLERANCE; the sampler node (the executing one) gets the
    readout, with one forward per step (two with CFG, as ComfyUI runs H3's cond and uncond apart); the video is
    written."""
    workflow, sampler, cfg, ksampler, loras, *rest = CORE_MODEL_CASES[case]
    shift, parallel = (rest[0] if rest else None), (rest[1] if len(rest) > 1 else "off")
    kw = dict(workflow=workflow, sampler=sampler, cfg=cfg, ksampler=ksampler, loras=loras, shift=shift)
    local_pid, local_messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(False, f"core_local_{case}", **kw)))
    _ok(local_messages, local_pid)
    pid, messages, entry = asyncio.run(_run(comfyui, _core_model_prompt(True, f"core_remote_{case}",
                                                                         parallel=parallel, **kw)))
    _ok(messages, pid)
    local, remote = _latents(comfyui, f"core_local_{case}"), _latents(comfyui, f"core_remote_{case}")
    remote_s, local_s = _node_seconds(messages, pid, "10"), _node_seconds(local_messages, local_pid, "10")
    assert sorted(local) == sorted(remote) == ["stream0", "stream1"], (sorted(local), sorted(remote))
    diffs = {k: float((local[k] - remote[k]).abs().max()) for k in local}
    scale = {k: float(local[k].abs().max()) for k in local}
    print(f"core_model {case}: max abs diff {diffs}, magnitude {scale}")
    assert all(d <= CORE_MODEL_TOLERANCE for d in diffs.values()), (diffs, scale)

    timings = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
    assert len(timings) == 1 and timings[0]["node"] == "10", [t["node"] for t in timings]
    (stage,) = timings[0]["stages"]
    forwards = 3 * (2 if cfg > 1.0 else 1)
    assert stage["stage"] == "sampling" and stage["info"]["forwards"] >= forwards, stage
    assert stage["compute_s"] > 0 and stage["info"]["per_forward"]["bytes_a_to_b"] > 0, stage
    group = stage["info"]["parallel"]
    if parallel == "off":
        assert group is None and f"{stage['info']['forwards']} forwards on B" in stage["note"], stage["note"]
    else:  # every forward ran on A's DiT rank and B's worker together; the readout names both and the method
        assert group["ranks"] == ["A h3_rank_a", "B h3_dit"] and group["method"] == "ulysses", group
        assert f"{stage['info']['forwards']} forwards on A h3_rank_a + B h3_dit" in stage["note"], stage["note"]
        assert "parallel: ulysses over 2 ranks" in stage["note"] and not stage["info"]["rerun"], stage["note"]
        assert len(stage["info"]["ranks_compute_s"]) == 2 and min(stage["info"]["ranks_compute_s"]) > 0, stage["info"]
    n = stage["info"]["forwards"]
    print(f"core_model {case} sampler node: local UNETLoader {local_s:.3f} s, remote MODEL {remote_s:.3f} s "
          f"(x{remote_s / local_s:.2f}), {(remote_s - local_s) / n * 1e3:.1f} ms more per forward over {n}; "
          f"per forward on B {stage['info']['per_forward']['compute_s'] * 1e3:.1f} ms compute, "
          f"{(stage['info']['per_forward']['a_to_b_s'] + stage['info']['per_forward']['b_to_a_s']) * 1e3:.1f} ms "
          "transfer")
    if loras:  # a LoRA changes the result, strength 0 does not; on B it patched the modules the file names
        if (comfyui.output / "core_local_t2va-euler.safetensors").is_file():  # the same graph without a LoRA
            plain = _latents(comfyui, "core_local_t2va-euler")
            moved = max(float((plain[k] - local[k]).abs().max()) for k in local)
            assert (moved == 0.0) == all(s == 0 for _, s in loras), moved
        patched = stage["info"]["lora_modules"]
        assert (patched == 0) if all(s == 0 for _, s in loras) else (patched > 0), stage["info"]
    (video,) = entry["outputs"]["14"]["images"]
    facts = _mp4_facts(comfyui.output / video["subfolder"] / video["filename"])
    assert (facts["width"], facts["height"], facts["frames"]) == (64, 64, 22), facts


# ------------------------------------------------------------------------------------------------ templates
def _template(name: str) -> tuple[dict, dict]:
    """A shipped template as ``(api prompt, UI workflow)``, exactly as in example_workflows/."""
    from comfy_h3_nodes.tools.runner import load_workflow

    api, ui = load_workflow(EXAMPLES / f"{name}.json")
    assert ui is not None, f"{name} is not a UI-format workflow"
    return api, ui


def _tiny_of(name: str) -> str:
    return TINY_FASTH3 if "fasth3" in name else TINY


def _pickers(tiny: str = TINY) -> dict[str, dict]:
    """``PICKERS`` with ``tiny`` as the model choice."""
    return {k: {n: (tiny if v == TINY and n == "model_path" else v) for n, v in d.items()} for k, d in PICKERS.items()}


def _with_tiny(api: dict, ui: dict, tiny: str = TINY) -> tuple[dict, dict]:
    """The template with the pickers a newcomer changes (``PICKERS``, with ``tiny`` for the models), in the prompt and
    in the saved workflow."""
    from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS
    from comfy_h3_nodes.tools.runner import widget_names

    pickers = _pickers(tiny)
    api, ui = copy.deepcopy(api), copy.deepcopy(ui)
    for node in api.values():
        node["inputs"].update(pickers.get(node["class_type"], {}))
    for node in ui["nodes"]:
        if node["type"] in pickers:
            names = widget_names(NODE_CLASS_MAPPINGS[node["type"]])
            for name, value in pickers[node["type"]].items():
                node["widgets_values"][names.index(name)] = value
    return api, ui


def _set_widget(api: dict, ui: dict, node_id: str, name: str, value) -> None:
    """One input of one node, in the prompt and in the saved workflow (what the MP4's metadata keeps)."""
    from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS
    from comfy_h3_nodes.tools.runner import input_specs, ui_to_api, widget_names

    api[node_id]["inputs"][name] = value
    (node,) = [n for n in ui["nodes"] if str(n["id"]) == node_id]
    specs, values, pos = input_specs(NODE_CLASS_MAPPINGS[node["type"]]), node["widgets_values"], 0
    for widget in widget_names(NODE_CLASS_MAPPINGS[node["type"]]):
        if widget == name:
            values[pos] = value
            break
        pos += 2 if specs[widget][1].get("control_after_generate") else 1  # a seed's "fixed" / "randomize" slot
    assert ui_to_api(ui)[node_id]["inputs"][name] == value, (node_id, name, values)


def _ids(api: dict, class_type: str) -> list[str]:
    return [nid for nid, n in api.items() if n["class_type"] == class_type]


def _mp4_facts(path: pathlib.Path) -> dict:
    import av

    with av.open(str(path)) as c:
        v, a = c.streams.video[0], c.streams.audio[0]
        facts = {"codecs": {s.type: s.codec_context.name for s in c.streams}, "width": v.codec_context.width,
                 "height": v.codec_context.height, "meta": dict(c.metadata)}
        facts["frames"] = sum(1 for _ in c.decode(v))
        c.seek(0)
        facts["audio_samples"] = sum(f.samples for f in c.decode(a))
    return facts


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_as_shipped_is_refused_once_with_the_tiny_random_hint(comfyui, name):
    """Queued as shipped (the real model's path, absent here), POST /prompt refuses it before anything runs, with
    one sentence on H3LoadEncoders' model_path that tells to choose 'tiny-random', and nothing else."""
    api, _ = _template(name)
    (enc,) = _ids(api, "H3LoadEncoders")
    status, answer = asyncio.run(_post_prompt(comfyui, api))
    assert status == 400, answer
    errs = answer["node_errors"]
    assert set(errs) == {enc}, f"errors on other nodes too: {json.dumps(errs)[:1500]}"
    assert errs[enc]["class_type"] == "H3LoadEncoders"
    (err,) = errs[enc]["errors"]  # once: not repeated for dtype or attention_backend
    assert err["type"] == "custom_validation_failed" and err["extra_info"]["input_name"] == "model_path", err
    assert api[enc]["inputs"]["model_path"] in err["details"] and f"choose '{TINY}'" in err["details"], err
    assert json.dumps(answer).count(f"choose '{TINY}'") == 1, answer


def _requests_of(api: dict) -> int:
    """How many requests (videos) one run of the template makes: the lines of an H3PromptList, else one."""
    from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS

    lists = _ids(api, "H3PromptList")
    if not lists:
        return 1
    (lid,) = lists
    return len(NODE_CLASS_MAPPINGS["H3PromptList"].parse(api[lid]["inputs"]["prompts"]))


#: H3 nodes that do no timed work of their own and send no h3.timing (every one reports since H3PromptList does)
UNTIMED: set[str] = set()


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_runs_to_mp4_with_tiny_random(comfyui, name, tmp_path, capsys):
    """Each template, with only the model pickers changed, runs in the real ComfyUI to H.264 + AAC MP4s of the
    template's canvas and frame count (one per prompt of an H3PromptList), with h3.timing events from every H3 node
    (one per request from the per-request nodes), B's model list on H3RemoteDiT, per-step progress of every request
    on H3RemoteDenoise, and each request's stages in /h3/timings. The first template is a newcomer's first run: its
    time includes starting the embedded Ray cluster and building tiny-random on A and on B."""
    shipped, _ = _template(name)
    tiny = _tiny_of(name)
    api, ui = _with_tiny(*_template(name), tiny)
    (enc_id,), (dit_id,), (text_id,) = _ids(api, "H3LoadEncoders"), _ids(api, "H3RemoteDiT"), _ids(api, "H3TextEncode")
    (den_id,), (dec_id,), (save_id,) = _ids(api, "H3RemoteDenoise"), _ids(api, "H3Decode"), _ids(api, "H3SaveVideo")
    width, height, frames = (shipped[text_id]["inputs"][k] for k in ("width", "height", "num_frames"))
    steps = shipped[den_id]["inputs"]["steps"]
    if TEMPLATE_STEPS != "shipped" and tiny != TINY_FASTH3:  # a FastH3 checkpoint runs only its trained steps (5)
        steps = min(steps, int(TEMPLATE_STEPS))
        _set_widget(api, ui, den_id, "steps", steps)
    assert (width, height, frames) == (832, 480, 124), "the template's canvas changed: update this test's goal"
    n_req = _requests_of(api)

    t0 = time.monotonic()
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    wall = WALL_S[name] = time.monotonic() - t0
    (tmp_path / "ws.jsonl").write_text("".join(json.dumps(m) + "\n" for m in messages))
    errors = _of(messages, "execution_error", pid)
    assert not errors, f"{errors[0].get('exception_message')}\n{''.join(errors[0].get('traceback', []))}"
    assert _of(messages, "execution_success", pid) and entry["status"]["status_str"] == "success"

    # every node ran or came from ComfyUI's cache (H3LoadEncoders with the same inputs as an earlier template)
    cached = {n for d in _of(messages, "execution_cached", pid) for n in d["nodes"]}
    ran = {d["node"] for d in _of(messages, "executing", pid) if d["node"] is not None}
    executed = {d["node"] for d in _of(messages, "executed", pid)}  # those that returned a UI output
    assert ran | cached == set(api) and not ran & cached, (ran, cached)
    assert executed <= ran and {dit_id, den_id, dec_id, save_id} <= ran  # H3RemoteDiT re-checks B every run
    assert {dit_id, save_id} <= executed
    timings: dict[str, list[dict]] = {}
    for d in _of(messages, "h3.timing", pid):
        timings.setdefault(d["node"], []).append(d)
    timed = {nid for nid in ran if api[nid]["class_type"].startswith("H3") and api[nid]["class_type"] not in UNTIMED}
    assert set(timings) == timed, (sorted(timings), sorted(timed))
    for nid, ts in timings.items():
        for t in ts:
            assert t["node_type"] == api[nid]["class_type"] and t["stages"] and "compute_s" in t["summary"], t
        per_request = nid in (text_id, den_id, dec_id, save_id)
        assert len(ts) == (n_req if per_request else 1), (api[nid]["class_type"], len(ts), n_req)
    # /history keeps every record of the run, each naming its node: a node's own ui output, and for a batch's
    # encode and denoise nodes (they return before their requests finish) H3Decode's, which waits for them all
    history = [(out_id, r) for out_id, o in entry["outputs"].items() for r in o.get("h3_timing", [])]
    for nid, ts in timings.items():
        kept = [(out_id, r) for out_id, r in history if r["node"] == nid]
        assert sorted(r["request_id"] or "" for _, r in kept) == sorted(t["request_id"] or "" for t in ts), nid
        assert all(r["node_type"] == api[nid]["class_type"] and r["prompt_id"] == pid for _, r in kept)
        late = n_req > 1 and nid in (text_id, den_id)
        assert {out_id for out_id, _ in kept} == {dec_id if late else nid}, (api[nid]["class_type"], kept)
    (dit,) = timings[dit_id]
    b_models = dit["summary"]["b_models"]  # embedded cluster: B searches A's model roots
    assert FOUND_MODEL in b_models and b_models[-1] == TINY, b_models  # named as ComfyUI names its models

    forwards = steps - 1
    rids = []
    for t in timings[den_id]:
        den = t["summary"]
        assert den["machine"] == "B" and den["a_to_b"]["bytes"] > 0 and den["b_to_a"]["bytes"] > 0, den
        ran_on = den["ran"]
        assert ran_on["model"] == tiny and ran_on["dtype"] == api[dit_id]["inputs"]["dtype"], ran_on
        want_partition = "transformer_ref" if _ids(api, "H3References") else "transformer"
        assert ran_on["partition"] == want_partition, ran_on
        assert den["steps_done"] == den["steps_total"] == forwards, den
        if _ids(api, "H3LoRA"):
            assert "LoRA" in den["schedule"], den
        if tiny == TINY_FASTH3:
            assert "VSA-H3 (FastH3 v1" in den["schedule"], den
        rids.append(t["request_id"])
    assert len(set(rids)) == n_req, rids
    prog: dict[str, list[int]] = {}
    for p in _of(messages, "h3.progress", pid):
        assert p["total"] == forwards and p["node"] == den_id, p
        prog.setdefault(p["request_id"], []).append(p["step"])
    assert prog == {rid: list(range(1, forwards + 1)) for rid in rids}, prog
    assert all(t["summary"]["frames"] == frames for t in timings[dec_id])

    status, _, body = asyncio.run(_get(comfyui, "/api/h3/status"))
    models = json.loads(body)["models"]
    assert models["B"] == b_models and FOUND_MODEL in models["A"] and models["A"][-1] == TINY, models

    # each request's stages, as the panel reads them
    for rid in rids:
        status, _, body = asyncio.run(_get(comfyui, f"/api/h3/timings?request_id={rid}"))
        stages = {r["stage"] for r in json.loads(body)["records"]}
        assert {"a_to_b", "denoise", "b_to_a", "decode"} <= stages, (rid, stages)
        if text_id in ran:
            assert "encode" in stages, (rid, stages)

    videos = entry["outputs"][save_id]["images"]
    assert len(videos) == n_req and entry["outputs"][save_id]["animated"] == [True] * n_req, videos
    for video in videos:
        mp4 = comfyui.output / video["subfolder"] / video["filename"]
        assert video["type"] == "output" and mp4.is_file() and video["filename"].endswith(".mp4")
        facts = _mp4_facts(mp4)
        assert facts["codecs"] == {"video": "h264", "audio": "aac"}, facts["codecs"]
        assert (facts["width"], facts["height"], facts["frames"]) == (width, height, frames), facts
        assert facts["audio_samples"] > 0
        meta = json.loads(facts["meta"]["prompt"])
        assert meta[save_id]["class_type"] == "H3SaveVideo"
        assert meta[enc_id]["inputs"]["model_path"] == tiny and meta[dit_id]["inputs"]["model_path"] == tiny
        assert {n["type"] for n in json.loads(facts["meta"]["workflow"])["nodes"]} == {n["type"] for n in ui["nodes"]}

    node_s = {api[nid]["class_type"]: round(sum(t["summary"]["compute_s"] for t in ts), 1)
              for nid, ts in timings.items()}
    with capsys.disabled():
        print(f"\n[h3] {name}: {wall:.1f} s to {n_req} MP4{'s' if n_req > 1 else ''} in real ComfyUI at {steps} steps (goal "
              f"{TEMPLATE_GOAL_S:.0f} s per video); compute s per node: {node_s}; cached: {sorted(cached)}")
    if TEMPLATE_MAX_S is not None:
        assert wall <= TEMPLATE_MAX_S * n_req, f"{name} took {wall:.1f} s (> {TEMPLATE_MAX_S:.0f} s x {n_req})"


# ------------------------------------------------------------------------------------------------ typed path
def test_t2va_prompt_runs_with_events_history_and_mp4(comfyui, tiny_ckpt, tmp_path):
    import av

    steps = 3
    api, ui = _prompt(tiny_ckpt, steps=steps)
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    (tmp_path / "ws.jsonl").write_text("".join(json.dumps(m) + "\n" for m in messages))
    if os.environ.get("H3_COMFYUI_TRACE_OUT"):
        pathlib.Path(os.environ["H3_COMFYUI_TRACE_OUT"]).write_text((tmp_path / "ws.jsonl").read_text())

    errors = _of(messages, "execution_error", pid)
    assert not errors, f"{errors[0].get('exception_message')}\n{''.join(errors[0].get('traceback', []))}"
    assert _of(messages, "execution_start", pid) and _of(messages, "execution_success", pid)
    cached = {n for d in _of(messages, "execution_cached", pid) for n in d["nodes"]}
    executed = {d["node"] for d in _of(messages, "executed", pid)}
    executing = {d["node"] for d in _of(messages, "executing", pid) if d["node"] is not None}
    assert executing == executed, (executing, executed)
    assert executed | cached == set(H3_NODES)
    assert {"2", "5", "6", "7"} <= executed  # this module's ComfyUI runs with --cache-none: every node runs

    timings = {d["node"]: d for d in _of(messages, "h3.timing", pid)}
    assert set(timings) == executed
    for nid, t in timings.items():
        assert t["node_type"] == H3_NODES[nid] and t["stages"] and "compute_s" in t["summary"]
    assert timings["5"]["summary"]["machine"] == "B"
    assert timings["5"]["summary"]["a_to_b"]["bytes"] > 0 and timings["5"]["summary"]["b_to_a"]["bytes"] > 0

    forwards = steps - 1
    prog = _of(messages, "h3.progress", pid)
    assert [p["step"] for p in prog] == list(range(1, forwards + 1))
    assert all(p["total"] == forwards and p["node"] == "5" and p["request_id"] for p in prog)
    bar = [d for d in _of(messages, "progress", pid) if d["node"] == "5"]
    assert bar and bar[-1]["value"] == bar[-1]["max"] == forwards
    assert "B 127.0.0.3" in timings["2"]["summary"]["status"]  # the readout's status line (it outlives the run)

    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"]
    outputs = entry["outputs"]
    for nid in executed:
        (rec,) = outputs[nid]["h3_timing"]
        assert rec["node_type"] == H3_NODES[nid] and rec["prompt_id"] == pid
    (video,) = outputs["7"]["images"]
    assert outputs["7"]["animated"] == [True]
    assert video["type"] == "output" and video["subfolder"] == "h3" and video["filename"].endswith(".mp4")
    mp4 = comfyui.output / "h3" / video["filename"]
    assert mp4.is_file() and mp4.stat().st_size > 0
    with av.open(str(mp4)) as c:
        kinds = {s.type: s.codec_context.name for s in c.streams}
        meta = dict(c.metadata)
    assert kinds == {"video": "h264", "audio": "aac"}
    assert json.loads(meta["prompt"])["7"]["class_type"] == "H3SaveVideo"
    assert json.loads(meta["workflow"])["nodes"]
    status, ctype, body = asyncio.run(_get(comfyui, f"/view?filename={video['filename']}&subfolder=h3&type=output"))
    assert status == 200 and body == mp4.read_bytes()

    status, _, body = asyncio.run(_get(comfyui, "/api/h3/status"))
    st = json.loads(body)
    assert st["connected"] and st["cluster"]["mode"] == "local" and st["error"] is None, st
    assert st["topology"]["B"]["ip"] == "127.0.0.3" and st["actors"][0]["health"]["B"]["partition"]
    status, _, body = asyncio.run(_get(comfyui, f"/api/h3/timings?request_id={timings['5']['request_id']}"))
    stages = {r["stage"] for r in json.loads(body)["records"]}
    assert {"a_to_b", "denoise", "b_to_a"} <= stages


def test_template_with_parallel_a_plus_b_runs_to_mp4(comfyui, tmp_path):
    """The t2va template with tiny-random and ``parallel`` A+B: A's DiT rank (its own process on A's node) joins B's
    worker for the denoise; both ranks' records reach the UI, the readout names them, and the MP4 is written."""
    api, ui = _with_tiny(*_template("h3_t2va"))
    (dit_id,), (den_id,), (save_id,) = _ids(api, "H3RemoteDiT"), _ids(api, "H3RemoteDenoise"), _ids(api, "H3SaveVideo")
    (text_id,) = _ids(api, "H3TextEncode")
    api[dit_id]["inputs"]["parallel"] = "A+B"
    api[den_id]["inputs"]["steps"] = 3
    api[text_id]["inputs"].update(width=128, height=128)
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    errors = _of(messages, "execution_error", pid)
    assert not errors, f"{errors[0].get('exception_message')}\n{''.join(errors[0].get('traceback', []))}"
    (den,) = [d for d in _of(messages, "h3.timing", pid) if d["node"] == den_id]
    ranks = den["summary"]["ran"]["ranks"]
    assert [r["machine"] for r in ranks] == ["A", "B"] and all(r["step_s"] for r in ranks)
    assert [s["info"].get("rank") for s in den["stages"] if s["stage"] == "denoise"] == [0, 1]
    assert "ulysses over 2 ranks" in den["summary"]["schedule"]
    (dit,) = [d for d in _of(messages, "h3.timing", pid) if d["node"] == dit_id]
    assert "parallel A+B" in dit["summary"]["status"]
    (video,) = entry["outputs"][save_id]["images"]
    assert (comfyui.output / video["subfolder"] / video["filename"]).stat().st_size > 0
    status, _, body = asyncio.run(_get(comfyui, "/api/h3/status"))
    groups = [a["health"].get("group") for a in json.loads(body)["actors"] if "health" in a]
    assert any(g and [r["machine"] for r in g["ranks"]] == ["A", "B"] for g in groups), groups
    # the readout's figure is the group's wall time, not the ranks' sum; /h3/status lists A's rank with its pid
    assert den["summary"]["compute_s"] == den["summary"]["ran"]["wall_s"], den["summary"]
    (rank_a,) = [w for w in json.loads(body)["workers"] if w.get("machine") == "A"]
    assert rank_a["name"] == "h3_rank_a" and rank_a["pid"] and rank_a["ok"], rank_a


@pytest.mark.parametrize("method", ["latent2rgb", "taesd", "none"])
def test_denoise_shows_live_previews_as_the_preview_method_says(comfyui, tiny_ckpt, method):
    """ComfyUI's preview method for the prompt (what the frontend's setting sends): latent2rgb shows B's estimate on
    H3RemoteDenoise through ComfyUI's progress bar, updating with the steps (the frontend keeps the last one);
    taesd (ComfyUI's taeh3 in vae_approx) has B send its latent frame and A decode it with ComfyUI's own tiny
    decoder; none shows none."""
    api, ui = _prompt(tiny_ckpt, steps=30, width=128, height=128, seed=7)
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui, extra={"preview_method": method}))
    errors = _of(messages, "execution_error", pid)
    assert not errors, f"{errors[0].get('exception_message')}\n{''.join(errors[0].get('traceback', []))}"
    previews = [m["data"] for m in messages if m["type"] == "preview"]
    with_preview = [p for p in _of(messages, "h3.progress", pid) if "preview" in p]
    (den,) = [d for d in _of(messages, "h3.timing", pid) if d["node"] == "5"]
    readout = den["summary"]["preview"]
    if method == "none":
        assert not previews and not with_preview and "preview method is none" in readout["note"]
        assert "images" not in entry["outputs"]["5"]
        return
    # latent2rgb: B's JPEG is 64x64 (an 8x8 latent frame, enlarged 8x); taesd: ComfyUI's taeh3 decodes the 8x8
    # frame on A to 128x128 pixels (16x, as the VAE would); ComfyUI contains either in its preview size (512)
    side = 128 if method == "taesd" else 64
    assert len(previews) >= 2 and all(p["size"] == (512, 512) for p in previews), previews[:3]
    steps = [p["preview"]["step"] for p in with_preview]
    assert len(steps) == len(previews) and steps == sorted(set(steps)) and steps[-1] == 29, steps
    assert all((p["preview"]["width"], p["preview"]["height"]) == (side, side) and p["preview"]["bytes"] < 16384
               for p in with_preview), with_preview[:2]
    source = "ComfyUI's taeh3.safetensors (vae_approx)" if method == "taesd" else "ComfyUI latent_formats.MiniMaxH3Video"
    assert readout["count"] >= len(previews) and readout["source"] == source, readout
    if method == "taesd":
        assert "A decodes it with ComfyUI's taeh3.safetensors" in readout["note"], readout
    # the frontend keeps the last live preview on the node (as for ComfyUI's own samplers): no output image beside
    # it, which the Vue nodes of frontend 1.58 drew as a second preview (issue #30; test_previews_in_their_place_*)
    assert "images" not in entry["outputs"]["5"], entry["outputs"]["5"]


def test_errors_read_as_one_sentence_on_the_node_that_owns_the_setting(comfyui, tiny_ckpt, tmp_path):
    """A model path B lacks fails on H3RemoteDiT, a missing LoRA on H3LoRA, each as a built-in exception type with
    the sentence (no module path, no ANSI codes, no object reprs)."""
    api, ui = _prompt(tiny_ckpt)
    api["2"]["inputs"]["model_path"] = str(tmp_path / "MiniMax-H3")
    pid, messages, _ = asyncio.run(_run(comfyui, api, ui))
    (err,) = _of(messages, "execution_error", pid)
    assert err["node_id"] == "2" and err["node_type"] == "H3RemoteDiT", err
    assert err["exception_type"] == "ValueError", err["exception_type"]
    assert err["exception_message"].startswith(  # + what B keeps serving when a worker was running already
        f"model path {tmp_path / 'MiniMax-H3'} does not exist on machine B; choose a model B has in H3RemoteDiT's "
        "model_path, or 'tiny-random' to try the pack without weights"), err["exception_message"]
    api, ui = _with_tiny(*_template("h3_t2va_turbo"))
    (lora_id,) = _ids(api, "H3LoRA")
    api[lora_id]["inputs"]["lora_path"] = str(tmp_path / "turbo.safetensors")
    pid, messages, _ = asyncio.run(_run(comfyui, api, ui))
    (err,) = _of(messages, "execution_error", pid)
    assert err["node_id"] == lora_id and err["exception_type"] == "RuntimeError", err
    assert "turbo.safetensors does not exist on machine B" in err["exception_message"]
    assert "'tiny-random'" in err["exception_message"] and "\x1b" not in err["exception_message"]
    ran = {d["node"] for d in _of(messages, "executing", pid) if d["node"] is not None}
    assert not any(api[n]["class_type"] == "H3RemoteDenoise" for n in ran)  # refused before any request


def test_bad_inputs_are_refused_by_post_prompt(comfyui, tiny_ckpt):
    api, _ = _prompt(tiny_ckpt, width=500)
    status, answer = asyncio.run(_post_prompt(comfyui, api))
    assert status == 400, answer
    errs = answer["node_errors"]["3"]
    assert errs["class_type"] == "H3TextEncode"
    # ComfyUI lists the check's one message under every input VALIDATE_INPUTS names (width and height): the message
    # is about width and says so, and that ComfyUI shows it under height too
    shown = {e["extra_info"]["input_name"]: e["details"] for e in errs["errors"]
             if e["type"] == "custom_validation_failed"}
    sentence = ("width 500 is not a multiple of 32; nearest valid: 480 or 512. (About width only: ComfyUI lists a "
                "node's own check under every input the check reads, so height shows it too.)")
    assert shown == {"width": f"width - {sentence}", "height": f"height - {sentence}"}, shown
    api, _ = _prompt(tiny_ckpt)
    api["3"]["inputs"]["height"] = 0  # the automatic canvas needs width 0 too: the message is about height
    status, answer = asyncio.run(_post_prompt(comfyui, api))
    assert status == 400, answer
    (detail, *_) = [e["details"] for e in answer["node_errors"]["3"]["errors"]
                    if e["type"] == "custom_validation_failed"]
    assert detail.split(" - ", 1)[1].startswith("height 0 means an automatic canvas, which needs width 0 too"), detail

    # our VALIDATE_INPUTS must leave ComfyUI's own checks of the other inputs in place
    api, _ = _prompt(tiny_ckpt)
    api["2"]["inputs"]["dtype"] = "bogus"
    api["7"]["inputs"]["filename_prefix"] = "h3/never"
    api["5"]["inputs"]["steps"] = 0
    status, answer = asyncio.run(_post_prompt(comfyui, api))
    assert status == 400, answer
    assert [e["type"] for e in answer["node_errors"]["2"]["errors"]] == ["value_not_in_list"]
    assert any("steps 0 is below 1" in e["details"] for e in answer["node_errors"]["5"]["errors"])


def test_interrupt_stops_denoise_and_next_prompt_runs(comfyui, tiny_ckpt):
    api, _ = _prompt(tiny_ckpt, steps=200, seed=7)
    sent: dict = {}

    async def interrupt_after_two_steps(http, m):
        if m["type"] == "h3.progress" and m["data"]["step"] >= 2 and not sent:
            sent["at"] = time.monotonic()
            async with http.post(f"{comfyui.base}/interrupt", json={}) as r:
                assert r.status == 200

    pid, messages, entry = asyncio.run(_run(comfyui, api, on_message=interrupt_after_two_steps))
    assert sent, "no h3.progress arrived before the prompt ended"
    ended = time.monotonic() - sent["at"]
    (stop,) = _of(messages, "execution_interrupted", pid)
    assert stop["node_type"] == "H3RemoteDenoise" and stop["node_id"] == "5"
    assert ended < 60, f"the prompt took {ended:.1f} s to stop after the interrupt"
    steps = [p["step"] for p in _of(messages, "h3.progress", pid)]
    assert max(steps) < 199, "B ran the denoise to the end"
    assert not _of(messages, "execution_success", pid)
    assert entry["status"]["status_str"] == "error" and not entry["status"]["completed"]

    api, ui = _prompt(tiny_ckpt, steps=3, seed=8)
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    assert _of(messages, "execution_success", pid), [m for m in messages if m["type"] in TERMINAL]
    assert [p["step"] for p in _of(messages, "h3.progress", pid)] == [1, 2]
    assert entry["status"]["status_str"] == "success"


# ------------------------------------------------------------------------------------------------ Comfy-Org's files
def test_template_names_comfy_org_files_on_both_machines(comfyui):
    """ComfyUI lists the Comfy-Org files of its text_encoders and vae folders in H3LoadEncoders' pickers (by their
    keys: the DiT file is not among them); the t2va template with those names on A and the pruned fp8_scaled DiT file
    on B (model_path tiny-random on A) runs to an MP4, and the readouts say what came from files."""
    status, _, body = asyncio.run(_get(comfyui, "/object_info/H3LoadEncoders"))
    opt = json.loads(body)["H3LoadEncoders"]["input"]["optional"]
    assert opt["text_encoder"][0] == ["from model_path", "qwen3vl_32b_minimax_h3_int8_convrot.safetensors", TINY]
    assert opt["vae"][0] == ["from model_path", "minimax_h3_video_vae_fp16.safetensors", TINY]
    assert opt["audio_vae"][0] == ["from model_path", "minimax_h3_audio_vae_fp32.safetensors", TINY]
    api, ui = _with_tiny(*_template("h3_t2va"))
    api["1"]["inputs"].update(text_encoder="qwen3vl_32b_minimax_h3_int8_convrot.safetensors",
                              vae="minimax_h3_video_vae_fp16.safetensors",
                              audio_vae="minimax_h3_audio_vae_fp32.safetensors")
    dit = comfyui.models / "diffusion_models" / "minimax_h3_t2va_pruned_fp8_scaled.safetensors"
    api["2"]["inputs"]["model_path"] = str(dit)
    api["3"]["inputs"].update(width=64, height=64)
    api["5"]["inputs"]["steps"] = 3
    pid, messages, entry = asyncio.run(_run(comfyui, api))
    errors = _of(messages, "execution_error", pid)
    assert not errors, f"{errors[0].get('exception_message')}\n{''.join(errors[0].get('traceback', []))}"
    (video,) = entry["outputs"]["7"]["images"]
    assert (comfyui.output / "h3" / video["filename"]).stat().st_size > 0
    timings = {d["node"]: d for d in _of(messages, "h3.timing", pid)}
    note = timings["1"]["stages"][0]["note"]
    assert "text_encoder from file qwen3vl_32b_minimax_h3_int8_convrot.safetensors (int8, dequantised" in note, note
    assert "B plan (fp8_scaled pruned" in timings["2"]["stages"][0]["note"]
    # H3RemoteDiT names the file picked and what runs (not the configs folder, not a bare bfloat16)
    runs = "fp8_scaled layers as stored, dequantised per call to bfloat16, pruned AdaLN in fp32"
    assert f"{dit.name}, transformer, precision auto: {runs}" in timings["2"]["stages"][0]["note"], timings["2"]
    assert f"on transformer from {dit.name} ({runs}, sdpa)" in timings["5"]["summary"]["schedule"], timings["5"]
    # the embedded B searched ComfyUI's diffusion_models folder too: its picker lists the DiT file, by its keys, by
    # the name ComfyUI gives it (relative to that folder)
    status, _, body = asyncio.run(_get(comfyui, "/object_info/H3RemoteDiT"))
    b_choices = json.loads(body)["H3RemoteDiT"]["input"]["required"]["model_path"][0]
    assert dit.name in b_choices and str(dit) not in b_choices, b_choices


#: the cross-check's tolerances (fp32 on CPU), as multiples of the reference's largest magnitude. Measured (max abs
#: difference / largest magnitude): transformer one step, unpruned fp32 4.3e-6 / 10.8, unpruned int8_convrot
#: 4.8e-6 / 10.8, pruned fp32 1.6e-6 / 6.8, pruned fp8_scaled 1.4e-6 / 6.8, pruned int8_convrot 1.7e-6 / 6.8 (B keeps
#: the quantised layers as comfy-kitchen tensors, so it runs ComfyUI's own int8 kernel); video VAE decode fp32
#: 6.0e-7 / 2.5, encode 0; audio VAE decode 0; text encoder hidden_states[50] fp32 1.1e-5 / 12.3, nvfp4 1.1e-5 / 13.3
#: (ComfyUI emulates nvfp4 on a CPU by dequantising, as A does); against ComfyUI's own dequantisation of an int8_convrot
#: file: video VAE 9.5e-7 / 2.5, text encoder 1.4e-5 / 12.4.
EXACT_TOL = 5e-6
#: A dequantises int8_convrot layers at load; ComfyUI's int8 kernel also quantises the activations, so there the two
#: differ by that rounding (measured: video VAE decode 9.0e-3 / 2.5, text encoder 0.47 / 12.5 after 50 layers).
INT8_KERNEL_TOL = 0.06
CROSS_CHECKS = {f"dit_{v}_{s}" for v in ("bf16", "int8_convrot", "pruned_bf16", "pruned_fp8_scaled",
                                         "pruned_int8_convrot") for s in ("video", "audio")} | {
    "video_vae_fp32_decode", "video_vae_fp32_encode", "video_vae_int8_convrot_decode",
    "video_vae_int8_convrot_decode_vs_comfy_dequantised", "audio_vae_fp32_decode",
    "text_encoder_fp32_hidden_states_50", "text_encoder_int8_convrot_hidden_states_50",
    "text_encoder_int8_convrot_hidden_states_50_vs_comfy_dequantised", "text_encoder_nvfp4_hidden_states_50",
    "text_encoder_nvfp4_hidden_states_50_vs_comfy_dequantised", "tokenizer_ids", "processor_vision_ids"}
#: the shipped configs against ComfyUI's own modules at the released size (shapes on the meta device)
RELEASED_CHECKS = {"released_transformer", "released_transformer_pruned", "released_vae", "released_audio_vae",
                   "released_text_encoder"}


def test_comfy_org_files_match_comfyuis_own_modules(tmp_path, capsys):
    """ComfyUI's own H3 transformer (pruned and not), text encoder and VAEs at tiny sizes, their weights saved in each
    layout (quantised and written by ComfyUI's mixed-precision ops), loaded through the pack: the same outputs as
    ComfyUI's forward on the same files, within the tolerances above. The configs the pack ships fit ComfyUI's modules
    at the released size exactly, and its tokenizer for them (ComfyUI's vocabulary) gives ComfyUI's H3 token ids."""
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([python, str(REPO / "tests" / "comfyui_crosscheck.py"), str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == CROSS_CHECKS | RELEASED_CHECKS
    for name in RELEASED_CHECKS:
        assert results.pop(name)["mismatch"] == "", name
    with capsys.disabled():
        print("\ncross-check against ComfyUI's own modules (max abs diff / largest magnitude):")
        for name, r in sorted(results.items()):
            print(f"  {name:66s} {r['max_abs_diff']:.2e} / {r['ref_max_abs']:.3g}")
    assert results["tokenizer_ids"]["max_abs_diff"] == 0 and results["processor_vision_ids"]["max_abs_diff"] == 0
    for name, r in results.items():
        int8_kernel = "int8_convrot" in name and name.startswith(("text_encoder", "video_vae")) and \
            not name.endswith("vs_comfy_dequantised")
        tol = (INT8_KERNEL_TOL if int8_kernel else EXACT_TOL) * max(r["ref_max_abs"], 1.0)
        assert r["max_abs_diff"] <= tol, (name, r)


# ------------------------------------------------------------------------------------------------ memory (issue 29)
def _rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _status(server: ComfyUI) -> dict:
    status, _, body = asyncio.run(_get(server, "/api/h3/status"))
    assert status == 200, body[:300]
    return json.loads(body)


def _ok(messages, pid) -> None:
    errors = _of(messages, "execution_error", pid)
    assert not errors, f"{errors[0].get('exception_message')}\n{''.join(errors[0].get('traceback', []))}"
    assert _of(messages, "execution_success", pid)


def _frames(path: pathlib.Path):
    import av
    import numpy as np

    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])])


def _video_of(server: ComfyUI, entry: dict) -> pathlib.Path:
    (video,) = entry["outputs"]["7"]["images"]
    return server.output / video["subfolder"] / video["filename"]


def _first_step_s(messages, pid) -> float:
    (den,) = [d for d in _of(messages, "h3.timing", pid) if d["node"] == "5"]
    stage = next(s for s in den["stages"] if s["stage"] == "denoise")
    return float(stage["steps"][0])


def _b_held(status: dict) -> dict:
    """What each of B's DiT workers holds, by name (A's DiT rank of ``parallel`` is a worker row too, on A)."""
    return {w["name"]: w["resident_bytes"] for w in status["workers"] if w.get("machine") != "A"}


def test_memory_free_releases_a_models_and_the_next_run_reloads_the_same_video(comfyui, tiny_ckpt):
    """``POST /free`` (what ComfyUI's *Free model and node cache* button sends) reaches the pack's A-side models
    through ComfyUI's model management: /h3/status shows A holding nothing, the process gives the memory back, the
    next run reloads them (its readout says so) and makes the same video; B is not touched. ComfyUI's own H3 graph
    runs first, so its models are among ComfyUI's loaded ones and become garbage when the next prompt replaces
    ComfyUI's cache: the pack's release inside ComfyUI's unload loop must not collect them there (a collection ran
    their finalizers, which changed ComfyUI's list under its loop and killed the prompt worker)."""
    pid, messages, _ = asyncio.run(_run(comfyui, _native_h3_prompt()))
    _ok(messages, pid)
    api, ui = _prompt(tiny_ckpt, steps=3, seed=11)
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    _ok(messages, pid)
    first = _frames(_video_of(comfyui, entry))
    st = _status(comfyui)
    (enc,) = [e for e in st["encoders"] if e["model_path"] == str(tiny_ckpt) and e["dtype"] == "float32"]
    held = enc["total_bytes"]
    assert set(enc["resident_bytes"]) == {"text_encoder", "vae", "audio_vae"} and held > 0, enc
    b_before = _b_held(st)
    a_rank_before = st["a_rank"]
    rss_before = _rss_mb(comfyui.proc.pid)

    t0 = time.monotonic()
    _http_json(comfyui, "POST", "/free", {"unload_models": True, "free_memory": True})
    while True:  # the prompt loop reads the flags as soon as /free wakes it
        enc = next(e for e in _status(comfyui)["encoders"] if e["model_path"] == str(tiny_ckpt)
                   and e["dtype"] == "float32")
        if enc["total_bytes"] == 0 or time.monotonic() - t0 > 30:
            break
        time.sleep(0.25)
    freed_s = time.monotonic() - t0
    assert enc["total_bytes"] == 0 and enc["resident_bytes"] == {}, enc
    assert enc["released"] == {c: "ComfyUI freed memory" for c in ("text_encoder", "vae", "audio_vae")}, enc
    assert "released (ComfyUI freed memory)" in enc["resident"]["text_encoder"]
    time.sleep(1.0)
    rss_after = _rss_mb(comfyui.proc.pid)
    st = _status(comfyui)
    assert _b_held(st) == b_before  # /free never releases B
    if a_rank_before is not None:  # A's DiT rank of an earlier parallel run is A's memory: released with the rest
        assert st["a_rank"]["resident_bytes"] == {} and st["a_rank"]["pid"] == a_rank_before["pid"], st["a_rank"]

    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    _ok(messages, pid)
    timings = {d["node"]: d for d in _of(messages, "h3.timing", pid)}
    note = timings["1"]["stages"][0]["note"]
    assert "(reloaded after ComfyUI freed memory)" in note and note.startswith("A load "), note
    again = _frames(_video_of(comfyui, entry))
    assert again.shape == first.shape and (again == first).all(), "the reloaded A side made another video"
    enc = next(e for e in _status(comfyui)["encoders"] if e["model_path"] == str(tiny_ckpt) and e["dtype"] == "float32")
    assert enc["total_bytes"] == held and enc["released"] == {} and enc["reloads"] >= 1, enc
    print(f"\n[h3 memory] /free: A held {held / 2**20:.2f} MiB (its own count), released in {freed_s:.2f} s; ComfyUI RSS "
          f"{rss_before:.0f} -> {rss_after:.0f} MiB ({rss_before - rss_after:+.0f}); reload {note}")


def test_memory_comfyuis_eviction_and_unload_release_a_models_like_its_own(tiny_ckpt, tmp_path):
    """ComfyUI's own model management, in ComfyUI's Python: the pack's A-side models are among its loaded models;
    ``free_memory`` (what ``load_models_gpu`` runs to make room for a model it loads) and ``unload_all_models`` (what
    ``/free`` runs) release them as they release ComfyUI's own model; loading again reloads them. The figure A's plan
    counts (ComfyUI's loaded models) is ComfyUI's own model's size."""
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"]).resolve()
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    code = f'''
import json, sys
sys.argv = [sys.argv[0], "--cpu"]
import comfy.options; comfy.options.enable_args_parsing()
sys.path.insert(0, {str(REPO)!r})
import torch, comfy.model_management as mm, comfy.model_patcher
from comfy_h3_nodes.engine.a_side.side import ASide
from comfy_h3_nodes.host import comfy_models
side = ASide({str(tiny_ckpt)!r}, dtype="float32")
held = side.resident_bytes()
assert comfy_models.hold(side, ("text_encoder", "vae", "audio_vae")) == []
own = comfy.model_patcher.ModelPatcher(torch.nn.Linear(256, 256), torch.device("cpu"), torch.device("cpu"))
mm.load_models_gpu([own])
names = sorted(type(lm.model.model).__name__ for lm in mm.current_loaded_models)
counted = comfy_models.comfy_held_bytes()
cpu = mm.get_torch_device()
# a model larger than this machine's memory is to be loaded: ComfyUI evicts every model it can (the free memory
# moves with other processes, so ask for more than the total, not a little more than what is free now)
mm.free_memory(mm.get_total_memory(cpu) + sum(held.values()), cpu)
evicted = dict(side.released); after_evict = side.resident_bytes(); left = len(mm.current_loaded_models)
back = comfy_models.hold(side, ("text_encoder", "vae", "audio_vae"))
reloaded = [[r.component, r.reason, r.seconds] for r in back]
mm.unload_all_models()
unloaded = dict(side.released)
print(json.dumps({{"held": held, "names": names, "counted": counted, "own_bytes": own.model_size(),
                  "evicted": evicted, "after_evict": after_evict, "left": left, "reloaded": reloaded,
                  "unloaded": unloaded,
                  "after_unload": side.resident_bytes(), "loaded_after_unload": len(mm.current_loaded_models)}}))
'''
    proc = subprocess.run([python, "-c", code], cwd=comfy_dir, capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
                               "HF_HUB_OFFLINE": "1", "H3_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(out["names"]) == sorted(["H3TextEncoderModel", "H3VideoVAEModel", "H3AudioVAEModel", "Linear"])
    assert out["counted"] == {"ComfyUI's loaded models": out["own_bytes"]}  # ours are not counted twice
    parts = {"text_encoder", "vae", "audio_vae"}
    assert set(out["evicted"]) == parts and out["after_evict"] == {} and out["left"] == 0, out
    assert {c for c, _, _ in out["reloaded"]} == parts
    assert {why for _, why, _ in out["reloaded"]} == {"reloaded after ComfyUI freed memory"}
    assert set(out["unloaded"]) == parts and out["after_unload"] == {} and out["loaded_after_unload"] == 0
    print(f"\n[h3 memory] ComfyUI's eviction released A's {sum(out['held'].values()) / 2**20:.2f} MiB; reload "
          + ", ".join(f"{c} {s:.3f} s" for c, _, s in out["reloaded"]))


def test_memory_release_b_from_the_panels_route_and_the_next_run_reloads_on_b(comfyui, tiny_ckpt):
    """"Release B's model" (the panel's POST /h3/release_b): B's worker keeps its actor (same pid) and holds no
    weights; the next run's connection readout says so, B reloads during its denoise (the record says how long), and
    the run makes its video."""
    api, ui = _prompt(tiny_ckpt, steps=3, seed=5)
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    _ok(messages, pid)
    st = _status(comfyui)
    before = {w["name"]: w for w in st["workers"] if w.get("machine") != "A"}
    assert before and all(w["resident_bytes"] for w in before.values()), before
    a_rank_before = st["a_rank"]  # A's DiT rank (an earlier parallel run's), if any: not B's, so not released

    out = _http_json(comfyui, "POST", "/api/h3/release_b", {})
    assert sorted(r["name"] for r in out["released"]) == sorted(before) and out["missing"] == {}, out
    for r in out["released"]:
        assert r["bytes"] == before[r["name"]]["resident_bytes"] and r["total_bytes"] > 0
    st = _status(comfyui)
    workers = {w["name"]: w for w in st["workers"] if w.get("machine") != "A"}
    assert sorted(workers) == sorted(before), workers
    for name, w in workers.items():
        assert w["resident_bytes"] == {} and w["released"]["cause"].startswith("a release on request"), w
        assert w["pid"] == before[name]["pid"]  # the actor stays
    if a_rank_before is not None:
        assert st["a_rank"]["resident_bytes"] == a_rank_before["resident_bytes"], st["a_rank"]

    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    _ok(messages, pid)
    timings = {d["node"]: d for d in _of(messages, "h3.timing", pid)}
    assert "B's model is released" in timings["2"]["summary"]["status"], timings["2"]["summary"]["status"]
    den = next(s for s in timings["5"]["stages"] if s["stage"] == "denoise")
    reload_s = den["info"]["reloaded_after_release_s"]
    assert reload_s > 0 and "reloaded the model after a release" in den["note"], den
    assert _video_of(comfyui, entry).stat().st_size > 0
    after = {w["name"]: w for w in _status(comfyui)["workers"] if w.get("machine") != "A"}
    assert {n: w["resident_bytes"] for n, w in after.items()} == {n: w["resident_bytes"] for n, w in before.items()}
    assert all(w["released"] is None and w["pid"] == before[n]["pid"] for n, w in after.items())
    print(f"\n[h3 memory] Release B's model: {sum(r['total_bytes'] for r in out['released']) / 2**20:.2f} MiB "
          f"released on B; reloaded by the next denoise in {reload_s:.3f} s")


def _cli(python: str, args: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def two_machine_layout(monkeypatch, prefix: str, b_args, again: list | None = None):
    """A's head by ``cluster start-head`` (127.0.0.2) and B by ``remote_worker setup`` (127.0.0.3), both in ComfyUI's
    Python (same versions), on loopback as docs/two_spark_setup.md sets them up; A's ComfyUI gets the token as setup
    says (``monkeypatch``). ``b_args(root)``: setup's model arguments (``--model-path`` ...), given the layout's
    folder (short, under /tmp: Ray's socket paths). Yields ``(head address, root, setup's output)``; ``again`` gets a
    call that runs the same setup again. Stops both nodes after."""
    from comfy_h3_nodes.cluster import ray_node as rn

    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    root = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    ra, rb = str(root / "ra"), str(root / "rb")
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    head, token = f"127.0.0.2:{port}", root / "token"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(H3_STATE_DIR=str(root / "state"), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    try:
        out = _cli(python, ["comfy_h3_nodes", "cluster", "start-head", "--node-ip", "127.0.0.2", "--port", str(port),
                            "--token-file", str(token), "--object-store-mb", "96", "--temp-dir", ra, "--num-cpus",
                            "2", "--json"], env, 120)
        assert out.returncode == 0, out.stdout + out.stderr
        setup = ["remote_worker", "setup", "--allow-cpu", "--head", head, "--node-ip", "127.0.0.3", *b_args(root),
                 "--token-file", str(token), "--object-store-mb", "96", "--temp-dir", rb, "--dtype", "float32",
                 "--threads", "1", "--num-cpus", "2", "--json"]
        out = _cli(python, setup, env, 240)
        assert out.returncode == 0, out.stdout + out.stderr
        if again is not None:
            again.append(lambda: _cli(python, setup, env, 240))
        monkeypatch.setenv("RAY_AUTH_MODE", "token")  # what setup prints for A's ComfyUI
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
        yield head, root, out
    finally:
        _cli(python, ["remote_worker", "stop", "--temp-dir", rb], env, 120)
        rn.stop_node(rb, grace=3)
        rn.stop_node(ra, grace=3)
        shutil.rmtree(root, ignore_errors=True)


def test_memory_b_survives_a_comfyui_restart_in_the_two_machine_layout(tmp_path_factory, tiny_ckpt, monkeypatch):
    """A's head by ``cluster start-head`` (127.0.0.2), B by ``remote_worker setup`` (127.0.0.3), both in ComfyUI's
    Python (same versions). ComfyUI runs, is stopped with SIGTERM and started again: B's worker is the same process,
    it loads nothing, the first denoise step after the restart is within 2x the warm step, and the readout says B
    was already resident."""
    b_args = lambda root: ["--model-path", str(tiny_ckpt), "--model-root", str(tiny_ckpt.parent)]  # noqa: E731
    with two_machine_layout(monkeypatch, "h3m29_", b_args) as (head, _, _):
        # 256x256: a step of about 0.1 s, so that the first step's figure is the DiT's work (at 64x64 a step is
        # 8 ms and a new ComfyUI's first call to B, tens of ms, was measured instead)
        api, ui = _prompt(tiny_ckpt, steps=4, width=256, height=256, seed=3)
        api["2"]["inputs"]["cluster_address"] = head

        def b_health(server):
            st = _status(server)
            (b,) = [a["health"]["B"] for a in st["actors"] if "health" in a]
            return b

        with _started_comfyui(tmp_path_factory, tiny_ckpt) as server:
            runs = []
            for _ in range(2):  # the second is the warm figure
                pid, messages, entry = asyncio.run(_run(server, api, ui))
                _ok(messages, pid)
                runs.append(_first_step_s(messages, pid))
            b1 = b_health(server)
            status1 = {d["node"]: d for d in _of(messages, "h3.timing", pid)}["2"]["summary"]["status"]
        warm = runs[1]
        with _started_comfyui(tmp_path_factory, tiny_ckpt) as server:  # the one above got SIGTERM
            t0 = time.monotonic()
            pid, messages, entry = asyncio.run(_run(server, api, ui))
            first_run_s = time.monotonic() - t0
            _ok(messages, pid)
            after = _first_step_s(messages, pid)
            b2 = b_health(server)
            timings = {d["node"]: d for d in _of(messages, "h3.timing", pid)}
        assert b2["pid"] == b1["pid"] and b2["uptime_s"] > b1["uptime_s"], (b1, b2)
        assert b2["loads"] == b1["loads"], "B loaded after ComfyUI restarted"
        den = next(s for s in timings["5"]["stages"] if s["stage"] == "denoise")
        assert "reloaded_after_release_s" not in den["info"] and not den["info"].get("swapped_s"), den
        assert den["load_s"] < 0.01 and "reloaded" not in den["note"], den  # the adapter switch only (microseconds)
        assert "B was already resident" in timings["2"]["summary"]["status"], timings["2"]["summary"]["status"]
        assert "B was already resident" in status1
        assert after <= 2 * warm, f"first step after the restart {after:.3f} s, warm {warm:.3f} s"
        print(f"\n[h3 memory] restart: first step {runs[0]:.3f} s (first run), warm {warm:.3f} s, after the restart "
              f"{after:.3f} s ({after / warm:.2f} x warm); the run after the restart {first_run_s:.1f} s; B loads "
              f"{b1['loads']} -> {b2['loads']}, pid {b1['pid']} kept")


def test_memory_free_releases_a_dit_rank_of_parallel_and_the_next_group_reloads_it(comfyui):
    """``parallel`` A+B: A's DiT rank (its own process on A's machine) is among ComfyUI's loaded models too; ``/free``
    releases its weights (the actor stays), and the next parallel run forms the group again with the rank reloaded."""
    api, ui = _with_tiny(*_template("h3_t2va"))
    (dit_id,), (den_id,), (text_id,) = _ids(api, "H3RemoteDiT"), _ids(api, "H3RemoteDenoise"), _ids(api, "H3TextEncode")
    api[dit_id]["inputs"]["parallel"] = "A+B"
    api[den_id]["inputs"]["steps"] = 3
    api[text_id]["inputs"].update(width=64, height=64)
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    _ok(messages, pid)
    rank = _status(comfyui)["a_rank"]
    assert rank and rank["resident_bytes"] and rank["released"] is None, rank
    _http_json(comfyui, "POST", "/free", {"unload_models": True})  # the Unload models button
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        rank2 = _status(comfyui)["a_rank"]
        if rank2 and rank2["released"]:
            break
        time.sleep(0.5)
    assert rank2["released"]["cause"] == "ComfyUI freed memory" and rank2["resident_bytes"] == {}, rank2
    assert rank2["pid"] == rank["pid"]
    pid, messages, entry = asyncio.run(_run(comfyui, api, ui))
    _ok(messages, pid)
    (den,) = [d for d in _of(messages, "h3.timing", pid) if d["node"] == den_id]
    assert [r["machine"] for r in den["summary"]["ran"]["ranks"]] == ["A", "B"]
    rank3 = _status(comfyui)["a_rank"]
    assert rank3["resident_bytes"] == rank["resident_bytes"] and rank3["released"] is None and rank3["pid"] == rank["pid"]
    print(f"\n[h3 memory] /free released A's DiT rank: {sum(rank['resident_bytes'].values()) / 2**20:.2f} MiB; the next "
          "parallel run reloaded it")


# ------------------------------------------------------------------------------------------------ browser
@pytest.fixture(scope="module")
def browser():
    yield from launched_chromium("the browser checks", "apt-get install -y chromium && pip install playwright (no "
                                 "`playwright install`), or set H3_SKIP_BROWSER=1")


def _installed_frontend() -> str | None:
    """The frontend version ComfyUI serves by default (the package in COMFYUI_PYTHON's environment)."""
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    proc = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('comfyui-frontend-package'))"],
                          capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() or None


@pytest.fixture(scope="module")
def comfyui_frontends(comfyui, tmp_path_factory, tiny_ckpt):
    """``version -> ComfyUI`` serving that frontend: the module's server for the installed one, another ComfyUI
    started with ``--front-end-root`` for each other version (started on first use, stopped with the module)."""
    servers = {_installed_frontend(): comfyui}
    with contextlib.ExitStack() as stack:
        def get(version: str) -> ComfyUI:
            if version not in servers:
                static = frontend_static(version)
                if isinstance(static, str):
                    pytest.fail(f"frontend {version} for ComfyUI's --front-end-root: {static}", pytrace=False)
                servers[version] = stack.enter_context(_started_comfyui(tmp_path_factory, tiny_ckpt, static))
            return servers[version]
        yield get


SHOTS = pathlib.Path(os.environ.get("H3_SCREENSHOTS") or pathlib.Path(tempfile.gettempdir()) / "comfy-h3-screenshots")
OPEN_AS_FILE = """async ([wf, name]) => {
    // what dropping the file on the canvas or File > Open does: the frontend reads it and applies its saved view
    const file = new File([JSON.stringify(wf)], name, { type: 'application/json' });
    await window.app.handleFile(file);
}"""


class ComfyPage:
    """ComfyUI's own page in a browser context, with the UI mode set and the page errors kept."""

    def __init__(self, server: ComfyUI, browser, *, vue: bool, version: str, viewport=(1500, 960)):
        self.server, self.vue, self.version = server, vue, version
        settings = _http_json(server, "GET", "/api/settings")
        if "Comfy.TutorialCompleted" not in settings:  # a new user's first page shows the templates dialog over all
            _http_json(server, "POST", "/api/settings/Comfy.TutorialCompleted", True)
        _http_json(server, "POST", f"/api/settings/{VUE_SETTING}", vue)
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.page = self.context.new_page()
        self.page.set_default_timeout(30000)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(server.base + "/")
        self.page.wait_for_selector(TAB_BUTTON, timeout=90000)
        self.page.wait_for_function("() => !!window.app?.graph && !!window.app.extensionManager?.setting")
        assert self.page.evaluate(f"() => window.app.extensionManager.setting.get('{VUE_SETTING}')") is vue
        got = self.page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__")
        assert got == version, f"ComfyUI serves frontend {got}, the test asked for {version}"

    @property
    def mode(self) -> str:
        return "vue" if self.vue else "litegraph"

    def open_file(self, name: str, wf: dict):
        self.page.evaluate(OPEN_AS_FILE, [wf, f"{name}.json"])
        n = len(wf["nodes"])
        self.page.wait_for_function("(n) => window.app.graph.nodes.length === n", arg=n)
        if self.vue:
            self.page.wait_for_function("(n) => document.querySelectorAll('[data-node-id]').length >= n", arg=n)
        self.settle()

    def settle(self, ms: int = 500):
        self.page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
        self.page.wait_for_timeout(ms)

    def free_mask(self) -> list[str]:
        self.page.evaluate("() => { window.app.graph.clear(); window.app.canvas.setDirty(true, true); }")
        self.settle(800)
        return stable_free_mask(self.page)

    def boxes(self) -> list[dict]:
        return self.page.evaluate(JS_NODE_BOXES)

    def readouts(self) -> dict[str, dict]:
        return {r["id"]: r for r in self.page.evaluate("""() => window.app.graph.nodes.flatMap((n) => {
            const el = n.widgets?.find((w) => w.name === 'h3_timing')?.element;
            return el ? [{id: String(n.id), type: n.type, text: el.innerText, connected: el.isConnected,
                          client: el.clientHeight, scroll: el.scrollHeight, cw: el.clientWidth, sw: el.scrollWidth}] : [];
        })""")}

    def shot(self, name: str) -> pathlib.Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"comfyui_{self.version}_{self.mode}_{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def assert_clean(self):
        ours = [e for e in self.errors if "comfy-h3" in e or "h3_" in e]
        assert not ours, ours

    def close(self):
        self.context.close()


FRONTENDS = pytest.mark.parametrize("version", FRONTEND_VERSIONS)
MODES = pytest.mark.parametrize("vue", [False, True], ids=["litegraph", "vue-nodes"])


@FRONTENDS
@MODES
def test_every_template_opens_readable_on_the_first_screen(comfyui_frontends, browser, version, vue):
    """Each template opened as a file in ComfyUI's page on a laptop's first screen (1280 x 720): its saved view
    draws titles and widgets (zoom >= 0.6), no node under the sidebar, the Graph menu, the Run bar or the minimap,
    no node over another. A screenshot of each goes to H3_SCREENSHOTS. With the pickers set to tiny-random the page
    would queue exactly the prompt that ran to an MP4 in test_template_runs_to_mp4_with_tiny_random (every node,
    type and input), so every template runs to an MP4 from each frontend and mode."""
    page = ComfyPage(comfyui_frontends(version), browser, vue=vue, version=version, viewport=FIRST_SCREEN)
    try:
        mask = page.free_mask()
        problems = []
        for name in CORE_TEMPLATES:  # ComfyUI's own graph: its run from the page is test_core_model_template_*
            wf = _core_template_with_files(name)
            page.open_file(name, wf)
            problems += opened_problems(name, page.page, mask)
            page.shot(f"{name}_open")
            queued = page.page.evaluate("async () => (await window.app.graphToPrompt()).output")
            saved = {str(n["id"]): n["type"] for n in wf["nodes"] if n["type"] != "MarkdownNote"}
            if {k: v["class_type"] for k, v in queued.items()} != saved:
                problems.append(f"{name}: the page queues {sorted(queued)}, the template holds {sorted(saved)}")
        for name in TEMPLATES:
            page.open_file(name, _template(name)[1])
            problems += opened_problems(name, page.page, mask)
            page.shot(f"{name}_open")
            # what this page queues once the user has picked tiny-random: the prompt that ran to an MP4
            # (test_template_runs_to_mp4_with_tiny_random), so each template runs to one from this frontend and mode
            queued = page.page.evaluate(PAGE_PROMPT, [_pickers(_tiny_of(name))])
            ran = _with_tiny(*_template(name), _tiny_of(name))[0]
            problems += [f"{name}: {d}" for d in _prompt_differences(queued, ran)]
        assert not problems, "\n".join(problems)
        page.assert_clean()
    finally:
        page.close()


def _core_template_with_files(name: str) -> dict:
    """An h3_core_* template with its loaders on the files this ComfyUI has (what its note asks a user to choose
    first: the frontend flags a file that is not in a loader's list as an error, rightly): the Comfy-Org text
    encoder file of the fixtures on CLIPLoader, the tiny Comfy-Org DiT of the same workflow on H3RemoteModel (the
    VAEs' names are Comfy-Org's, present)."""
    wf = json.loads((EXAMPLES / f"{name}.json").read_text())
    (clip,) = [rel.split("/", 1)[1] for rel in COMFY_ORG_FILES if rel.startswith("text_encoders/")]
    for node in wf["nodes"]:
        if node["type"] == "CLIPLoader":
            node["widgets_values"][0] = clip
        elif node["type"] == "H3RemoteModel":
            node["widgets_values"][0] = NATIVE_REF_DIT if "ref2va" in node["widgets_values"][0] else NATIVE_DIT
        elif node["type"] == "VAELoader":
            assert f"vae/{node['widgets_values'][0]}" in COMFY_ORG_FILES, node
    return wf


def _prompt_differences(queued: dict, ran: dict) -> list[str]:
    """How the prompt a page would queue differs from the one that ran (node ids, types, every input)."""
    out = [f"node {nid} is only in {'the page' if nid in queued else 'the run'}" for nid in sorted(set(queued) ^ set(ran))]
    for nid in sorted(set(queued) & set(ran)):
        q, r = queued[nid], ran[nid]
        if q["class_type"] != r["class_type"]:
            out.append(f"node {nid}: the page queues {q['class_type']}, the run had {r['class_type']}")
            continue
        for name in sorted(set(q["inputs"]) | set(r["inputs"])):
            qv, rv = q["inputs"].get(name, "<absent>"), r["inputs"].get(name, "<absent>")
            if qv != rv:
                out.append(f"{q['class_type']} {nid}.{name}: the page queues {qv!r:.80}, the run had {rv!r:.80}")
    return out


SET_PICKS = """
    for (const node of window.app.graph.nodes) {
        for (const [name, value] of Object.entries(picks[node.type] ?? {})) {
            const w = node.widgets.find((w) => w.name === name);
            w.value = value;
            w.callback?.(value);
        }
    }"""
#: the user's picks on the open graph, then the API prompt the frontend makes of it (what Run would send)
PAGE_PROMPT = """async ([picks]) => {""" + SET_PICKS + """
    return (await window.app.graphToPrompt()).output;
}"""
#: the user's picks, then Run, on the page's clock: ``window.__h3run`` gathers the prompt's h3.timing events, the MP4s
#: its nodes returned, how it ended and when (ms after the Run)
QUEUE_LIKE_A_USER = """async ([picks]) => {
    const { api } = await import('/scripts/api.js');
    const run = window.__h3run = { start: null, end: null, error: null, timings: [], videos: [], t0: null,
                                   done_ms: null };
    api.addEventListener('execution_start', (e) => { run.start = e.detail.prompt_id; });
    api.addEventListener('h3.timing', (e) => { if (e.detail.prompt_id === run.start) run.timings.push(e.detail); });
    api.addEventListener('executed', (e) => {
        if (e.detail.prompt_id !== run.start) return;
        for (const v of e.detail.output?.images ?? []) if (String(v.filename).endsWith('.mp4')) run.videos.push(v.filename);
    });
    for (const kind of ['execution_success', 'execution_error', 'execution_interrupted']) {
        api.addEventListener(kind, (e) => {
            if (e.detail.prompt_id !== run.start) return;
            run.end = kind;
            run.done_ms = performance.now() - run.t0;
            if (kind === 'execution_error') run.error = e.detail.exception_message;
        });
    }""" + SET_PICKS + """
    run.t0 = performance.now();
    await window.app.queuePrompt(0, 1);
}"""


def _queue_and_wait(page: ComfyPage, picks=PICKERS, settle: bool = True) -> dict:
    page.page.evaluate(QUEUE_LIKE_A_USER, [picks])
    page.page.wait_for_function("() => window.__h3run.end !== null", timeout=PROMPT_TIMEOUT * 1000)
    run = page.page.evaluate("() => window.__h3run")
    assert run["end"] == "execution_success", f"{run['end']}: {run['error']}\n{page.server.log_tail()}"
    if settle:
        page.settle(1500)  # the kept preview and the saved video load into their nodes
    return run


def _check_readouts_complete(page: ComfyPage, run: dict) -> dict[str, dict]:
    """Every H3 node of the run shows its figures, wrapped and complete, with what it is about (by node type)."""
    readouts = page.readouts()
    final = {str(t["node"]): t for t in run["timings"]}
    for nid, t in final.items():
        r = readouts[nid]
        assert r["connected"] and r["scroll"] <= r["client"] + 1 and r["sw"] <= r["cw"] + 1, (t["node_type"], r)
        flat = r["text"].replace("\n", " ")
        s = t["summary"]
        if t["node_type"] == "H3RemoteDiT":
            for part in s["status"].split(" · "):
                assert part in flat, (part, flat)
        elif t["node_type"] == "H3LoRA":
            assert flat.startswith("B lora") and s["resolved"] in r["text"].replace("\n", ""), flat
        elif t["node_type"] == "H3RemoteDenoise":
            assert s["schedule"] in flat and "step " not in flat, flat
            p = s.get("preview") or {}
            assert (f"previews: {p['count']} × " in flat) if p.get("count") else p.get("note", "") in flat, flat
        elif t["node_type"] == "H3Decode":
            b = [rec for rec in t["stages"] if rec["machine"] == "B"]
            assert ("B decoded" in flat) == bool(b), flat
        elif t["node_type"] == "H3PromptList":
            assert f"{s['prompts']} prompts" in flat, flat
    return readouts


def _check_panel(page: ComfyPage, rids: list[str], name: str):
    """The H3 tab after the run: the legend, each row named after the workflow, its parts adding up to its total,
    every label inside its chart, and pointing at the denoise bar shows its figures without moving anything."""
    page.page.click(TAB_BUTTON)
    panel = page.page.locator(".h3-panel")
    panel.wait_for()
    legend = panel.locator(".h3-legend").inner_text()
    for words in ("encode", "denoise", "transfer", "idle", "running"):
        assert words in legend, legend
    for rid in rids:
        row = panel.locator(f'.h3-request[data-request-id="{rid}"]')
        row.wait_for()
        page.page.wait_for_function(f"() => document.querySelector('.h3-request[data-request-id=\"{rid}\"]')"
                                    "?.dataset.state === 'done'")
        head = row.locator(".h3-req-head").inner_text()
        assert f"{name}.json" in head, head
        total, parts = page.page.evaluate("""(rid) => {
            const s = document.querySelector(`.h3-request[data-request-id="${rid}"] .h3-req-sum`);
            const p = Object.entries(s.dataset).filter(([k]) => k.startsWith('part_')).map(([, v]) => Number(v));
            return [Number(s.dataset.totalS), p.reduce((a, b) => a + b, 0)];
        }""", rid)
        assert abs(total - parts) <= 1e-6 * max(1.0, total), (rid, total, parts)
    clipped = page.page.evaluate("""() => [...document.querySelectorAll('.h3-panel svg.h3-wf:not(.h3-swatch)')]
        .flatMap((svg) => { const w = Number(svg.getAttribute('width'));
            return [...svg.querySelectorAll('text')].filter((t) => { const b = t.getBBox();
                return b.x < -0.5 || b.x + b.width > w + 0.5; }).map((t) => t.textContent); })""")
    assert not clipped, clipped
    # the panel redraws once more when /history and /h3/timings answer: point at a bar of the settled panel
    assert page.page.evaluate(JS_WAIT_QUIET, [".h3-panel .h3-requests", 800, 15000]), "the panel keeps redrawing"
    row = panel.locator(f'.h3-request[data-request-id="{rids[0]}"]')
    row.scroll_into_view_if_needed()
    before = row.bounding_box()
    bar = row.locator('.h3-bar[data-stage="denoise"] .h3-bar-rect').bounding_box()
    for k in range(8):
        page.page.mouse.move(bar["x"] + bar["width"] * (k % 4 + 0.5) / 4, bar["y"] + bar["height"] / 2)
    page.settle(300)
    assert "denoise on B" in panel.locator(".h3-details").inner_text()
    assert row.bounding_box() == before, "pointing at a bar moved the rows"
    page.shot("panel")


@FRONTENDS
@MODES
def test_panel_shows_the_run_queued_from_the_page(comfyui_frontends, browser, version, vue):
    """ComfyUI's own page: open the turbo template as a file, set the pickers to tiny-random, queue it; after the run
    no node overlaps another (the readouts were reserved, the growing nodes have room), every readout is complete;
    the H3 tab's row for the run holds every stage /h3/timings has, named after the file, totals adding up, labels
    inside the chart; H3RemoteDiT's picker lists the models B reported. Both UI modes, both frontends."""
    server = comfyui_frontends(version)
    page = ComfyPage(server, browser, vue=vue, version=version)
    try:
        page.open_file(BROWSER_TEMPLATE, _template(BROWSER_TEMPLATE)[1])
        den_id = page.page.evaluate("() => String(window.app.graph.nodes.find((n) => n.type === 'H3RemoteDenoise').id)")
        if vue:
            page.page.locator(f'[data-node-id="{den_id}"] .h3-readout').wait_for(state="attached")
        run = _queue_and_wait(page)
        den = next(t for t in run["timings"] if t["node_type"] == "H3RemoteDenoise")
        rid = den["request_id"]
        records = _http_json(server, "GET", f"/api/h3/timings?request_id={rid}")["records"]
        assert {"a_to_b", "denoise", "b_to_a", "decode"} <= {r["stage"] for r in records}, records

        # ---- the graph after the run, as the user sees it
        boxes = page.boxes()
        assert not overlaps(boxes), overlaps(boxes)
        _check_readouts_complete(page, run)
        page.shot(f"{BROWSER_TEMPLATE}_after_run")
        dit = next(t for t in run["timings"] if t["node_type"] == "H3RemoteDiT")
        picker = page.page.evaluate("""() => {
            const w = window.app.graph.nodes.find((n) => n.type === 'H3RemoteDiT').widgets
                .find((w) => w.name === 'model_path');
            return { value: w.value, values: [...w.options.values] };
        }""")
        assert picker == {"value": TINY, "values": dit["summary"]["b_models"]}, picker
        assert FOUND_MODEL in picker["values"]

        # ---- the H3 tab, opened like a user after the run
        _check_panel(page, [rid], BROWSER_TEMPLATE)
        bars = page.page.locator(f'.h3-panel .h3-request[data-request-id="{rid}"] .h3-bar')
        assert sorted(bars.evaluate_all("(gs) => gs.map((g) => g.dataset.stage)")) == \
            sorted(r["stage"] for r in records)
        b_role = page.page.locator(".h3-panel .h3-status .h3-role[data-role='B']").inner_text()
        assert "127.0.0.3" in b_role, b_role
        a_role = page.page.locator(".h3-panel .h3-status .h3-role[data-role='A']")
        assert a_role.get_attribute("data-state") == "ok" and "ComfyUI's process" in a_role.inner_text()
        page.assert_clean()
    finally:
        page.close()
        _http_json(server, "POST", f"/api/settings/{VUE_SETTING}", False)


@pytest.mark.parametrize("version, vue", [(FRONTEND_VERSIONS[0], False), (FRONTEND_VERSIONS[-1], True)],
                         ids=["litegraph-oldest", "vue-nodes-newest"])
def test_batch_template_reads_from_the_page(comfyui_frontends, browser, version, vue):
    """The batch template queued from the page (the oldest frontend's canvas, the newest one's Vue nodes; the batch
    nodes' progress text stays on them in 1.49): H3PromptList shows its readout, every request has its row named
    after the file with its place in the batch, and no node overlaps another. What the page shows of a batch does not
    depend on its size, so besides the pickers the page sets about half the template's canvas (448x256, near its
    shape; the pack rounds to multiples of 32) and 10 of its 50 steps: 4 videos in about 1 min instead of 3 (the
    template as shipped runs to its 4 MP4s, timed, in test_template_runs_to_mp4_with_tiny_random)."""
    name = "h3_t2va_batch"
    picks = {**PICKERS, "H3TextEncode": {"width": 448, "height": 256}, "H3RemoteDenoise": {"steps": 10}}
    page = ComfyPage(comfyui_frontends(version), browser, vue=vue, version=version)
    try:
        page.open_file(name, _template(name)[1])
        run = _queue_and_wait(page, picks)
        canvas = {t["summary"]["canvas"] for t in run["timings"] if t["node_type"] == "H3TextEncode"}
        steps = {t["summary"]["steps_total"] for t in run["timings"] if t["node_type"] == "H3RemoteDenoise"}
        assert canvas == {"448x256"} and max(steps) <= 10, (canvas, steps)  # the page's picks applied
        boxes = page.boxes()
        assert not overlaps(boxes), overlaps(boxes)
        readouts = _check_readouts_complete(page, run)
        pl = next(r for r in readouts.values() if r["type"] == "H3PromptList")
        assert "4 prompts" in pl["text"], pl
        page.shot(f"{name}_after_run")
        rids = sorted({t["request_id"] for t in run["timings"] if t["node_type"] == "H3RemoteDenoise"})
        assert len(rids) == 4, rids
        _check_panel(page, rids, name)
        heads = page.page.locator(".h3-panel .h3-request .h3-req-head").all_inner_texts()
        for k in range(1, 5):
            assert any(f"request {k} of 4" in h for h in heads), heads
        page.assert_clean()
    finally:
        page.close()
        _http_json(page.server, "POST", f"/api/settings/{VUE_SETTING}", False)


#: JS: ms from the Run to now, once the page holds a playable <video> of one of the run's MP4s (a batch's node shows
#: one of its videos at a time), else null
#: JS expression: the <video>s the page holds, in its DOM and in H3SaveVideo's node.imgs (the classic canvas's)
PAGE_VIDEOS = ("[...document.querySelectorAll('video'), ...window.app.graph.nodes.filter((n) => n.type === "
               "'H3SaveVideo').flatMap((n) => n.imgs ?? [])].filter((v) => v.tagName === 'VIDEO')")
JS_VIDEO_SHOWN = """() => {
    const run = window.__h3run;
    if (!run.videos.length) return null;
    const ok = """ + PAGE_VIDEOS + """.some((v) => v.readyState >= 2
        && run.videos.some((f) => decodeURIComponent(v.currentSrc || v.src || '').includes(f)));
    return ok ? performance.now() - run.t0 : null;
}"""
#: JS: two pixels of the classic canvas inside a node's left edge, below its title and just above its bottom: a node
#: drawn at its size has its body's colour at both; a frame drawn before it grew shows the canvas's background below
JS_DRAWN_TO_ITS_BOTTOM = """(type) => {
  const c = window.app.canvas, ds = c.ds, n = window.app.graph.nodes.find((x) => x.type === type);
  const k = c.canvas.width / c.canvas.getBoundingClientRect().width, ctx = c.canvas.getContext('2d');
  const at = (x, y) => [...ctx.getImageData(Math.round((x + ds.offset[0]) * ds.scale * k),
                                            Math.round((y + ds.offset[1]) * ds.scale * k), 1, 1).data];
  const x = n.pos[0] + 3;
  return { top: at(x, n.pos[1] + 8), bottom: at(x, n.pos[1] + n.size[1] - 12), size: [n.size[0], n.size[1]] };
}"""


def _assert_drawn_to_its_bottom(page, node_type: str) -> None:
    """The classic canvas shows ``node_type`` at its size (issue #30: H3SaveVideo's video hung below a node drawn at
    its size before the video came, until something redrew the canvas)."""
    px = page.page.evaluate(JS_DRAWN_TO_ITS_BOTTOM, node_type)
    assert all(abs(a - b) <= 8 for a, b in zip(px["top"], px["bottom"])), (
        f"{node_type} is drawn shorter than its size (the canvas shows a frame from before it grew)", px)


PAGE_WALL_S: dict[str, tuple[float, float]] = {}  # template -> (s to execution_success, s to its video on the page)


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_runs_from_the_page_to_its_video(comfyui_frontends, browser, name, capsys):
    """Each template as a user runs it (issue #30): opened as a file in ComfyUI's page (the frontend ComfyUI 0.33
    installs, classic canvas, a laptop's 1280 x 720 window, the browser open throughout), the model pickers set to the
    tiny model, queued as the Run button does; it succeeds and its video plays in H3SaveVideo. Timed on the page's
    clock from the Run to execution_success and to the playable video, printed (steps as in
    test_template_runs_to_mp4_with_tiny_random: ``H3_TEMPLATE_STEPS=shipped`` for the figures a user meets)."""
    version = _installed_frontend()
    page = ComfyPage(comfyui_frontends(version), browser, vue=False, version=version, viewport=FIRST_SCREEN)
    api, ui = _template(name)
    tiny = _tiny_of(name)
    picks = {k: dict(v) for k, v in _pickers(tiny).items()}
    (den_id,) = _ids(api, "H3RemoteDenoise")
    steps = api[den_id]["inputs"]["steps"]
    if TEMPLATE_STEPS != "shipped" and tiny != TINY_FASTH3:
        steps = min(steps, int(TEMPLATE_STEPS))
        picks["H3RemoteDenoise"] = {"steps": steps}
    try:
        page.open_file(name, ui)
        run = _queue_and_wait(page, picks, settle=False)
        assert len(run["videos"]) == _requests_of(api), run["videos"]
        try:
            shown_ms = page.page.wait_for_function(JS_VIDEO_SHOWN, timeout=60_000).json_value()
        except Exception as exc:  # Playwright's TimeoutError: say what the page holds instead
            held = page.page.evaluate(f"() => {PAGE_VIDEOS}.map((v) => [v.currentSrc || v.src, v.readyState])")
            raise AssertionError(f"no video of the run plays on the page 60 s after it ended: {run['videos']} vs {held}") from exc
        done_s, shown_s = run["done_ms"] / 1000, shown_ms / 1000
        PAGE_WALL_S[name] = (done_s, shown_s)
        page.settle(1500)  # the node as the user sees it once it settled round its video (after the timing)
        _assert_drawn_to_its_bottom(page, "H3SaveVideo")
        page.shot(f"{name}_from_the_page")
        page.assert_clean()
    finally:
        page.close()
    with capsys.disabled():
        print(f"\n[h3] {name} from the page ({version}, classic, {FIRST_SCREEN[0]}x{FIRST_SCREEN[1]}, {steps} steps): "
              f"{done_s:.1f} s to execution_success, {shown_s:.1f} s to its video on the page")


def test_template_wall_times(capsys):
    """The wall time of each template run above, through the API and from the page (printed; the API's asserted per
    template only with H3_TEMPLATE_MAX_S).

    The figures a user meets need the shipped steps: ``H3_TEMPLATE_STEPS=shipped make test-comfyui
    K="template_runs_to_mp4 or from_the_page_to_its_video or wall_times"``. Measured so on 2026-12-03 (2 cores, the
    suite alone), from the page with ComfyUI warm: t2va 52 s, ref2va 50 s, fl2va 55 s, turbo 20 s, FastH3 26 s, the
    batch's 4 videos 131 s; through the API: t2va 45 s, ref2va 48 s, fl2va 53 s, turbo 20 s, batch 122 s, and FastH3
    39 s as the first run (it also starts the embedded Ray cluster and builds tiny-random on A and B). By default (at
    most 3 steps) they take 8-35 s through the API and 17-32 s from the page (the batch about 110 s)."""
    if not WALL_S and not PAGE_WALL_S:
        pytest.skip("no template ran")
    with capsys.disabled():
        print(f"\n[h3] template wall times in real ComfyUI (goal {TEMPLATE_GOAL_S:.0f} s per video): "
              + ", ".join(f"{k} {v:.1f} s" for k, v in WALL_S.items()))
        print("[h3] from the page (Run to execution_success / to its video on the page): "
              + ", ".join(f"{k} {a:.1f} / {b:.1f} s" for k, (a, b) in PAGE_WALL_S.items()))


#: JS: what the page shows of H3RemoteDenoise's preview and H3SaveVideo's video after a run: the images and videos
#: in each node's DOM (Vue nodes), node.imgs, the readout widget's place and height, the node's size.
JS_MEDIA = """() => window.app.graph.nodes.filter((n) => ['H3RemoteDenoise', 'H3SaveVideo'].includes(n.type)).map((n) => {
  const el = document.querySelector(`[data-node-id="${n.id}"]`);
  const vis = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0
      && getComputedStyle(e).visibility !== 'hidden' && getComputedStyle(e).display !== 'none'; };
  const rect = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const w = n.widgets?.find((w) => w.name === 'h3_timing');
  const pw = n.widgets?.find((x) => x.name === '$$canvas-image-preview');
  const ds = window.app.canvas.ds, cr = window.app.canvas.canvas.getBoundingClientRect();
  const videos = [...document.querySelectorAll('video')].filter(vis).map(rect);
  return { id: String(n.id), type: n.type, size: [n.size[0], n.size[1]], pos: [n.pos[0], n.pos[1]],
    node_rect: el ? rect(el) : null,
    dom_imgs: el ? [...el.querySelectorAll('img')].filter(vis).map(rect) : null,
    dom_videos: el ? [...el.querySelectorAll('video')].filter(vis).map(rect) : null,
    all_videos: videos,
    imgs: (n.imgs ?? []).map((i) => [i.tagName, i.naturalWidth ?? i.videoWidth, i.naturalHeight ?? i.videoHeight]),
    image_index: n.imageIndex ?? null, images: (n.images ?? []).length,
    widgets: (n.widgets ?? []).map((x) => ({ name: x.name, type: x.type, y: x.y ?? x.last_y ?? null,
      h: x.computedHeight ?? null, size: x.computeSize ? x.computeSize(n.size[0]) : null,
      lay: x.computeLayoutSize ? x.computeLayoutSize(n) : null })),
    readout: w?.element ? { rect: rect(w.element), client: w.element.clientHeight, scroll: w.element.scrollHeight } : null,
    // the classic canvas draws node.imgs in its image widget: where that widget starts on the page
    canvas_preview_top: pw ? (n.pos[1] + (pw.y ?? pw.last_y) + ds.offset[1]) * ds.scale + cr.top : null,
  };
})"""


@FRONTENDS
@MODES
def test_previews_in_their_place_after_a_run(comfyui_frontends, browser, version, vue):
    """Issue #30 (previews in their place), with the frontend's Live preview method set to latent2rgb as a user
    turns previews on: after a run from the page H3RemoteDenoise shows its last preview once (Vue nodes of 1.58 drew
    the pack's kept output image beside the frontend's own kept preview) and a readout that shows all its lines;
    H3SaveVideo shows one video, inside its node's box, and no stale node.imgs beside it."""
    server = comfyui_frontends(version)
    _http_json(server, "POST", f"/api/settings/{PREVIEW_SETTING}", "latent2rgb")
    page = ComfyPage(server, browser, vue=vue, version=version)
    try:
        page.open_file(BROWSER_TEMPLATE, _template(BROWSER_TEMPLATE)[1])
        page.settle(800)
        run = _queue_and_wait(page)
        page.settle(1500)
        after = {n["type"]: n for n in page.page.evaluate(JS_MEDIA)}
        boxes = {b["type"]: b["box"] for b in page.boxes()}
        page.shot("media_after")
        den, save = after["H3RemoteDenoise"], after["H3SaveVideo"]
        (timing,) = [t for t in run["timings"] if t["node_type"] == "H3RemoteDenoise"]
        assert timing["summary"]["preview"].get("count", 0) >= 1, timing["summary"]["preview"]  # previews were on
        readout = den["readout"]
        assert readout["scroll"] <= readout["client"] + 1, ("the readout cuts its last lines", readout)
        if vue:  # the preview is an <img> of the node's DOM
            assert len(den["dom_imgs"]) == 1, ("H3RemoteDenoise shows its preview other than once", den)
            image_top = den["dom_imgs"][0][1]
        else:  # the canvas draws node.imgs in the node's image widget
            assert [tag for tag, *_ in den["imgs"]] == ["IMG"], ("H3RemoteDenoise keeps other than one image", den)
            image_top = den["canvas_preview_top"]
        # the preview starts below the readout's last line (page px): the classic canvas drew the readout 10 canvas
        # units lower than its slot, 6.3 px over the image at 63 % (issue #30)
        print(f"\n[h3] {version} {page.mode}: readout bottom {readout['rect'][3]:.1f}, preview top {image_top:.1f}")
        assert readout["rect"][3] <= image_top + 1, ("the readout runs under the preview", readout, image_top)
        videos = [v for v in save["all_videos"]
                  if boxes["H3SaveVideo"][0] - 2 <= v[0] and v[2] <= boxes["H3SaveVideo"][2] + 2]
        assert len(videos) == 1, (save, boxes["H3SaveVideo"])
        (l, t, r, b), (bl, bt, br, bb) = videos[0], boxes["H3SaveVideo"]
        assert bl - 2 <= l and r <= br + 2 and bt - 2 <= t and b <= bb + 2, ("video outside its node", videos[0], boxes)
        assert all(tag == "VIDEO" for tag, *_ in save["imgs"]), ("stale node.imgs beside the video", save["imgs"])
        if not vue:
            _assert_drawn_to_its_bottom(page, "H3SaveVideo")
        page.assert_clean()
    finally:
        page.close()
        _http_json(server, "POST", f"/api/settings/{VUE_SETTING}", False)
        _http_json(server, "POST", f"/api/settings/{PREVIEW_SETTING}", "default")


CORE_T2V_TEMPLATE = "video_minimax_h3_t2v"  # ComfyUI's own template: its UNETLoader sits inside a subgraph
MISSING_MODELS_SETTING = "Comfy.Workflow.ShowMissingModelsWarning"
#: enters the subgraph that holds the UNETLoader, puts that node at zoom 1 in the middle of the canvas, and says
#: what it is linked to (its MODEL output's targets) and where a user right-clicks it (its title, in page pixels)
JS_ENTER_UNETLOADER = """async () => {
  const app = window.app;
  const holder = app.graph.nodes.find((n) => n.subgraph?.nodes?.some((m) => m.type === 'UNETLoader'));
  app.canvas.openSubgraph(holder.subgraph, holder);
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const g = app.canvas.graph;
  const node = g.nodes.find((n) => n.type === 'UNETLoader');
  const ds = app.canvas.ds, rect = app.canvas.canvas.getBoundingClientRect();
  ds.scale = 1;
  ds.offset[0] = rect.width / 2 - node.pos[0] - node.size[0] / 2;
  ds.offset[1] = rect.height / 2 - node.pos[1] - node.size[1] / 2;
  app.canvas.setDirty(true, true);
  const link = (id) => g.getLink?.(id) ?? g.links?.get?.(id) ?? g.links?.[id];
  const feed = (n) => { const l = link(n.inputs.find((i) => i.name === 'unet_name')?.link); return l ? [String(l.origin_id), l.origin_slot] : null; };
  return { holder: String(holder.id), graph_is_subgraph: g !== app.rootGraph, id: String(node.id), feed: feed(node),
           unet_name: node.widgets.find((w) => w.name === 'unet_name').value,
           targets: node.outputs[0].links.map((id) => [String(link(id).target_id), link(id).target_slot]).sort() };
}"""
JS_TITLE_POINT = """(id) => {
  const app = window.app, ds = app.canvas.ds, rect = app.canvas.canvas.getBoundingClientRect();
  const el = document.querySelector(`[data-node-id="${id}"]`);
  if (el && el.getBoundingClientRect().width > 0) {
    const r = el.getBoundingClientRect();
    return [r.left + Math.min(60, r.width / 4), r.top + 12];
  }
  const node = app.canvas.graph.getNodeById(Number(id));
  const title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  return [(node.pos[0] + 60 + ds.offset[0]) * ds.scale + rect.left,
          (node.pos[1] - title / 2 + ds.offset[1]) * ds.scale + rect.top];
}"""
JS_AFTER_SWAP = """async () => {
  const app = window.app, g = app.canvas.graph;
  const link = (id) => g.getLink?.(id) ?? g.links?.get?.(id) ?? g.links?.[id];
  const every = [];
  const walk = (graph) => { for (const n of graph.nodes) { every.push(n.type); if (n.subgraph) walk(n.subgraph); } };
  walk(app.rootGraph);
  const made = g.nodes.filter((n) => n.type === 'H3RemoteModel');
  const out = (n) => n.outputs.findIndex((o) => o.type === 'MODEL');
  const feed = (n) => { const l = link(n.inputs.find((i) => i.name === 'unet_name')?.link); return l ? [String(l.origin_id), l.origin_slot] : null; };
  return {
    types: every,
    made: made.map((n) => ({ id: String(n.id), pos: [n.pos[0], n.pos[1]], feed: feed(n),
                             unet_name: n.widgets.find((w) => w.name === 'unet_name').value,
                             targets: (n.outputs[out(n)].links ?? []).map((id) => [String(link(id).target_id),
                                                                                   link(id).target_slot]).sort() })),
    prompt: (await app.graphToPrompt()).output,
  };
}"""


def _tiny_core_template_prompt(prompt: dict) -> dict:
    """ComfyUI's ``video_minimax_h3_t2v`` (or one of the pack's ``h3_core_*``) as the page's API prompt, with what a
    tiny run needs: the text encoder and the VAEs from the test-only tiny nodes (ComfyUI's CLIPLoader and VAELoader
    build them at their released sizes), the DiT on B the tiny Comfy-Org file of the same workflow in fp32, the
    turbo LoRA a tiny one, and the smallest canvas (0.1 MP or 64 x 64, 5 or 22 frames, 2 steps). Everything else
    (the subgraph's sampler, guider, scheduler, switches, math nodes, VAEDecode, VAEDecodeAudio, CreateVideo,
    SaveVideo) is the template's."""
    api = copy.deepcopy(prompt)
    for nid, node in api.items():
        kind, inputs = node["class_type"], node["inputs"]
        if kind == "CLIPLoader":
            api[nid] = {"class_type": "H3TestTinyCLIP", "inputs": {"seed": 0}}
        elif kind == "VAELoader":
            api[nid] = {"class_type": "H3TestTinyVAE",
                        "inputs": {"kind": "audio" if "audio" in str(inputs.get("vae_name")) else "video", "seed": 0}}
        elif kind == "H3RemoteModel":  # the tiny file of the same workflow (a ref2va file: the ref2va one)
            ref = "ref2va" in str(inputs.get("unet_name"))
            inputs.update(unet_name=NATIVE_REF_DIT if ref else NATIVE_DIT, dtype="float32")
        elif kind in ("MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo"):  # literal sizes (ours): the smallest
            for key, value in (("width", 64), ("height", 64), ("length", 22)):
                if not isinstance(inputs.get(key), list):
                    inputs[key] = value
        elif kind == "BasicScheduler" and not isinstance(inputs.get("steps"), list):
            inputs["steps"] = 2
        elif kind == "LoraLoaderModelOnly":
            inputs["lora_name"] = CORE_LORAS[0]
        elif kind == "PrimitiveInt":
            inputs["value"] = 2
        elif kind == "PrimitiveFloat":
            inputs["value"] = 0.2
        elif kind == "ResolutionSelector":
            inputs["megapixels"] = 0.1
    return api


@FRONTENDS
@MODES
def test_core_model_swap_from_unetloader_context_menu(comfyui_frontends, browser, version, vue):
    """Issue #28: ComfyUI's own ``video_minimax_h3_t2v`` template as the server serves it, its subgraph entered
    (``canvas.openSubgraph``, what the subgraph node's enter button calls; the view then centred on the node), its
    UNETLoader right-clicked on its title (a real right-click, the canvas's in the classic mode, the Vue node's in
    Vue-node mode) and "Run on machine B" clicked in the node's context menu: the subgraph then holds no UNETLoader
    but an H3RemoteModel at the same place with the same unet_name, fed by the same subgraph input, whose MODEL output
    goes to the same nodes and slots, and the API prompt the page makes (graphToPrompt) has that H3RemoteModel with
    that unet_name, its former MODEL consumers reading from it; one undo gives the UNETLoader back. Screenshots
    before, with the menu open and after go to H3_SCREENSHOTS. The page's prompt after the swap, queued with the tiny
    files (:func:`_tiny_core_template_prompt`), gives a video, its sampler's forwards on B."""
    server = comfyui_frontends(version)
    wf = _http_json(server, "GET", f"/templates/{CORE_T2V_TEMPLATE}.json")  # as the Templates browser gets it
    _http_json(server, "POST", f"/api/settings/{MISSING_MODELS_SETTING}", False)  # its files are not on this machine
    page = ComfyPage(server, browser, vue=vue, version=version)
    try:
        page.page.evaluate("async (wf) => { await window.app.loadGraphData(wf); }", wf)
        page.settle(800)
        page.page.keyboard.press("Escape")  # any dialog the frontend opened on load
        before_prompt = page.page.evaluate("async () => (await window.app.graphToPrompt()).output")
        old = page.page.evaluate(JS_ENTER_UNETLOADER)
        assert old["graph_is_subgraph"] and old["targets"], old
        if vue:
            page.page.wait_for_selector(f'[data-node-id="{old["id"]}"]', state="visible")
        page.settle(800)
        old_pos = page.page.evaluate("(id) => [...window.app.canvas.graph.getNodeById(Number(id)).pos]", old["id"])
        page.shot("core_model_swap_before")
        x, y = page.page.evaluate(JS_TITLE_POINT, old["id"])
        page.page.mouse.click(x, y, button="right")
        entry = page.page.get_by_text("Run on machine B", exact=True)
        entry.first.wait_for(state="visible", timeout=10000)
        page.shot("core_model_swap_menu")
        entry.first.click()
        page.page.wait_for_function("() => !window.app.canvas.graph.nodes.some((n) => n.type === 'UNETLoader')")
        page.settle(800)
        page.shot("core_model_swap_after")
        after = page.page.evaluate(JS_AFTER_SWAP)
        assert "UNETLoader" not in after["types"], after["types"]
        (made,) = after["made"]
        assert made["unet_name"] == old["unet_name"], (made, old)
        assert made["pos"] == old_pos, (made, old_pos)
        assert made["targets"] == old["targets"], (made, old)
        # the subgraph's unet_name input (the widget on the subgraph's node outside) now feeds the new node
        assert old["feed"] == ["-10", 7] and made["feed"] == old["feed"], (made, old)
        # the API prompt: the UNETLoader's place in it taken by the H3RemoteModel, its consumers reading from it
        prompt = after["prompt"]
        (old_key,) = [k for k, v in before_prompt.items() if v["class_type"] == "UNETLoader"]
        (new_key,) = [k for k, v in prompt.items() if v["class_type"] == "H3RemoteModel"]
        assert not [k for k, v in prompt.items() if v["class_type"] == "UNETLoader"]
        assert prompt[new_key]["inputs"]["unet_name"] == old["unet_name"], prompt[new_key]
        consumers = {(k, name) for k, v in before_prompt.items() for name, x in v["inputs"].items()
                     if isinstance(x, list) and x[:1] == [old_key]}
        assert consumers, before_prompt
        for k, name in consumers:
            assert prompt[k]["inputs"][name] == [new_key, 0], (k, name, prompt[k])
        # queued with tiny files (the page's own prompt, its loaders pointed at the tiny fixtures): a video
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
            pid, messages, entry = pool.submit(asyncio.run, _run(server, _tiny_core_template_prompt(prompt))).result()
        _ok(messages, pid)
        (saved,) = [o for o in entry["outputs"].values() if o.get("images")]
        (video,) = saved["images"]
        facts = _mp4_facts(server.output / video["subfolder"] / video["filename"])
        assert facts["codecs"] == {"video": "h264", "audio": "aac"} and facts["frames"] > 0, facts
        timings = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
        assert timings and timings[0]["stages"][0]["info"]["forwards"] > 0, timings
        # the swap is one undo step: one undo gives the UNETLoader back, and no H3RemoteModel
        page.page.evaluate("async () => { await window.app.extensionManager.workflow.activeWorkflow.changeTracker"
                           ".undo(); }")
        page.settle(800)
        undone = page.page.evaluate(JS_AFTER_SWAP)["types"]
        assert "UNETLoader" in undone and "H3RemoteModel" not in undone, undone
        page.assert_clean()
    finally:
        page.close()
        _http_json(server, "POST", f"/api/settings/{VUE_SETTING}", False)
        _http_json(server, "POST", f"/api/settings/{MISSING_MODELS_SETTING}", True)


# ------------------------------------------------------------------------------------------------ core templates
def test_core_model_node_snapshot_matches_comfyui(comfyui):
    """scripts/core_nodes.json (the slots of ComfyUI's own nodes the h3_core_* templates are built from) is what
    this ComfyUI's /object_info says of them: the same inputs in the same order and kind, the same outputs."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import snapshot_core_nodes
    finally:
        sys.path.remove(str(REPO / "scripts"))
    live = snapshot_core_nodes.snapshot(_http_json(comfyui, "GET", "/object_info"))
    kept = json.loads((REPO / "scripts" / "core_nodes.json").read_text())["nodes"]
    changed = sorted(t for t in set(live) | set(kept) if live.get(t) != kept.get(t))
    assert not changed, (f"ComfyUI's {changed} differ from scripts/core_nodes.json: run scripts/snapshot_core_nodes.py "
                         "and scripts/make_example_workflows.py")


@pytest.mark.parametrize("name", CORE_TEMPLATES)
def test_core_model_template_runs_to_mp4_from_the_page(comfyui_frontends, browser, name):
    """Each h3_core_* template (ComfyUI's own H3 graph with H3RemoteModel in UNETLoader's place) opened as a file in
    ComfyUI's page (the installed frontend, classic canvas): the page's API prompt (graphToPrompt, what Run sends)
    holds every node of the template with the values it was saved with, and, queued with the tiny files
    (:func:`_tiny_core_template_prompt`: the test's tiny text encoder and VAEs, the tiny Comfy-Org file of the same
    workflow on B, 64 x 64, 22 frames, 2 steps), gives an H.264 + AAC MP4 whose sampler's forwards ran on B."""
    version = _installed_frontend()
    server = comfyui_frontends(version)
    wf = json.loads((EXAMPLES / f"{name}.json").read_text())
    _http_json(server, "POST", f"/api/settings/{MISSING_MODELS_SETTING}", False)  # A's real files are not here
    page = ComfyPage(server, browser, vue=False, version=version)
    try:
        page.open_file(name, wf)
        page.page.keyboard.press("Escape")
        prompt = page.page.evaluate("async () => (await window.app.graphToPrompt()).output")
        page.assert_clean()
    finally:
        page.close()
        _http_json(server, "POST", f"/api/settings/{MISSING_MODELS_SETTING}", True)
    saved = {str(n["id"]): n for n in wf["nodes"] if n["type"] != "MarkdownNote"}
    assert {k: v["class_type"] for k, v in prompt.items()} == {k: n["type"] for k, n in saved.items()}, prompt
    (remote,) = _ids(prompt, "H3RemoteModel")
    assert prompt[remote]["inputs"]["unet_name"] == saved[remote]["widgets_values"][0], prompt[remote]
    (enc,) = _ids(prompt, "MiniMaxH3ReferenceToVideo") or _ids(prompt, "MiniMaxH3ImageToVideo")
    assert [prompt[enc]["inputs"][k] for k in ("prompt", "width", "height", "length")] == \
        saved[enc]["widgets_values"][:4], prompt[enc]
    (sched,) = _ids(prompt, "BasicScheduler")
    assert prompt[sched]["inputs"]["steps"] == saved[sched]["widgets_values"][1]
    if "r2va" in name:  # the reference image reaches the autogrow input the frontend names ref_images.ref_image_0
        assert isinstance(prompt[enc]["inputs"].get("ref_images.ref_image_0"), list), prompt[enc]

    api = _tiny_core_template_prompt(prompt)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
        pid, messages, entry = pool.submit(asyncio.run, _run(server, api)).result()
    _ok(messages, pid)
    (save,) = _ids(api, "SaveVideo")
    (video,) = entry["outputs"][save]["images"]
    facts = _mp4_facts(server.output / video["subfolder"] / video["filename"])
    assert facts["codecs"] == {"video": "h264", "audio": "aac"}, facts
    assert (facts["width"], facts["height"], facts["frames"]) == (64, 64, 22), facts
    (sampler,) = _ids(api, "SamplerCustomAdvanced")
    timings = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
    assert timings and {t["node"] for t in timings} == {sampler}, timings
    info = timings[-1]["stages"][0]["info"]
    # the worker by its actor name (H3RemoteModel's actor_name is the pattern h3_dit*: not a name)
    assert info["forwards"] >= 2 and info["worker"] and "*" not in info["worker"], info
    print(f"core_model template {name}: {info['forwards']} forwards on B ({info['worker']}), "
          f"{timings[-1]['stages'][0]['note']}")
