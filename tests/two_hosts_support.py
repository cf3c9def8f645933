"""The two-host tests' small fixture around scripts/two_hosts.py, used only through its CLI (never imported).

``hosts`` brings the four hosts up for a module (``up``; a leftover of a killed run is removed first with ``down``) and
takes them down after it. ``Hosts.run`` / ``Hosts.popen`` run a command in a host (its namespace, CPU and memory
cgroup); ``Hosts.bytes`` reads each interface's counters (``ip -s link``), ``Hosts.link`` pulls or plugs a cable.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
HARNESS = str(REPO / "scripts" / "two_hosts.py")
A_MGMT, B_MGMT, B2_MGMT, LAN_MGMT = "198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.9"
A_QSFP, B_QSFP, B2_QSFP = "198.18.1.1", "198.18.1.2", "198.18.1.3"
MGMT_IF, A_QSFP_IF, B_QSFP_IF = "enP7s7", "enp1s0f0np0", "enp1s0f1np1"


def harness(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, HARNESS, *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"two_hosts {' '.join(args)} failed ({out.returncode}): {out.stdout}{out.stderr}")
    return out


def host_env(tmp: str, side: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in ("VIRTUAL_ENV",)}
    env.update(PYTHONPATH=str(REPO), H3_STATE_DIR=os.path.join(tmp, f"state_{side}"), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOME=os.path.join(tmp, f"home_{side}"))
    os.makedirs(env["HOME"], exist_ok=True)
    env.update(extra)
    return env


class Hosts:
    def __init__(self, tmp: str):
        self.tmp = tmp

    def run(self, host: str, args: list[str], env: dict | None = None, timeout: float = 60,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, HARNESS, "run", host, "--", *args], capture_output=True, text=True,
                             timeout=timeout, env=env, cwd=cwd or str(REPO), stdin=subprocess.DEVNULL)
        out.seconds = time.monotonic() - t0
        return out

    def popen(self, host: str, args: list[str], env: dict | None = None, log: str | None = None,
              cwd: str | None = None, **kw) -> subprocess.Popen:
        out = open(log, "wb") if log else subprocess.DEVNULL
        return subprocess.Popen([sys.executable, HARNESS, "run", host, "--", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd or str(REPO), stdin=subprocess.DEVNULL,
                                start_new_session=True, **kw)

    def link(self, host: str, iface: str, state: str) -> None:
        harness("link", host, iface, state)

    def status(self) -> dict:
        return json.loads(harness("status", "--json").stdout)

    def bytes(self) -> dict[str, dict[str, int]]:
        """host -> interface -> bytes sent + received."""
        return {h: {i: v["rx_bytes"] + v["tx_bytes"] for i, v in d["interfaces"].items()}
                for h, d in self.status()["hosts"].items()}

    def pids(self, host: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True, timeout=10)
        return [int(p) for p in out.stdout.split()]


def delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    return {h: {i: after[h][i] - before[h].get(i, 0) for i in after[h]} for h in after}


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/two_hosts.py makes network namespaces and cgroups")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("iproute2's `ip` and `tc` are not installed")
    up = harness("up", check=False)
    if up.returncode != 0 and "exist already" in up.stderr:  # a killed run's leftovers
        harness("down")
        up = harness("up", check=False)
    assert up.returncode == 0, up.stdout + up.stderr
    tmp = tempfile.mkdtemp(prefix="h3hh_", dir="/tmp")  # short: Ray's socket paths stay < 108 characters
    try:
        yield Hosts(tmp)
    finally:
        harness("down", check=False)
        if not os.environ.get("H3_TWO_HOSTS_KEEP"):  # =1 keeps the hosts' Ray logs for a look after a failure
            shutil.rmtree(tmp, ignore_errors=True)


def _enter(host: str) -> None:
    """The calling thread into ``host``'s network namespace (setns is per thread)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{host}", os.O_RDONLY)
    try:
        assert libc.setns(fd, 0x40000000) == 0, os.strerror(ctypes.get_errno())  # CLONE_NEWNET
    finally:
        os.close(fd)


class Forward:
    """127.0.0.1:PORT of the test's namespace -> 127.0.0.1:PORT inside ``host`` (how the test, like a browser on A,
    reaches the ComfyUI that listens on A's loopback). Each connection's far socket is made by a thread that entered
    the host's namespace; it carries only that socket's bytes (on A's ``lo``, not on its links)."""

    def __init__(self, host: str, port: int):
        import socket
        import threading

        self.host, self.port = host, port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c) -> None:
        import socket
        import threading

        _enter(self.host)
        try:
            far = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            c.close()
            return
        far.settimeout(None)

        def pump(a, b):
            try:
                while data := a.recv(1 << 16):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pump, args=(far, c), daemon=True).start()
        pump(c, far)

    def close(self) -> None:
        self.sock.close()


def python_in(host: str, python: str, folder: pathlib.Path) -> str:
    """A wrapper that runs ``python`` in ``host`` (for helpers that start "their Python", such as ComfyUI's)."""
    path = folder / f"python-in-{host}"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {HARNESS} run {host} -- {python} \"$@\"\n")
    path.chmod(0o755)
    return str(path)
