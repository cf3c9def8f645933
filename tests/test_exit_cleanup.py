"""Stopping the host ends the embedded cluster with it: no stack trace, no Ray process left behind.

Reproduces ComfyUI in a subprocess: the pack is imported on the main thread (as ComfyUI imports custom nodes), the
main thread then runs an asyncio loop (the server), and a daemon worker thread (ComfyUI's prompt worker) starts the
embedded two-node cluster with a detached actor on B (the DiT). The host is then stopped as a terminal does (SIGINT:
ComfyUI catches the KeyboardInterrupt and returns) or as a service manager does (SIGTERM: nobody handles it, the
process ends by the signal). Ray's own exit hooks stop one process at a time (7-8 s here), and on SIGTERM nothing ran
them: abseil printed a native stack trace and the agents and workers outlived the host.

The cluster's processes are its session directory's and the host's process tree, read just before the signal.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

HOST = textwrap.dedent("""
    import asyncio, importlib.util, os, sys, threading, time

    spec = importlib.util.spec_from_file_location("comfy_h3", os.path.join(sys.argv[1], "__init__.py"),
                                                  submodule_search_locations=[sys.argv[1]])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["comfy_h3"] = pack
    spec.loader.exec_module(pack)  # ComfyUI's import of the pack, on the main thread
    from comfy_h3_nodes.cluster import ray_cluster as cl


    def prompt_worker():
        c = cl.EmbeddedCluster(object_store_mb=80, num_cpus=1).start()
        import ray

        @ray.remote(resources={cl.ROLE_B: 1}, num_cpus=0)
        class DiT:
            def pid(self):
                return os.getpid()

        actor = DiT.options(name="h3_dit_exit_test", lifetime="detached").remote()
        print("READY", c._cluster.head_node.get_session_dir_path(), ray.get(actor.pid.remote()), flush=True)
        while True:
            time.sleep(1)


    threading.Thread(target=prompt_worker, daemon=True).start()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.sleep(10**6))
    except KeyboardInterrupt:
        print("Stopped server", flush=True)
""")


def _cluster_processes(host: psutil.Process, session_dir: str) -> dict[int, psutil.Process]:
    procs = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(session_dir in a for a in p.info["cmdline"] or []):
                procs[p.pid] = p
        except psutil.Error:
            pass
    for root in [host, *procs.values()]:
        try:
            procs.update({c.pid: c for c in root.children(recursive=True)})
        except psutil.Error:
            pass
    procs.pop(host.pid, None)
    return procs


def _running(procs) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _describe(procs) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.name()}")
        except psutil.Error:
            out.append(str(p.pid))
    return ", ".join(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stopping_the_host_ends_the_embedded_cluster(sig):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # SIGINT as a terminal delivers it (a shell may have started this test with SIGINT ignored)
    proc = subprocess.Popen([sys.executable, "-c", HOST, str(REPO)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    procs: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 240
        line = ""
        while not line.startswith("READY") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert line.startswith("READY"), f"the host did not start its cluster: {proc.stderr.read()[-3000:]}"
        session_dir = line.split()[1]
        time.sleep(1)  # let the raylets start their agents
        procs = _cluster_processes(psutil.Process(proc.pid), session_dir)
        names = _describe(procs.values())
        assert len(procs) >= 6 and "raylet" in names and "gcs_server" in names and "DiT" in names, names

        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        exit_s = time.monotonic() - t0
        gone_by = time.monotonic() + 1.0
        while _running(procs.values()) and time.monotonic() < gone_by:
            time.sleep(0.05)
        left = _running(procs.values())
        print(f"{sig.name}: exit {exit_s:.2f} s after the signal, rc {proc.returncode}, "
              f"{len(procs)} cluster processes, {len(left)} left")

        assert not left, f"{sig.name}: Ray processes still running 1 s after the host exited: {_describe(left)}"
        assert "Traceback" not in err and "SIGTERM received" not in err and "***" not in err, err[-3000:]
        if sig == signal.SIGINT:
            assert proc.returncode == 0 and "Stopped server" in out, (proc.returncode, out, err[-2000:])
        else:
            assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-2000:])  # the default action, kept
        assert exit_s < 6, f"{sig.name}: the host took {exit_s:.1f} s to exit"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for p in _running(procs.values()):
            try:
                p.kill()
            except psutil.Error:
                pass


CHAIN = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[1])
    if sys.argv[2] == "host-handler":
        signal.signal(signal.SIGTERM, lambda s, f: (print("host handler", flush=True), sys.exit(3)))
    elif sys.argv[2] == "ignored":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from comfy_h3_nodes.cluster.ray_cluster import install_exit_hooks
    print("hooked", install_exit_hooks(), install_exit_hooks(), flush=True)  # idempotent
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    print("still running", flush=True)
""")


@pytest.mark.parametrize("host, rc, out", [("default", -signal.SIGTERM, "hooked True True\n"),
                                           ("host-handler", 3, "hooked True True\nhost handler\n"),
                                           ("ignored", 0, "hooked True True\nstill running\n")])
def test_sigterm_hook_keeps_what_the_host_did(host, rc, out):
    """Without a cluster the hook is invisible: SIGTERM still ends the process by the signal, calls the host's own
    handler, or stays ignored."""
    proc = subprocess.run([sys.executable, "-c", CHAIN, str(REPO), host], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (rc, out), proc.stderr
    assert "Traceback" not in proc.stderr
