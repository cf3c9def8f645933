"""Two machines in two network namespaces joined by a veth pair (A 10.77.0.1/24, B 10.77.0.2/24).

A's namespace runs ``cluster start-head`` (token auth), B's runs ``remote_worker setup --allow-cpu`` with the tiny
checkpoint; a driver in A's namespace finds the named actor and runs a tiny request through it. Then a node and a
setup with the wrong token are refused, and ``remote_worker stop`` plus ``cluster stop`` leave no process of ours.
Last, on a second pair of nodes, the veth link goes down while B denoises: the driver's request ends with a clear
error within a bound (A's link probe: about 10 s, see docs/failure_modes.md), and B is ended by pid.

Needs root (``ip netns add``); skipped with the reason otherwise. Separate from the session's embedded cluster: its
own namespaces, ports, Ray temp dirs and state dirs. Every subprocess is bounded; the module takes about two minutes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A_IP, B_IP, PORT = "10.77.0.1", "10.77.0.2", 6390
HEAD = f"{A_IP}:{PORT}"
TAG = f"{os.getpid() % 100000}"
NS_A, NS_B = f"h3t{TAG}a", f"h3t{TAG}b"
IF_A, IF_B = f"h3v{TAG}a", f"h3v{TAG}b"

DRIVER = r'''
import json, os, sys, time
addr, tok, ckpt, name = sys.argv[1:5]
os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": tok, "HF_HUB_OFFLINE": "1"})
t0 = time.time()
import torch
torch.set_num_threads(1)
from comfy_h3_nodes.cluster import ray_cluster as cl
cl.connect(addr, token_file=tok, node_ip=addr.split(":")[0], timeout=60)
import ray
import comfy_h3_nodes.placement
from comfy_h3_nodes.engine.executor import H3Executor
from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts
from comfy_h3_nodes.engine.contract.request import H3Request
ray.get_actor(name, namespace="comfy_h3")  # the named actor setup started on B is there
from comfy_h3_nodes.engine.a_side.side import ASide
ex = H3Executor(ASide(ckpt, dtype="float32"), BConfig(ckpt, dtype="float32", threads=1, name=name),
                timeouts=Timeouts(start=60, health=10, encode=60, handoff=60, stall=60, decode=60, poll=0.05))
ex.start()
res = ex.generate(H3Request(prompt="a robot dances", height=64, width=64, num_frames=124, steps=2, seed=3))
h = ex.check_health()
# an actor a driver on A creates on B with a path outside B's roots is refused by B itself (the node's H3_MODEL_ROOTS)
from remote_worker.actor import start_dit
try:  # refused by the check on B's node before the worker starts (the worker's own load checks the same)
    rogue = start_dit({"name": "h3_rogue", "max_restarts": 0, "model_dir": sys.argv[5], "partition": "transformer",
                       "dtype": "float32", "threads": 1}, detached=False)
    ray.get(rogue.ping.remote(), timeout=90)
    refused = ""
except Exception as exc:
    refused = str(exc)
print(json.dumps({"refused": refused,"frames": list(res.media.frames.shape), "audio": list(res.media.audio.shape),
                  "b_node": h["B"]["node_ip"], "b_pid": h["B"]["pid"], "a_node": ex.topology.a.ip,
                  "stages": {r.stage: r.node for r in res.records}, "recent": [r["request_id"] for r in h["B"]["recent"]],
                  "seconds": round(time.time() - t0, 2)}))
ex.shutdown()
'''


# A driver on A starts a long request, prints STEP2 once B reports its third step (the test then cuts the link) and
# prints how the request ended. It leaves with os._exit: a clean ray.shutdown could wait on the lost node.
LINK_DRIVER = r"""
import json, os, sys, time
addr, tok, ckpt, name = sys.argv[1:5]
os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": tok, "HF_HUB_OFFLINE": "1"})
import torch
torch.set_num_threads(1)
from comfy_h3_nodes.cluster import ray_cluster as cl
cl.connect(addr, token_file=tok, node_ip=addr.split(":")[0], timeout=60)
import comfy_h3_nodes.placement
from comfy_h3_nodes.engine.executor import H3Executor
from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts
from comfy_h3_nodes.engine.contract.request import H3Request
from comfy_h3_nodes.engine.a_side.side import ASide
ex = H3Executor(ASide(ckpt, dtype="float32"), BConfig(ckpt, dtype="float32", threads=1, name=name),
                timeouts=Timeouts(start=60, health=10, encode=60, handoff=60, stall=120, decode=60, poll=0.05))
ex.start()
req = H3Request(prompt="a robot dances", height=64, width=64, num_frames=124, steps=200, seed=5)
seen = [0]
def on_step(ev):
    seen[0] = ev.index + 1
    if ev.index == 2:
        print("STEP2", req.request_id, time.time(), flush=True)
fut = ex.submit(req, on_step=on_step)
try:
    fut.result(timeout=600)
    out = {"error": None, "message": ""}
except BaseException as exc:
    out = {"error": type(exc).__name__, "message": str(exc),
           "h3": [c.__name__ for c in type(exc).__mro__ if c.__name__ in ("H3Error", "H3Timeout")]}
out.update(t_end=time.time(), request_id=req.request_id, steps_seen=seen[0])
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)
"""

def _sh(*cmd, timeout=20, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=check)


def _env(tmp: str, side: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=REPO, H3_STATE_DIR=os.path.join(tmp, f"state_{side}"), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run_in(ns: str, args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    out = subprocess.run(["ip", "netns", "exec", ns, *args], capture_output=True, text=True, timeout=timeout,
                         env=env, cwd=REPO)
    out.seconds = time.monotonic() - t0
    return out


def ns_pids(ns: str) -> list[str]:
    return _sh("ip", "netns", "pids", ns, check=False).stdout.split()


@pytest.fixture(scope="module")
def netns():
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    made = []
    try:
        for ns in (NS_A, NS_B):
            r = _sh("ip", "netns", "add", ns, check=False)
            if r.returncode != 0:
                pytest.skip(f"`ip netns add` failed: {r.stderr.strip()}")
            made.append(ns)
        for cmd in (["ip", "link", "add", IF_A, "type", "veth", "peer", "name", IF_B],
                    ["ip", "link", "set", IF_A, "netns", NS_A], ["ip", "link", "set", IF_B, "netns", NS_B],
                    ["ip", "-n", NS_A, "addr", "add", f"{A_IP}/24", "dev", IF_A],
                    ["ip", "-n", NS_B, "addr", "add", f"{B_IP}/24", "dev", IF_B],
                    ["ip", "-n", NS_A, "link", "set", IF_A, "up"], ["ip", "-n", NS_B, "link", "set", IF_B, "up"],
                    ["ip", "-n", NS_A, "link", "set", "lo", "up"], ["ip", "-n", NS_B, "link", "set", "lo", "up"]):
            r = _sh(*cmd, check=False)
            if r.returncode != 0:
                pytest.skip(f"could not build the veth pair ({' '.join(cmd)}): {r.stderr.strip()}")
        tmp = tempfile.mkdtemp(prefix="h3ns_", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
        yield tmp
    finally:
        from comfy_h3_nodes.cluster import ray_node as rn

        if "tmp" in locals():
            for side in ("ra", "rb", "rbad", "rbad2", "ra2", "rb2"):  # whatever a failed test left running
                rn.stop_node(os.path.join(tmp, side), grace=3)
        for ns in made:
            _sh("ip", "netns", "del", ns, check=False)  # takes the veth pair with it
        _sh("ip", "link", "del", IF_A, check=False)
        if "tmp" in locals():
            shutil.rmtree(tmp, ignore_errors=True)


def start_cluster(tmp: str, ckpt: str, token: str, ra: str, rb: str, port: int):
    """A's head (``cluster start-head``) and B's DiT node (``remote_worker setup``) in their namespaces."""
    head_addr = f"{A_IP}:{port}"
    head = run_in(NS_A, [sys.executable, "-m", "comfy_h3_nodes", "cluster", "start-head", "--iface", IF_A,
                         "--port", str(port), "--token-file", token, "--object-store-mb", "96",
                         "--temp-dir", os.path.join(tmp, ra), "--num-cpus", "2", "--json"],
                  _env(tmp, "a"), timeout=90)
    assert head.returncode == 0, head.stdout + head.stderr
    assert json.loads(head.stdout.strip().splitlines()[-1]) == {"address": head_addr, "token_file": token}
    setup = run_in(NS_B, [sys.executable, "-m", "remote_worker", "setup", "--allow-cpu", "--head", head_addr,
                          "--model-path", ckpt, "--model-root", os.path.join(tmp, "models"), "--iface", IF_B,
                          "--token-file", token, "--object-store-mb", "96", "--temp-dir", os.path.join(tmp, rb),
                          "--dtype", "float32", "--threads", "1", "--num-cpus", "2", "--json"],
                   _env(tmp, "b"), timeout=150)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    print(f"[timing] head {head.seconds:.1f} s, setup {setup.seconds:.1f} s:", *[ln for ln in (head.stdout + setup.stdout).splitlines() if " in " in ln and " s" in ln])
    return head, setup


@pytest.fixture(scope="module")
def cluster(netns):
    """A's head and B's DiT node, started by our two command lines."""
    from comfy_h3_nodes.engine.model.tiny import build_tiny_checkpoint

    tmp = netns
    ckpt = build_tiny_checkpoint(os.path.join(tmp, "models", "tiny"), seed=0)
    token = os.path.join(tmp, "token")  # start-head generates it
    t0 = time.monotonic()
    head, setup = start_cluster(tmp, str(ckpt), token, "ra", "rb", PORT)
    assert oct(os.stat(token).st_mode & 0o777) == "0o600"
    assert f"python -m remote_worker setup --head {HEAD}" in head.stdout
    return {"tmp": tmp, "ckpt": str(ckpt), "token": token, "head": head, "setup": setup,
            "start_s": time.monotonic() - t0}


def test_setup_prints_preflight_and_the_node_values(cluster):
    out = cluster["setup"].stdout
    assert re.search(r"preflight: \d+ passed, 0 failed", out), out
    for name in ("interface", "route to A", "token accepted", "packages", "model folder", "model roots"):
        assert any(ln.strip().startswith("PASS") and name in ln for ln in out.splitlines()), name
    assert "warm-up: t2va" in out
    values = json.loads(out.strip().splitlines()[-1])
    assert values["node_ip"] == B_IP
    assert values["h3_remote_dit"] == {"cluster_address": HEAD, "actor_name": "h3_dit", "namespace": "comfy_h3",
                                       "model_path": cluster["ckpt"], "partition": "transformer",
                                       "dtype": "float32", "attention_backend": "sdpa"}


def test_both_nodes_send_objects_in_1_mib_chunks(cluster):
    """The docs' two commands start each raylet with the pack's object-manager chunk (1 MiB, not Ray's 5 MiB)."""
    import psutil

    from comfy_h3_nodes.cluster import ray_node as rn

    for side in ("ra", "rb"):
        raylets = [p for p in rn.node_processes(os.path.join(cluster["tmp"], side)) if p.name() == "raylet"]
        assert len(raylets) == 1, (side, raylets)
        try:
            env = raylets[0].environ()
        except psutil.Error as exc:
            pytest.fail(f"cannot read the environment of {side}'s raylet: {exc}")
        assert env.get("RAY_object_manager_default_chunk_size") == str(1 << 20), (side, env.get(
            "RAY_object_manager_default_chunk_size"))


def test_driver_on_a_runs_a_request_through_the_named_actor(cluster):
    script = os.path.join(cluster["tmp"], "driver.py")
    with open(script, "w") as f:
        f.write(DRIVER)
    outside = os.path.join(cluster["tmp"], "models", "..", "outside", "tiny")
    out = run_in(NS_A, [sys.executable, script, HEAD, cluster["token"], cluster["ckpt"], "h3_dit", outside],
                 _env(cluster["tmp"], "a"), timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["frames"] == [124, 64, 64, 3]
    assert res["a_node"] == A_IP and res["b_node"] == B_IP
    assert res["stages"]["encode"] == A_IP and res["stages"]["denoise"] == B_IP and res["stages"]["decode"] == A_IP
    assert len(res["recent"]) == 2 and res["recent"][0].startswith("warmup-")  # setup's actor served it, warm
    assert "outside the model roots" in res["refused"] and outside in res["refused"] and "H3_MODEL_ROOTS" in res["refused"], \
        res["refused"]
    assert os.path.join(cluster["tmp"], "models") in res["refused"]


def test_status_reports_the_actor(cluster):
    out = run_in(NS_B, [sys.executable, "-m", "remote_worker", "status"], _env(cluster["tmp"], "b"), timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DiT actor 'h3_dit' (namespace comfy_h3) on 10.77.0.2: healthy" in out.stdout
    assert f"model      {cluster['ckpt']} (partition transformer" in out.stdout
    assert "uptime" in out.stdout and "recent" in out.stdout and "memory" in out.stdout


def test_wrong_token_is_refused(cluster):
    tmp = cluster["tmp"]
    bad = os.path.join(tmp, "bad_token")
    with open(bad, "w") as f:
        f.write(secrets.token_hex(32))
    os.chmod(bad, 0o600)
    # a Ray node with the wrong token: the head's GCS refuses it (RAY_gcs_server_port_wait_time_s bounds the retries)
    env = _env(tmp, "bad", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=bad, RAY_gcs_server_port_wait_time_s="2",
               H3_RAY_NODE=os.path.join(tmp, "rbad"))
    out = run_in(NS_B, [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", HEAD, "--node-ip-address",
                        B_IP, "--temp-dir", os.path.join(tmp, "rbad"), "--object-store-memory", str(96 * 2**20),
                        "--disable-usage-stats"], env, timeout=60)
    assert out.returncode != 0
    assert "InvalidAuthToken" in out.stdout + out.stderr and "Authentication token is missing or incorrect" in \
        out.stdout + out.stderr
    # our setup with the wrong token stops at preflight, says why and how to fix it, and starts nothing
    out = run_in(NS_B, [sys.executable, "-m", "remote_worker", "setup", "--allow-cpu", "--head", HEAD,
                        "--model-path", cluster["ckpt"], "--iface", IF_B, "--token-file", bad,
                        "--temp-dir", os.path.join(tmp, "rbad2")], _env(tmp, "bad"), timeout=60)
    assert out.returncode != 0
    line = next(ln for ln in out.stdout.splitlines() if "token accepted" in ln)
    assert line.strip().startswith("FAIL") and "refused this token" in line
    assert "nothing was started" in out.stderr
    from comfy_h3_nodes.cluster import ray_node as rn

    assert rn.node_processes(os.path.join(tmp, "rbad")) == [] and rn.node_processes(os.path.join(tmp, "rbad2")) == []


def test_stop_leaves_no_ray_process_of_ours(cluster):
    tmp = cluster["tmp"]
    assert ns_pids(NS_A) and ns_pids(NS_B)  # both nodes run before
    out = run_in(NS_B, [sys.executable, "-m", "remote_worker", "stop"], _env(tmp, "b"), timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "killed the DiT actor 'h3_dit'" in out.stdout and "no Ray process of this node" in out.stdout
    assert ns_pids(NS_B) == [], _sh("ps", "-o", "pid,args", "-p", ",".join(ns_pids(NS_B))).stdout
    out = run_in(NS_A, [sys.executable, "-m", "comfy_h3_nodes", "cluster", "stop"], _env(tmp, "a"), timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ns_pids(NS_A) == []
    for side in ("ra", "rb"):
        marker = os.path.join(tmp, side) + "/"
        assert _sh("pgrep", "-f", marker, check=False).stdout.strip() == ""
    assert not os.path.exists(os.path.join(tmp, "state_b", "b_node.json"))


def test_link_loss_ends_the_request_with_a_bounded_clear_error(cluster):
    """Last (it destroys B): the A-B link goes down while B denoises; the driver's request ends within a bound with
    an error naming machine B and the request. Runs on a second pair of nodes (the test above stopped the first)."""
    import queue
    import threading

    from comfy_h3_nodes.cluster import ray_node as rn

    tmp, port = cluster["tmp"], PORT + 1
    start_cluster(tmp, cluster["ckpt"], cluster["token"], "ra2", "rb2", port)
    script = os.path.join(tmp, "link_driver.py")
    with open(script, "w") as f:
        f.write(LINK_DRIVER)
    errlog = open(os.path.join(tmp, "link_driver.err"), "w")
    driver = subprocess.Popen(["ip", "netns", "exec", NS_A, sys.executable, script, f"{A_IP}:{port}",
                               cluster["token"], cluster["ckpt"], "h3_dit"], stdout=subprocess.PIPE,
                              stderr=errlog, text=True, env=_env(tmp, "a"), cwd=REPO)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in driver.stdout], daemon=True).start()

    def next_line(prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ln = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if ln.startswith(prefix):
                return ln.strip()
        with open(errlog.name) as f:
            err = f.read()[-3000:]
        pytest.fail(f"no {prefix!r} line from the driver within {timeout:.0f} s (exit {driver.poll()}): {err}")

    try:
        _, rid, _ = next_line("STEP2 ", 120).split()  # B is denoising the request
        _sh("ip", "-n", NS_B, "link", "set", IF_B, "down")  # the cable is pulled: A's end loses its carrier too
        t_cut = time.time()
        res = json.loads(next_line("RESULT ", 120)[len("RESULT "):])
        elapsed = res["t_end"] - t_cut
        print(f"[timing] link cut after step {res['steps_seen']} of 200; the request ended {elapsed:.1f} s later "
              f"with {res['error']}: {res['message']}")
        # A's link probe (LinkDown, an H3Error), or the stall bound where the probe could not tell
        assert res["error"] in ("LinkDown", "H3Error", "H3Timeout") and res["h3"], res
        assert res["request_id"] == rid and rid in res["message"], res
        # A's own link probe (engine/executor/link.py), not the head's health checks: those tolerate 150 s of a
        # silent B so that a pulled cable does not cost B its model (ray_node.HEAD_SYSTEM_CONFIG)
        assert f"the link from A to machine B ({B_IP}) has carried nothing for" in res["message"], res
        assert f"during denoise of request {rid}" in res["message"], res
        assert res["steps_seen"] < 200, res  # the link went down while B denoised
        assert elapsed < 20, res
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait(timeout=30)
        errlog.close()
    # a B whose link is down is ended by pid like any other node; nothing of ours is left in either namespace
    for side in ("rb2", "ra2"):
        rn.stop_node(os.path.join(tmp, side), grace=3)
    assert ns_pids(NS_B) == [] and ns_pids(NS_A) == [], _sh("ps", "-o", "pid,args", "-p",
                                                            ",".join(ns_pids(NS_A) + ns_pids(NS_B))).stdout
