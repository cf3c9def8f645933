"""ComfyUI's own cache with the pack's nodes, through a real ComfyUI (its default ``--cache-ram``, and
``--cache-classic``, ``--cache-lru N``, ``--cache-none``): an unchanged prompt queued again comes from the cache with no
call to B; a change after the denoise (decode, save) calls B not at all, a change of what B computes calls it; the
loaders' cached outputs still serve after B's worker restarted or its model was released (the denoise or the sampling
finds the worker again by name and says so); two clients queueing at once keep ComfyUI's order, a prompt deleted from
the queue never reaches B and ``/h3/status`` lists what waits for B. Also the soak (``bench soak``) at CI size.

Reuses the helpers and the skip rule of tests/test_comfyui_integration.py (its server runs ``--cache-none``; this
module's servers run the mode each test names).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid

import pytest

from test_comfyui_integration import (  # noqa: F401 - pytestmark: the same skip rule
    _b_forwards, _core_model_prompt, _http_json, _ids, _of, _ok, _run, _set_widget, _started_comfyui,
    _status, _template, _with_tiny, pytestmark,
)

#: the pack template the cache tests queue: t2va with the turbo LoRA, at a tiny size and 2 steps
TEMPLATE = "h3_t2va_turbo"


@pytest.fixture(scope="module")
def cached(tmp_path_factory, tiny_ckpt):
    """A ComfyUI in its default cache mode (``--cache-ram``)."""
    with _started_comfyui(tmp_path_factory, tiny_ckpt, cache=()) as server:
        yield server


def _pack_prompt(seed: int = 42, steps: int = 2) -> tuple[dict, dict]:
    api, ui = _with_tiny(*_template(TEMPLATE))
    (enc,) = _ids(api, "H3TextEncode")
    for name, value in (("width", 64), ("height", 64), ("num_frames", 124)):
        _set_widget(api, ui, enc, name, value)
    (den,) = _ids(api, "H3RemoteDenoise")
    _set_widget(api, ui, den, "seed", seed)
    _set_widget(api, ui, den, "steps", steps)
    (dec,) = _ids(api, "H3Decode")
    _set_widget(api, ui, dec, "decode_on", "A")  # B never takes a decode share here: a decode change is A's alone
    return api, ui


def _b_counts(server) -> dict:
    """B's served denoises and forwards (its worker's own counters; a restarted worker starts again at 0)."""
    st = _status(server)
    b = next(a["health"]["B"] for a in st["actors"] if "health" in a)
    return {"pid": b["pid"], "denoises": b["denoises"]["served"], "forwards": b["forwards"]["served"]}


def _timed(server, api, ui=None) -> tuple[str, list, dict, float]:
    t0 = time.monotonic()
    pid, messages, entry = asyncio.run(_run(server, api, ui))
    return pid, messages, entry, time.monotonic() - t0


def _ran(messages, pid) -> set[str]:
    return {d["node"] for d in _of(messages, "executing", pid) if d["node"] is not None}


def _cached_nodes(messages, pid) -> set[str]:
    return {n for d in _of(messages, "execution_cached", pid) for n in d["nodes"]}


def test_cache_unchanged_template_prompt_comes_from_the_cache_without_b(cached):
    """The pack's template queued twice: the second runs no node (all from ComfyUI's cache), B's denoise counter is
    unchanged, the prompt is done in under a second; a change of only the decode or save inputs runs those nodes and
    calls B not at all; a change of seed, steps, prompt or LoRA strength calls B once each."""
    api, ui = _pack_prompt()
    pid, messages, _, first_s = _timed(cached, api, ui)
    _ok(messages, pid)
    before = _b_counts(cached)
    pid, messages, _, again_s = _timed(cached, api, ui)
    _ok(messages, pid)
    print(f"\n[h3 cache] pack template: first {first_s:.2f} s, unchanged re-queue {again_s:.3f} s")
    assert not _ran(messages, pid) and _cached_nodes(messages, pid) == set(api), (_ran(messages, pid))
    assert _b_counts(cached) == before
    assert again_s < 1.0, f"the cached prompt took {again_s:.2f} s"

    (dec,) = _ids(api, "H3Decode")
    (save,) = _ids(api, "H3SaveVideo")
    for node, name, value in ((save, "filename_prefix", "h3/cache_prefix"), (dec, "decode_on", "auto")):
        _set_widget(api, ui, node, name, value)
        pid, messages, entry, took = _timed(cached, api, ui)
        _ok(messages, pid)
        ran = _ran(messages, pid)
        assert ran and ran <= {dec, save}, (name, ran)
        assert _b_counts(cached) == before, name
        print(f"[h3 cache] only {name} changed: ran {sorted(ran)} in {took:.2f} s, B not called")

    (den,) = _ids(api, "H3RemoteDenoise")
    (enc,) = _ids(api, "H3TextEncode")
    (lora,) = _ids(api, "H3LoRA")
    for node, name, value in ((den, "seed", 43), (den, "steps", 3), (enc, "prompt", "a blue heron wades, frogs"),
                              (lora, "strength", 0.5)):
        _set_widget(api, ui, node, name, value)
        pid, messages, _, took = _timed(cached, api, ui)
        _ok(messages, pid)
        now = _b_counts(cached)
        assert den in _ran(messages, pid) and now["denoises"] == before["denoises"] + 1, (name, now, before)
        before = now
        print(f"[h3 cache] {name} changed: B denoised once ({took:.2f} s)")


def test_cache_unchanged_core_graph_with_remote_model_runs_no_forward(cached):
    """ComfyUI's own H3 graph with H3RemoteModel queued twice: the second runs no node and no forward on B, in under
    a second; a change after the sampler (the latent's file name) runs no forward; a change of steps runs them."""
    api = _core_model_prompt(True, "cache_core")
    pid, messages, _, first_s = _timed(cached, api)
    _ok(messages, pid)
    before = _b_forwards(cached)["served"]
    pid, messages, _, again_s = _timed(cached, api)
    _ok(messages, pid)
    print(f"\n[h3 cache] core graph: first {first_s:.2f} s, unchanged re-queue {again_s:.3f} s")
    assert not _ran(messages, pid) and _b_forwards(cached)["served"] == before
    assert again_s < 1.0, f"the cached prompt took {again_s:.2f} s"
    api["15"]["inputs"]["name"] = "cache_core_renamed"
    pid, messages, _, _ = _timed(cached, api)
    _ok(messages, pid)
    assert _ran(messages, pid) == {"15"} and _b_forwards(cached)["served"] == before
    api["9"]["inputs"]["steps"] = 4
    pid, messages, _, _ = _timed(cached, api)
    _ok(messages, pid)
    assert "10" in _ran(messages, pid) and _b_forwards(cached)["served"] >= before + 4


def _b_pid(server) -> int:
    (w,) = [w for w in _status(server)["workers"] if w.get("machine", "B") == "B"][:1]
    return w["pid"]


def _wait_b_back(server, old_pid: int, bound: float = 120.0) -> int:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            pid = _b_pid(server)
            if pid != old_pid:
                return pid
        except (ValueError, KeyError, StopIteration):
            pass
        time.sleep(0.5)
    pytest.fail(f"B's worker did not come back within {bound:.0f} s")


def test_cache_loader_output_serves_after_b_restarts_and_after_release(cached):
    """The loaders' outputs stay in ComfyUI's cache while B's worker is killed (Ray restarts it under its name) and
    while B's model is released: the next change (a new seed) runs with H3RemoteDiT / H3RemoteModel still cached,
    and the denoise or sampler readout says what it found (the worker again, by name; the model reloaded). (The pack
    graph first, then the core graph: ComfyUI's RAM cache drops the last graph's outputs when another graph runs
    and RAM is below its inactive threshold, as on this machine.)"""
    api, ui = _pack_prompt(seed=100)
    pid, messages, _, _ = _timed(cached, api, ui)
    _ok(messages, pid)
    (dit,) = _ids(api, "H3RemoteDiT")
    (den,) = _ids(api, "H3RemoteDenoise")
    old = _b_pid(cached)
    os.kill(old, signal.SIGKILL)
    new = _wait_b_back(cached, old)
    _set_widget(api, ui, den, "seed", 101)
    pid, messages, _, _ = _timed(cached, api, ui)
    _ok(messages, pid)
    assert dit in _cached_nodes(messages, pid), "H3RemoteDiT ran again"
    (t,) = [t for t in _of(messages, "h3.timing", pid) if t["node"] == den]
    note = next(s["note"] for s in t["stages"] if s["stage"] == "denoise")
    print(f"\n[h3 cache] after B's worker was killed ({old} -> {new}): {t['summary']['b_note']}")
    assert "restarted" in t["summary"]["b_note"] and str(new) in t["summary"]["b_note"], t["summary"]
    assert t["summary"]["b_note"] in note

    out = _http_json(cached, "POST", "/api/h3/release_b", {})
    assert out["released"], out
    _set_widget(api, ui, den, "seed", 102)
    pid, messages, _, _ = _timed(cached, api, ui)
    _ok(messages, pid)
    assert dit in _cached_nodes(messages, pid)
    (t,) = [t for t in _of(messages, "h3.timing", pid) if t["node"] == den]
    stage = next(s for s in t["stages"] if s["stage"] == "denoise")
    assert "B's model is released" in t["summary"]["b_note"] and stage["info"]["reloaded_after_release_s"] > 0, t
    print(f"[h3 cache] after Release B's model: {t['summary']['b_note']}; reloaded in "
          f"{stage['info']['reloaded_after_release_s']:.2f} s")

    core = _core_model_prompt(True, "cache_core_restart")
    pid, messages, _, _ = _timed(cached, core)
    _ok(messages, pid)
    old = _b_pid(cached)
    os.kill(old, signal.SIGKILL)
    new = _wait_b_back(cached, old)
    core["6"]["inputs"]["noise_seed"] = 2
    pid, messages, _, _ = _timed(cached, core)
    _ok(messages, pid)
    assert "4" in _cached_nodes(messages, pid), "H3RemoteModel ran again"
    (t,) = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
    assert "restarted" in t["stages"][0]["note"] and str(new) in t["stages"][0]["note"], t["stages"][0]["note"]
    _http_json(cached, "POST", "/api/h3/release_b", {})
    core["6"]["inputs"]["noise_seed"] = 3
    pid, messages, _, _ = _timed(cached, core)
    _ok(messages, pid)
    assert "4" in _cached_nodes(messages, pid)
    (t,) = [t for t in _of(messages, "h3.timing", pid) if t["node_type"] == "sampler"]
    assert "B's model is released" in t["stages"][0]["note"], t["stages"][0]["note"]
    print(f"[h3 cache] core graph after a restart and a release: {t['stages'][0]['note']}")


def test_cache_two_clients_keep_the_queue_order_and_a_deleted_prompt_never_reaches_b(cached):
    """Two clients queue 10 prompts each, interleaved: ComfyUI runs them in its queue order, a prompt deleted from
    the queue before it runs never reaches B (B denoises one fewer), and while they wait ``/h3/status`` lists them
    (running, then pending in order) as waiting for B."""
    import urllib.request

    before = _b_counts(cached)["denoises"]
    clients = [uuid.uuid4().hex, uuid.uuid4().hex]
    queued = []
    for i in range(10):
        for c, cid in enumerate(clients):
            api, ui = _pack_prompt(seed=1000 + 2 * i + c)
            body = json.dumps({"prompt": api, "client_id": cid}).encode()
            req = urllib.request.Request(f"{cached.base}/prompt", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                answer = json.loads(r.read())
            queued.append((answer["number"], answer["prompt_id"], cid))
    status = _status(cached)
    waiting = status["queue"]
    assert [w["prompt_id"] for w in waiting] == [p for _, p, _ in queued][-len(waiting):], waiting
    assert len(waiting) >= 15 and all(w["b_nodes"] for w in waiting), len(waiting)
    assert {w["client_id"] for w in waiting} == set(clients)
    deleted = queued[-3][1]
    _http_json(cached, "POST", "/queue", {"delete": [deleted]})
    deadline = time.monotonic() + 600
    while _http_json(cached, "GET", "/queue")["queue_running"] or _http_json(cached, "GET", "/queue")["queue_pending"]:
        assert time.monotonic() < deadline, "the queue did not drain within 600 s"
        time.sleep(1.0)
    history = _http_json(cached, "GET", "/history?max_items=200")
    ran = [p for _, p, _ in queued if p in history]
    assert deleted not in history and len(ran) == len(queued) - 1
    started = {p: next(m[1]["timestamp"] for m in history[p]["status"]["messages"] if m[0] == "execution_start")
               for p in ran}
    assert sorted(ran, key=started.get) == ran, "ComfyUI ran the prompts out of their queue order"
    assert all(history[p]["status"]["status_str"] == "success" for p in ran)
    assert _b_counts(cached)["denoises"] == before + len(ran)
    assert _status(cached)["queue"] == []


def test_cache_every_cache_mode_of_comfyui(tmp_path_factory, tiny_ckpt):
    """``--cache-classic`` and ``--cache-lru 8``: an unchanged prompt comes from the cache (B not called) and a new
    seed calls B; ``--cache-none``: every prompt runs on B again, and works. (``--cache-ram``: the tests above.)"""
    for mode in (("--cache-classic",), ("--cache-lru", "8"), ("--cache-none",)):
        with _started_comfyui(tmp_path_factory, tiny_ckpt, cache=mode) as server:
            api, ui = _pack_prompt(seed=7)
            pid, messages, _, _ = _timed(server, api, ui)
            _ok(messages, pid)
            before = _b_counts(server)["denoises"]
            pid, messages, _, again_s = _timed(server, api, ui)
            _ok(messages, pid)
            after = _b_counts(server)["denoises"]
            print(f"\n[h3 cache] {' '.join(mode)}: re-queue {again_s:.2f} s, B denoised {after - before}")
            assert after == before + (1 if mode == ("--cache-none",) else 0), (mode, before, after)
            (den,) = _ids(api, "H3RemoteDenoise")
            _set_widget(api, ui, den, "seed", 8)
            pid, messages, _, _ = _timed(server, api, ui)
            _ok(messages, pid)
            assert _b_counts(server)["denoises"] == after + 1, mode


#: the CI soak: 30 mixed prompts (``bench soak``'s day, :mod:`comfy_h3_nodes.tools.bench.soak`), growth measured from
#: prompt 10 on (samples at 10, 20, 30)
SOAK_PROMPTS, SOAK_WARMUP = 30, 10
#: bounds after the warm-up, per 100 prompts. Deterministic sizes (MiB: the object stores, Ray's session folder, the
#: pack's cache folder): the issue's goal, 20. Processes' RSS (ComfyUI's, the Ray workers'): 400, i.e. 80 MiB over
#: the 20 prompts measured, since a short run's RSS still moves with first uses and the allocator (30 prompts measured
#: ComfyUI's RSS +68 MiB from prompt 10 to 30 with flat Python objects, 2026-12-04): a leak of a video or latents per
#: prompt (4 MiB or more at these sizes) fails it; the issue's 20 MiB per 100 prompts is what `bench soak --prompts
#: 200` measures (README). Python objects of ComfyUI's process (after a collection): 200,000, i.e. 40,000 over 20
#: prompts (which graph ran last moves the count by tens of thousands: ComfyUI's cache holds its outputs; a request's
#: records, payload dicts and tensors kept per prompt are thousands). Counts: no process, thread or open file more per
#: prompt (a few in all may come and go)
SOAK_MIB_PER_100 = {"comfyui_rss_mib": 400.0, "a_workers_rss_mib": 400.0, "b_workers_rss_mib": 400.0}
SOAK_SIZE_PER_100 = 20.0
SOAK_COUNT_PER_100 = {"processes": 10.0, "comfyui_threads": 15.0, "comfyui_open_files": 15.0,
                      "a_cache_python_objects": 200_000.0}
#: the pack's caches, each bounded by its owner: never above these however long the day
SOAK_CACHE_LIMITS = {"a_cache_lora_sets_a": 8, "a_cache_late_reports": 4096, "a_cache_timing_records": 2000,
                     "a_cache_executors": 8, "a_cache_encoders": 4, "b_cache_progress": 64, "b_cache_recent": 50,
                     "b_cache_contexts": 4, "b_cache_lora_sets": 4, "b_cache_cancelled": 256, "b_cache_queue": 4}


def test_soak_30_mixed_prompts_grow_nothing_past_its_bound(tmp_path):
    """``bench soak`` at CI size: 30 prompts of a day (the pack's template and a core graph with H3RemoteModel in
    turn, parallel A+B, LoRA switches, an interrupt, a bad input, a re-queue, two clients at once) on a ComfyUI of its
    own: no unexpected failure, nothing left of ComfyUI's process tree after its SIGTERM, no metric growing past
    its bound after the warm-up, every cache of the pack within its limit."""
    from comfy_h3_nodes.tools.bench import soak

    lines: list[str] = []
    res = soak.run_soak(SOAK_PROMPTS, comfy_dir=os.environ["COMFYUI_DIR"],
                        python=os.environ.get("COMFYUI_PYTHON") or sys.executable, warmup=SOAK_WARMUP,
                        log=lines.append)
    print("\n" + "\n".join(lines[-8:]) + "\n" + soak.main_json(res))
    assert res["failed_unexpectedly"] == 0, res["failures"]
    assert res["leaked_processes_after_stop"] == 0
    over = {}
    for name, g in res["growth"].items():
        bound = (SOAK_MIB_PER_100.get(name, SOAK_SIZE_PER_100) if name.endswith("_mib")
                 else SOAK_COUNT_PER_100.get(name))
        if bound is not None and g["per_100_prompts"] > bound:
            over[name] = (g, bound)
    assert not over, over
    last = res["samples"][-1][1]
    beyond = {k: (last[k], limit) for k, limit in SOAK_CACHE_LIMITS.items() if last.get(k, 0) > limit}
    assert not beyond, beyond
    assert {k for k in SOAK_CACHE_LIMITS if k.startswith("b_")} <= set(last), sorted(last)
