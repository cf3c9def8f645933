"""Starting and stopping *our* Ray node on this machine (A's head or B's worker), shared by both command lines.

* ``ray start`` runs with a private ``--temp-dir`` and a marker variable ``H3_RAY_NODE=<temp dir>``; every process of
  the node carries one or the other (the agents rename themselves with setproctitle but are children of the raylet),
  so :func:`node_processes` finds exactly this node's processes and :func:`stop_node` ends only those. Plain
  ``ray stop`` ends every Ray process of the user on the machine, other clusters included.
* :func:`head_info` asks the head's GCS, in a short subprocess with the token, for the alive nodes and for the versions
  A published at ``start-head`` (Ray's internal KV, namespace ``comfy_h3``, key ``h3:a_versions``). A wrong token is
  refused by the GCS in about a second, which is also the token check.
* Node facts (address, node IP, temp dir, token file, ...) live in a small JSON state file per role in
  ``$H3_STATE_DIR`` (default ``~/.comfy_h3``), read by ``status`` and ``stop``.

Run as ``python -m comfy_h3_nodes.cluster.ray_node kv-put ADDRESS KEY`` (JSON value on stdin) or
``python -m comfy_h3_nodes.cluster.ray_node head-info ADDRESS``: the token comes from the environment.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import platform
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time

import psutil

from ..engine.contract.versions import versions

KV_NAMESPACE = "comfy_h3"
KV_VERSIONS = "h3:a_versions"
MARKER_ENV = "H3_RAY_NODE"
DEFAULT_TOKEN_FILE = "~/.ray/auth_token"  # Ray's own default path
DEFAULT_TEMP = {"a": "/tmp/comfy_h3_ray_a", "b": "/tmp/comfy_h3_ray_b"}
# The head's node health checks (the cluster's partition tolerance, issue 39). A pulled QSFP cable or a rebooting
# switch silences B for up to two minutes; a node the head judges dead is made to exit when the link returns, and B's
# resident model is lost. So the head tolerates H3_PARTITION_TOLERANCE_S (150 s) of silence: 30 failed checks, one
# every 5 s (a check that fails at once, on a gRPC channel already broken, still waits the period: with a 1 s period a
# 120 s cut after an earlier one lost B), and every node's processes wait as long (+30 s) for the GCS and each other
# before exiting (Ray's default: 60 s). The trade-off: Ray itself judges a B host that really died after 150 s
# (refused or failing at once) to 270 s (silent: each check waits its 4 s timeout too). A request does not wait for
# that: A's own probe (engine/executor/link.py) tells a link that carries nothing from a host that refuses within
# ~10 s, and a killed DiT process is reported by B's raylet at once.
PARTITION_TOLERANCE_S = int(float(os.environ.get("H3_PARTITION_TOLERANCE_S", "150")))
_CHECK_TIMEOUT_MS = int(os.environ.get("H3_HEALTH_CHECK_TIMEOUT_MS", "4000"))
HEAD_SYSTEM_CONFIG = {
    "health_check_period_ms": 5000,
    "health_check_failure_threshold": max(2, -(-PARTITION_TOLERANCE_S // 5)),
    "health_check_timeout_ms": _CHECK_TIMEOUT_MS,
    # how long a node's processes wait for the GCS, and the GCS and workers for a raylet or worker, before giving up
    **{k: PARTITION_TOLERANCE_S + 30 for k in ("gcs_rpc_server_reconnect_timeout_s",
                                               "raylet_rpc_server_reconnect_timeout_base_s",
                                               "raylet_rpc_server_reconnect_timeout_max_s",
                                               "core_worker_rpc_server_reconnect_timeout_base_s",
                                               "core_worker_rpc_server_reconnect_timeout_max_s")},
}
#: the same waits for each node's own processes (a worker node's raylet and workers read them from their environment)
PARTITION_ENV = {f"RAY_{k}": str(v) for k, v in HEAD_SYSTEM_CONFIG.items() if k.endswith("_timeout_s")
                 or "_reconnect_timeout_" in k}
#: how each node's object manager sends an object: in 1 MiB chunks (Ray's default 5 MiB is copied whole before it goes
#: on the wire; smaller chunks overlap the copies with the link). On the two-host harness's 4 Gbit/s QSFP link: a
#: 5.2 MB A->B payload 15.4 -> 14.0 ms (median of 12), an 82 MB clip unchanged (1.02 x the wire). A value in the
#: environment of the command that starts the node wins.
TRANSFER_ENV = {"RAY_object_manager_default_chunk_size": str(1 << 20)}


class NodeError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------------------- versions
def local_versions() -> dict[str, str]:
    """What both machines must agree on: Python and the packages of :func:`actor_common.versions`."""
    return {"python": platform.python_version(), **versions()}


def version_diff(mine: dict, theirs: dict) -> dict[str, tuple]:
    keys = [k for k in theirs if not k.startswith("_")]
    return {k: (theirs.get(k), mine.get(k)) for k in keys if str(theirs.get(k)) != str(mine.get(k))}


# ---------------------------------------------------------------------------------------------------------- network
def iface_addresses(iface: str) -> list[str]:
    """IPv4 addresses on ``iface`` (empty when it has none); raises if the interface does not exist."""
    addrs = psutil.net_if_addrs()
    if iface not in addrs:
        raise NodeError(f"network interface {iface!r} does not exist here (interfaces: {', '.join(sorted(addrs))}).")
    return [a.address for a in addrs[iface] if a.family == socket.AF_INET]


def iface_of(ip: str) -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


def route_source(host: str) -> str | None:
    """The local address the kernel would use to reach ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def forbidden_node_ip(ip: str) -> str | None:
    """Why ``ip`` cannot be a Ray node address, or None."""
    if ip == "0.0.0.0":
        return "0.0.0.0 is not an address other machines can reach"
    if ip == "127.0.0.1":
        return "Ray rewrites 127.0.0.1 to the machine's external address when connecting and then retries forever"
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return f"{ip!r} is not an IP address"
    return None


def pick_node_ip(iface: str | None, node_ip: str | None, toward: str | None = None) -> tuple[str, str]:
    """``(ip, iface)`` to bind Ray to: the interface's IPv4 address (or ``node_ip``, which must be on it)."""
    if iface:
        addrs = iface_addresses(iface)
        if node_ip:
            if node_ip not in addrs:
                raise NodeError(
                    f"address {node_ip} is not on interface {iface} (it holds {', '.join(addrs) or 'no IPv4 address'})")
            return node_ip, iface
        if not addrs:
            raise NodeError(f"interface {iface} holds no IPv4 address (lost on reboot?)")
        return addrs[0], iface
    if node_ip:
        return node_ip, iface_of(node_ip) or "?"
    src = route_source(toward) if toward else None
    if not src:
        raise NodeError("no --iface given and no route to the head to infer one from; pass --iface")
    return src, iface_of(src) or "?"


def tcp_reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise NodeError(f"address {address!r} is not host:port (for example 192.168.100.1:6379)")
    return host.strip("[]"), int(port)


# ---------------------------------------------------------------------------------------------------------- token
def token_path(token_file: str | None) -> pathlib.Path:
    return pathlib.Path(os.path.expanduser(token_file or os.environ.get("RAY_AUTH_TOKEN_PATH") or DEFAULT_TOKEN_FILE))


def ensure_token_file(token_file: str | None) -> tuple[pathlib.Path, bool]:
    """The token file, created (64 hex characters, mode 0600) when missing; ``(path, created)``."""
    path = token_path(token_file)
    if path.is_file():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        if not path.read_text().strip():
            raise NodeError(f"token file {path} is empty; delete it to have a new token generated")
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path, True


def check_token_file(token_file: str | None) -> tuple[bool, str, str]:
    """``(ok, detail, fix)`` for the token a node or driver will use."""
    if os.environ.get("RAY_AUTH_TOKEN") and not token_file:
        return True, "from RAY_AUTH_TOKEN", ""
    path = token_path(token_file)
    fix_copy = (f"copy machine A's token file here (`scp A:~/.ray/auth_token {path}`, then `chmod 600 {path}`); "
                "`python -m comfy_h3_nodes cluster start-head` on A wrote it")
    if not path.is_file():
        return False, f"no token file at {path}", fix_copy
    if not path.read_text().strip():
        return False, f"token file {path} is empty", fix_copy
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return False, f"token file {path} is readable by others (mode {mode:o})", f"chmod 600 {path}"
    return True, f"{path} (mode 600)", ""


def token_env(token_file: str | None) -> dict[str, str]:
    if os.environ.get("RAY_AUTH_TOKEN") and not token_file:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ["RAY_AUTH_TOKEN"]}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path(token_file))}


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    if "RAY_AUTH_TOKEN_PATH" in extra:
        env.pop("RAY_AUTH_TOKEN", None)  # an explicit token file wins over an inherited token
    env.update(extra)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return env


# ---------------------------------------------------------------------------------------------------------- head KV
def _helper(args: list[str], env: dict[str, str], stdin: str | None = None, timeout: float = 30.0) -> dict:
    cmd = [sys.executable, "-m", "comfy_h3_nodes.cluster.ray_node", *args]
    try:
        out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=_child_env(env))
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timeout", "message": f"no answer from the head within {timeout:.0f} s"}
    for line in reversed(out.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"ok": False, "error": "crash", "message": (out.stderr.strip().splitlines() or ["no output"])[-1]}


def head_info(address: str, token: dict[str, str], timeout: float = 30.0) -> dict:
    """``{"ok", "nodes": [{ip, alive, roles, head}], "versions": {...} | None}`` or ``{"ok": False, "error", ...}``."""
    return _helper(["head-info", address], token, timeout=timeout)


def publish_versions(address: str, token: dict[str, str], versions: dict, timeout: float = 30.0) -> dict:
    return _helper(["kv-put", address, KV_VERSIONS], token, stdin=json.dumps(versions), timeout=timeout)


def _gcs(address: str):
    from ray._raylet import GcsClient  # noqa: PLC0415 - in the helper subprocess, after the token is in its env

    return GcsClient(address=address)


def _main_helper(argv: list[str]) -> int:
    verb, address = argv[0], argv[1]
    try:
        client = _gcs(address)
        if verb == "kv-put":
            client.internal_kv_put(argv[2].encode(), sys.stdin.read().encode(), True, KV_NAMESPACE.encode(),
                                   timeout=10)
            print(json.dumps({"ok": True}))
            return 0
        roles = ("h3_role_a", "h3_role_b")
        nodes = []
        for n in client.get_all_node_info(timeout=10).values():
            res = dict(n.resources_total)
            nodes.append({"ip": n.node_manager_address, "alive": n.state == 0, "head": bool(n.is_head_node),
                          "roles": [r for r in roles if res.get(r, 0) > 0], "temp_dir": n.temp_dir})
        raw = client.internal_kv_get(KV_VERSIONS.encode(), KV_NAMESPACE.encode(), timeout=10)
        print(json.dumps({"ok": True, "nodes": nodes, "versions": json.loads(raw) if raw else None}))
        return 0
    except Exception as exc:  # noqa: BLE001 - reported to the parent as JSON
        kind = "auth" if type(exc).__name__ == "AuthenticationError" else "error"
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(json.dumps({"ok": False, "error": kind, "message": f"{type(exc).__name__}: {msg}"}))
        return 1


# ---------------------------------------------------------------------------------------------------------- processes
def node_processes(temp_dir: str) -> list:
    """Every live process of the node that uses ``temp_dir``: by command line, by marker variable, and their children."""
    temp_dir = str(temp_dir).rstrip("/")
    me = psutil.Process()
    skip = {me.pid} | {a.pid for a in me.parents()}  # never this command or the shell that runs it
    roots = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid in skip:
            continue
        try:
            args = p.info["cmdline"] or []
            hit = any(a == temp_dir or a.endswith("=" + temp_dir) or (temp_dir + "/") in a for a in args)
            if not hit:
                try:
                    hit = p.environ().get(MARKER_ENV) == temp_dir
                except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    hit = False
            if hit and p.status() != psutil.STATUS_ZOMBIE:
                roots.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    found = {p.pid: p for p in roots}
    for p in roots:
        try:
            for c in p.children(recursive=True):
                if c.pid not in skip and c.status() != psutil.STATUS_ZOMBIE:
                    found.setdefault(c.pid, c)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return list(found.values())


def describe(procs) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} ({p.name()})")
        except Exception:  # noqa: BLE001
            out.append(str(p.pid))
    return ", ".join(out)


def stop_node(temp_dir: str, grace: float = 6.0) -> tuple[int, list]:
    """End this node's processes: SIGTERM to everything but the GCS (raylet first, so that it can still tell the GCS it
    leaves), then to the GCS, SIGKILL what is left after ``grace`` s per phase; ``(stopped, survivors)``."""
    procs = node_processes(temp_dir)

    def name(p):
        try:
            return p.name()
        except psutil.Error:
            return ""

    gcs = [p for p in procs if "gcs_server" in name(p)]
    phases = [[p for p in procs if p not in gcs], gcs]
    for phase in phases:
        for p in phase:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(phase, timeout=grace)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
    deadline = time.monotonic() + 5
    left = node_processes(temp_dir)
    while left and time.monotonic() < deadline:  # a raylet may spawn a worker while dying
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=2)
        left = node_processes(temp_dir)
    return len(procs), left


def _transfer_env() -> dict[str, str]:
    """:data:`TRANSFER_ENV` less what this process's environment sets itself (the caller's ``env`` comes after)."""
    return {k: v for k, v in TRANSFER_ENV.items() if k not in os.environ}


def ray_start(args: list[str], env: dict[str, str], temp_dir: str, log_path: pathlib.Path,
              timeout: float = 180.0) -> tuple[int, str]:
    """Run ``ray start`` of this Python's Ray with our marker; ``(returncode, output tail)``; output goes to a file
    (the daemons it leaves behind would otherwise hold a pipe open)."""
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--temp-dir", str(temp_dir),
           "--disable-usage-stats"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_child_env({**_transfer_env(), **PARTITION_ENV, **env,
                                                MARKER_ENV: str(temp_dir)}),
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    text = log_path.read_text(errors="replace")
    return rc, "\n".join(text.strip().splitlines()[-15:])


# ---------------------------------------------------------------------------------------------------------- state
def state_dir() -> pathlib.Path:
    return pathlib.Path(os.path.expanduser(os.environ.get("H3_STATE_DIR", "~/.comfy_h3")))


def state_file(role: str) -> pathlib.Path:
    return state_dir() / f"{role}_node.json"


def read_state(role: str) -> dict | None:
    path = state_file(role)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_state(role: str, data: dict) -> pathlib.Path:
    path = state_file(role)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    return path


def clear_state(role: str) -> None:
    try:
        state_file(role).unlink()
    except FileNotFoundError:
        pass


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


if __name__ == "__main__":
    sys.exit(_main_helper(sys.argv[1:]))
