"""The embedded cluster starts from a thread that is not the main one, as ComfyUI runs nodes on its prompt worker
thread (Ray's node start registers a SIGTERM handler, which only the main thread may do), it outlives that thread
(Linux sends Ray's parent-death SIGKILL when the thread that started a process ends: a cluster started from a thread
that then ended lost its GCS and raylets at once), and its raylets go away with the process that started them; and
it starts after that thread converted a video frame (PyAV's per-thread reformatter once hung Ray's fork).

Runs in a subprocess: the test session may already have its own Ray cluster initialised in this process.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import os, threading
    from comfy_h3_nodes.cluster import ray_cluster as cl

    out = {}

    def start():
        try:
            # first a video frame converted on this thread, as core's SaveVideo does on ComfyUI's prompt thread:
            # PyAV 18.1.1 keeps that thread's reformatter (swscale threads), which hung Ray's fork of the GCS
            import av, av.video.frame, numpy as np
            frame = av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")
            frame.reformat(format="yuv420p")
            out["av_thread_local"] = hasattr(av.video.frame, "_thread_local")
            c = cl.EmbeddedCluster(object_store_mb=80, num_cpus=1).start()
            out["topology"] = cl.validate_topology().to_dict()
            out["cluster"] = c
        except BaseException as exc:
            out["error"] = repr(exc)

    t = threading.Thread(target=start, name="prompt_worker")
    t.start()
    t.join(240)
    assert not t.is_alive(), "the cluster did not start within 240 s"
    assert "error" not in out, out.get("error")
    print("A", out["topology"]["A"]["ip"], "B", out["topology"]["B"]["ip"], "av_thread_local", out["av_thread_local"],
          flush=True)
    import ray

    @ray.remote(num_cpus=0, resources={cl.ROLE_B: 1})
    def where():
        return ray.util.get_node_ip_address()

    # the starting thread has ended: the cluster still runs a task on B (its processes were not SIGKILLed with it)
    print("after the thread", ray.get(where.remote(), timeout=120), flush=True)
    out["cluster"].shutdown()
    print("done", flush=True)
""")


def test_embedded_cluster_starts_off_the_main_thread():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
    assert proc.returncode == 0, out[-3000:]
    assert "A 127.0.0.2 B 127.0.0.3 av_thread_local" in out, out[-3000:]
    assert "after the thread 127.0.0.3" in out and "done" in out, out[-3000:]
    assert "signal only works in main thread" not in out


def test_a_wedged_node_start_fails_later_starts_at_once():
    """A start that never returns ends its caller at the bound; later callers are told at once, not queued behind it."""
    import threading
    import time

    from comfy_h3_nodes.cluster import ray_cluster as cl

    starter, release, errors = cl._NodeStarter(), threading.Event(), []
    starter.START_BOUND_S = 1.0

    def call():
        t0 = time.monotonic()
        try:
            starter.run(release.wait, 30)
        except cl.ClusterError as exc:
            errors.append((time.monotonic() - t0, str(exc)))

    for _ in range(2):
        t = threading.Thread(target=call)
        t.start()
        t.join(10)
    release.set()
    (first_s, first), (second_s, second) = errors
    assert 1.0 <= first_s < 5 and "took over 1 s" in first, errors
    assert second_s < 0.5 and "has not returned for" in second and "restart ComfyUI" in second, errors
