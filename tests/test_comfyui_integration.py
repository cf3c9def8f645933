"""The pack inside a real ComfyUI: loading, routes, a t2va prompt over HTTP + websocket, validation, interrupt.

ComfyUI is not on PyPI, so this needs a checkout of its public source: set ``COMFYUI_DIR`` to it (and
``COMFYUI_PYTHON`` to the interpreter of its environment, which needs ComfyUI's requirements plus this pack's).
Without ``COMFYUI_DIR`` every test here is skipped. The server runs as a subprocess on a free loopback port with
its output, input, temp and user folders and its database under pytest's tmp folder; the pack is added through an
``--extra-model-paths-config`` YAML (``custom_nodes``) pointing at a folder that holds a ``comfy-h3`` symlink to this
repository, and only this pack is loaded. ``H3RemoteDiT`` with ``cluster_address`` ``local`` starts the embedded
two-node Ray cluster inside the ComfyUI process; ComfyUI and everything it started are killed at the end.

``H3_COMFYUI_TRACE_OUT=<file>`` also writes the websocket messages of the successful run there (that is how
``tests/web/fixtures/comfyui_ws_h3_trace.jsonl`` was recorded).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.skipif(not os.environ.get("COMFYUI_DIR"), reason="COMFYUI_DIR is not set")

REPO = pathlib.Path(__file__).resolve().parents[1]
PACK = "comfy-h3"
WORKFLOW = REPO / "example_workflows" / "h3_t2va.json"
START_TIMEOUT = float(os.environ.get("H3_COMFYUI_START_TIMEOUT", "300"))
PROMPT_TIMEOUT = float(os.environ.get("H3_COMFYUI_PROMPT_TIMEOUT", "900"))
HTTP_TIMEOUT = 60.0
TERMINAL = ("execution_success", "execution_error", "execution_interrupted")
H3_NODES = {"1": "H3LoadEncoders", "2": "H3RemoteDiT", "3": "H3TextEncode", "5": "H3RemoteDenoise",
            "6": "H3Decode", "7": "H3SaveVideo"}


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
                 packs: pathlib.Path):
        self.proc, self.base, self.log, self.output, self.packs = proc, base, log, output, packs

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


@pytest.fixture(scope="module")
def comfyui(tmp_path_factory):
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"]).resolve()
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    assert (comfy_dir / "main.py").is_file(), f"COMFYUI_DIR={comfy_dir} holds no main.py"
    root = tmp_path_factory.mktemp("comfyui")
    packs = root / "packs"
    packs.mkdir()
    (packs / PACK).symlink_to(REPO, target_is_directory=True)
    dirs = {name: root / name for name in ("output", "input", "temp", "user")}
    for d in dirs.values():
        d.mkdir()
    yaml = root / "extra_model_paths.yaml"
    yaml.write_text(f"comfy_h3_test:\n  custom_nodes: {packs}\n")
    port = _free_port()
    cmd = [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--disable-auto-launch",
           "--extra-model-paths-config", str(yaml), "--disable-all-custom-nodes", "--whitelist-custom-nodes", PACK,
           "--output-directory", str(dirs["output"]), "--input-directory", str(dirs["input"]),
           "--temp-directory", str(dirs["temp"]), "--user-directory", str(dirs["user"]),
           "--database-url", f"sqlite:///{root / 'comfyui.db'}"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0")
    log = root / "comfyui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=comfy_dir, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = ComfyUI(proc, f"http://127.0.0.1:{port}", log, dirs["output"], packs)
    try:
        _wait_ready(server)
        yield server
    finally:
        server.stop()


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
    from comfy_h3_nodes.runner import load_workflow

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
        if event == 3:  # progress_text: [u32 len][node id][text], as ComfyUI's frontend decodes it
            (n,) = struct.unpack(">I", msg.data[4:8])
            return {"type": "progress_text",
                    "data": {"nodeId": msg.data[8:8 + n].decode(), "text": msg.data[8 + n:].decode()}}
    return None


async def _run(server: ComfyUI, api: dict, ui: dict | None = None, on_message=None, timeout: float = PROMPT_TIMEOUT):
    """Queue ``api`` and record the websocket until the prompt ends: ``(prompt_id, messages, history entry)``."""
    import aiohttp

    cid = uuid.uuid4().hex
    messages: list[dict] = []
    tmo = aiohttp.ClientTimeout(total=None, sock_connect=HTTP_TIMEOUT, sock_read=HTTP_TIMEOUT)
    async with aiohttp.ClientSession(timeout=tmo) as http:
        async with http.ws_connect(f"{server.base.replace('http', 'ws', 1)}/ws?clientId={cid}", heartbeat=20) as ws:
            body = {"prompt": api, "client_id": cid}
            if ui is not None:
                body["extra_data"] = {"extra_pnginfo": {"workflow": ui}}
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
        assert {"connected", "cluster", "nodes", "actors", "error", "time"} <= set(st)
    status, ctype, body = asyncio.run(_get(comfyui, "/api/h3/timings"))
    assert status == 200 and "json" in ctype
    assert isinstance(json.loads(body)["records"], list)


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
    assert {"2", "5", "6", "7"} <= executed  # H3RemoteDiT is never cached (IS_CHANGED), so neither is what follows

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
    texts = [m["data"] for m in messages if m["type"] == "progress_text" and m["data"]["nodeId"] == "2"]
    assert texts and "B 127.0.0.3" in texts[-1]["text"]

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


def test_bad_inputs_are_refused_by_post_prompt(comfyui, tiny_ckpt):
    api, _ = _prompt(tiny_ckpt, width=500)
    status, answer = asyncio.run(_post_prompt(comfyui, api))
    assert status == 400, answer
    errs = answer["node_errors"]["3"]
    assert errs["class_type"] == "H3TextEncode"
    details = [e["details"] for e in errs["errors"] if e["type"] == "custom_validation_failed"]
    assert details and all("width 500 is not a multiple of 32; nearest valid: 480 or 512" in d for d in details)

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
