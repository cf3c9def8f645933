"""The docs' commands on two hosts: A's head (``cluster start-head --iface enp1s0f0np0``) and the real ComfyUI in
``h3a``, B's ``remote_worker setup ... --iface enp1s0f1np1`` in ``h3b``, the token copied as the docs say; a prompt's
bytes on each link, and the cluster seen from ``h3lan`` without the token.

Part of ``make test-two-hosts`` (root; the real ComfyUI of ``COMFYUI_DIR`` in its Python, as ``make test-comfyui``).
The test reaches the ComfyUI on A's loopback through a forwarder whose far sockets are made inside ``h3a``.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
import test_comfyui_integration as ci
from test_comfyui_integration import _of, _ok, _prompt, _run
from two_hosts_support import (
    A_MGMT, A_QSFP, A_QSFP_IF, B_MGMT, B_QSFP, B_QSFP_IF, LAN_MGMT, MGMT_IF, Forward, delta, host_env, hosts,  # noqa: F401
    python_in,
)

pytestmark = ci.pytestmark
PORT = 6379  # the docs' port: each host has its own network, so it collides with nothing of the machine's
HEAD = f"{A_QSFP}:{PORT}"


def _json_tail(out) -> dict:
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pair(hosts, tiny_ckpt, tmp_path_factory):
    """A's head and B's DiT node by the docs' commands, then ComfyUI in h3a pointed at A's head."""
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    tmp = hosts.tmp
    env_a = host_env(tmp, "a", H3_PARALLEL_IFACE=A_QSFP_IF)
    env_b = host_env(tmp, "b", H3_PARALLEL_IFACE=B_QSFP_IF)
    tok_a = os.path.join(env_a["HOME"], ".ray", "auth_token")  # ~/.ray/auth_token on A (start-head writes it)
    tok_b = os.path.join(env_b["HOME"], ".ray", "auth_token")
    t0 = time.monotonic()
    head = hosts.run("h3a", [python, "-m", "comfy_h3_nodes", "cluster", "start-head", "--iface", A_QSFP_IF,
                             "--port", str(PORT), "--token-file", tok_a, "--object-store-mb", "96", "--temp-dir",
                             os.path.join(tmp, "ra"), "--num-cpus", "2", "--json"], env=env_a, timeout=120)
    assert head.returncode == 0, head.stdout + head.stderr
    assert _json_tail(head) == {"address": HEAD, "token_file": tok_a}
    os.makedirs(os.path.dirname(tok_b), mode=0o700, exist_ok=True)  # scp ~/.ray/auth_token B:~/.ray/auth_token
    shutil.copy(tok_a, tok_b)
    os.chmod(tok_b, 0o600)
    setup = hosts.run("h3b", [python, "-m", "remote_worker", "setup", "--head", HEAD, "--model-path", str(tiny_ckpt),
                              "--iface", B_QSFP_IF, "--token-file", tok_b, "--allow-cpu", "--object-store-mb", "96",
                              "--temp-dir", os.path.join(tmp, "rb"), "--dtype", "float32", "--threads", "1",
                              "--num-cpus", "2", "--json"], env=env_b, timeout=240)
    assert setup.returncode == 0, setup.stdout[-4000:] + setup.stderr[-4000:]
    cluster_s = time.monotonic() - t0
    folder = pathlib.Path(tmp)
    port = ci._free_port()
    fwd = Forward("h3a", port)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMFYUI_PYTHON", python_in("h3a", python, folder))
        mp.setenv("RAY_AUTH_MODE", "token")  # the docs: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.ray/auth_token
        mp.setenv("RAY_AUTH_TOKEN_PATH", tok_a)
        mp.setenv("H3_PARALLEL_IFACE", A_QSFP_IF)
        mp.setattr(ci, "_free_port", lambda: port)
        t1 = time.monotonic()
        try:
            with ci._started_comfyui(tmp_path_factory, tiny_ckpt) as server:
                print(f"\n[two hosts] head + B's setup {cluster_s:.1f} s, ComfyUI in h3a {time.monotonic() - t1:.1f} s")
                yield {"server": server, "setup": setup, "head": head, "python": python, "env_a": env_a,
                       "env_b": env_b, "tok_a": tok_a, "tok_b": tok_b, "tmp": tmp}
        finally:
            fwd.close()
            hosts.run("h3b", [python, "-m", "remote_worker", "stop", "--temp-dir", os.path.join(tmp, "rb")],
                      env=env_b, timeout=60)
            hosts.run("h3a", [python, "-m", "comfy_h3_nodes", "cluster", "stop"], env=env_a, timeout=60)


def _api(steps: int = 3, size: int = 64, seed: int = 5, parallel: str | None = None, tiny=None):
    api, ui = _prompt(tiny, steps=steps, width=size, height=size, seed=seed)
    api["2"]["inputs"]["cluster_address"] = HEAD
    if parallel:
        api["2"]["inputs"]["parallel"] = parallel
    return api, ui


def _links(d: dict) -> dict:
    """Bytes on A's and B's management and QSFP links."""
    return {"mgmt": d["h3a"][MGMT_IF] + d["h3b"][MGMT_IF], "qsfp": d["h3a"][A_QSFP_IF] + d["h3b"][B_QSFP_IF]}


def test_two_hosts_docs_commands_put_b_on_the_qsfp_link(pair):
    out = pair["setup"].stdout
    values = _json_tail(pair["setup"])
    assert values["node_ip"] == B_QSFP and values["h3_remote_dit"]["cluster_address"] == HEAD, values
    line = next(ln for ln in out.splitlines() if ln.split()[1:2] == ["interface"])
    assert line.split()[0] == "PASS" and B_QSFP_IF in line and B_QSFP in line, line
    assert f"python -m remote_worker setup --head {HEAD}" in pair["head"].stdout


@pytest.mark.parametrize("parallel", ["off", "A+B"])
def test_two_hosts_prompt_in_comfyui_on_a_crosses_the_qsfp_link(pair, hosts, tiny_ckpt, parallel):
    """One prompt of the real ComfyUI in h3a (hand-offs, previews, per-step events; with ``A+B`` also the ranks'
    gloo collectives): at least 95 % of the bytes A's and B's links carried went over the QSFP link."""
    server = pair["server"]
    api, ui = _api(steps=4, size=128, parallel=None if parallel == "off" else parallel, tiny=tiny_ckpt)
    asyncio.run(_run(server, api, ui))  # warm (a first parallel run forms the group)
    api, ui = _api(steps=4, size=128, seed=6, parallel=None if parallel == "off" else parallel, tiny=tiny_ckpt)
    before = hosts.bytes()
    t0 = time.monotonic()
    pid, messages, entry = asyncio.run(_run(server, api, ui))
    wall = time.monotonic() - t0
    d = delta(before, hosts.bytes())
    _ok(messages, pid)
    links = _links(d)
    share = links["qsfp"] / max(1, links["qsfp"] + links["mgmt"])
    print(f"\n[two hosts] prompt ({parallel}, 128x128x124, 4 steps) {wall:.1f} s: QSFP {links['qsfp']} B, management "
          f"{links['mgmt']} B (A {d['h3a'][MGMT_IF]}, B {d['h3b'][MGMT_IF]}); qsfp share {share:.4f}")
    timings = {t["node"]: t for t in _of(messages, "h3.timing", pid)}
    denoise = next(s for s in timings["5"]["stages"] if s["stage"] == "denoise")
    assert denoise["node"] in (B_QSFP, "h3b") or B_QSFP in json.dumps(timings["2"]), timings["2"]
    assert links["qsfp"] > 100_000, links  # the hand-offs really crossed
    assert share >= 0.95, (share, d)
    if parallel == "A+B":
        (den,) = [t for t in _of(messages, "h3.timing", pid) if t["node"] == "5"]
        assert [r["machine"] for r in den["summary"]["ran"]["ranks"]] == ["A", "B"], den["summary"]


LAN_PROBE = r'''
import json, socket, sys
import grpc
targets = json.loads(sys.argv[1])
METHODS = ["/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", "/ray.rpc.ActorInfoGcsService/GetAllActorInfo",
           "/ray.rpc.NodeManagerService/GetNodeStats", "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",
           "/ray.rpc.CoreWorkerService/GetObjectStatus", "/ray.rpc.ObjectManagerService/Pull"]
out = []
for ip, port in targets:
    r = {"ip": ip, "port": port}
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((ip, port))
    except OSError as e:
        r["tcp"] = type(e).__name__; out.append(r); continue
    r["tcp"] = "open"
    try:
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n"); s.settimeout(1.5)
        body = b""
        while len(body) < 1 << 20:
            b = s.recv(1 << 16)
            if not b: break
            body += b
        text = body.decode("latin-1")
        r["http"] = text.split("\r\n")[0][:40] if text.startswith("HTTP/") else "not HTTP"
        names = sorted({ln.split("{")[0].split()[0] for ln in text.splitlines() if ln.startswith("ray_")})
        r["metrics"] = [len(names), names[:4]]
    except OSError as e:
        r["http"] = type(e).__name__
    s.close()
    ch = grpc.insecure_channel(f"{ip}:{port}")
    codes = {}
    for m in METHODS:
        try:
            ch.unary_unary(m)(b"", timeout=2)
            codes[m.rsplit("/", 1)[1]] = "OK"
        except grpc.RpcError as e:
            codes[m.rsplit("/", 1)[1]] = e.code().name
    ch.close()
    r["grpc"] = codes
    out.append(r)
print(json.dumps(out))
'''


def _listening(hosts, host: str) -> dict[int, str]:
    """port -> 'bind address process' of what listens in ``host``."""
    out = hosts.run(host, ["ss", "-ltnpH"]).stdout
    res = {}
    for ln in out.splitlines():
        f = ln.split()
        if len(f) >= 5:
            addr, port = f[3].rsplit(":", 1)
            proc = f[-1].split('"')[1] if '"' in f[-1] else "?"
            res[int(port)] = f"{addr} {proc}"
    return res


def test_two_hosts_lan_without_the_token_cannot_join_call_or_read(pair, hosts):
    """From h3lan (another machine on the management LAN), without the token: a Ray node cannot join, a driver cannot
    connect (so it can neither get B's actor nor call it), and no gRPC method of any port A and B listen on answers
    (the node list, B's actor's worker, an object's status, the object manager's pull); printed: every port that
    answers from the LAN and what it says to an HTTP request."""
    python, tmp = pair["python"], pair["tmp"]
    env = host_env(tmp, "lan", RAY_gcs_server_port_wait_time_s="3")
    ports = {"h3a": _listening(hosts, "h3a"), "h3b": _listening(hosts, "h3b")}
    targets = sorted({(ip, p) for h, ips in (("h3a", (A_MGMT, A_QSFP)), ("h3b", (B_MGMT, B_QSFP)))
                      for ip in ips for p in ports[h]})
    probe = hosts.run("h3lan", [python, "-c", LAN_PROBE, json.dumps(targets)], env=env, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    answering = [r for r in seen if r["tcp"] == "open"]
    print(f"\n[two hosts] from the LAN ({LAN_MGMT}) without the token, {len(answering)} of {len(seen)} (address, port) "
          "answer TCP:")
    for r in answering:
        auth = sorted({c for c in r["grpc"].values()})
        owner = (ports["h3a"] if r["ip"] in (A_MGMT, A_QSFP) else ports["h3b"]).get(r["port"], "?")
        print(f"  {r['ip']}:{r['port']} ({owner})  http: {r['http']!r} metrics: {r.get('metrics')}  grpc: {auth}")
    assert answering, "nothing of Ray answers at all: the probe did not reach A's or B's ports"
    assert not [r for r in answering if "OK" in r["grpc"].values()], answering  # no method answers without the token
    gcs = [r for r in answering if r["port"] == PORT]
    assert gcs and all(r["grpc"]["GetAllNodeInfo"] == "UNAUTHENTICATED" for r in gcs), gcs
    # a node without the token cannot join; a driver cannot connect (its actor handle and results are out of reach)
    join = hosts.run("h3lan", [python, "-m", "ray.scripts.scripts", "start", "--address", f"{A_MGMT}:{PORT}",
                               "--node-ip-address", LAN_MGMT, "--temp-dir", os.path.join(tmp, "rlan"),
                               "--disable-usage-stats"], env=env, timeout=90)
    assert join.returncode != 0, join.stdout[-2000:]
    assert "Authentication token is missing or incorrect" in join.stdout + join.stderr or \
        "InvalidAuthToken" in join.stdout + join.stderr, (join.stdout + join.stderr)[-2000:]
    driver = ("import ray, sys\ntry:\n    ray.init(address=sys.argv[1], namespace='comfy_h3', log_to_driver=False)\n"
              "    a = ray.get_actor('h3_dit', namespace='comfy_h3'); print('GOT', ray.get(a.ping.remote(), timeout=10))\n"
              "except BaseException as e:\n    print('REFUSED', type(e).__name__, str(e)[:300])\n")
    try:
        out = hosts.run("h3lan", [python, "-c", driver, f"{A_MGMT}:{PORT}"], env=env, timeout=90)
        said = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
    except subprocess.TimeoutExpired:
        said = "REFUSED (no answer within 90 s)"
    print(f"  a driver without the token: {said[:200]}")
    assert "GOT" not in said and said.startswith("REFUSED"), said
    subprocess.run(["pkill", "-KILL", "-f", os.path.join(tmp, "rlan") + "/"], timeout=10)  # a half-started node
