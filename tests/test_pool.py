"""A pool of DiT workers on a three-node embedded cluster: A (127.0.0.2), B1 (127.0.0.3, the session's B node) and
B2 (127.0.0.4, a raylet this module adds to the session cluster and removes afterwards).

Workers are started as ``remote_worker setup`` starts them: a named, detached DiT actor pinned to its node, here
with ``max_restarts=0`` (a killed worker stays dead) and one resident partition (``residency one``), so routing by
partition shows. The executor runs A in this process (as inside ComfyUI) with the spec ``h3_pool_*``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict

import numpy as np
import pytest

from comfy_h3_nodes.engine.executor import pool as pl
from conftest import add_b2, workflow_request

B1_IP, B2_IP = "127.0.0.3", "127.0.0.4"
NS = "comfy_h3"
SPEC = "h3_pool_*"
PACK_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------------- rules (no Ray)
def _w(name, partitions, queued, queue=()):
    return pl.Worker(name, None, {"resident_partitions": list(partitions), "queued_steps": queued,
                                  "queue": list(queue)})


def test_pool_spec_names_lists_and_prefixes():
    assert pl.parse_spec(" a, b* ") == ("a", "b*")
    assert pl.matches("h3_dit*", "h3_dit") and pl.matches("h3_dit*", "h3_dit_b2")
    assert not pl.matches("h3_dit*", "x_h3_dit") and pl.matches("a,b", "b") and not pl.matches("a,b", "ab")
    assert pl.create_name("h3_dit*") == "h3_dit" and pl.create_name("b1, h3*") == "b1"
    for bad in ("", " , ", "a*b", "h3_[ab]"):
        with pytest.raises(ValueError):
            pl.parse_spec(bad)


def test_pool_choice_partition_then_queued_steps():
    holds_ref_busy = _w("b1", ["transformer_ref"], 40)
    holds_t2va_idle = _w("b2", ["transformer"], 0)
    # the partition the workflow needs wins over a shorter queue ...
    assert pl.choose([holds_ref_busy, holds_t2va_idle], "transformer_ref").name == "b1"
    assert pl.choose([holds_ref_busy, holds_t2va_idle], "transformer").name == "b2"
    # ... then the queue counted in steps, not requests: one request of 40 steps waits longer than two of 3
    one_long = _w("b1", ["transformer"], 40, [{"steps": 40}])
    two_short = _w("b2", ["transformer"], 6, [{"steps": 3}, {"steps": 3}])
    assert pl.choose([one_long, two_short], "transformer").name == "b2"
    assert pl.choose([one_long, two_short], "transformer", exclude=("b2",)).name == "b1"
    assert pl.choose([one_long], "transformer", exclude=("b1",)) is None
    # ties: the name, so every client makes the same choice
    assert pl.choose([_w("b2", ["transformer"], 0), _w("b1", ["transformer"], 0)], "transformer").name == "b1"


def test_pool_setup_joins_beside_other_b_nodes():
    """`remote_worker setup --name NAME` on another machine: preflight lets it join the B nodes already there."""
    from remote_worker import cli, service
    from remote_worker.preflight import roles_check

    a = {"ip": "10.0.0.1", "alive": True, "roles": ["h3_role_a"]}
    b1 = {"ip": "10.0.0.2", "alive": True, "roles": ["h3_role_b"]}
    ok, line, _, reuse = roles_check([a, b1], "10.0.0.3")
    assert ok and not reuse and "10.0.0.2 also hold role B" in line and "--name" in line
    assert roles_check([a, b1], "10.0.0.2")[0] and roles_check([a, b1], "10.0.0.2")[3]
    ok, line, fix, _ = roles_check([b1], "10.0.0.3")
    assert not ok and "no alive node offers role A" in line and "start-head" in fix
    args = cli.parser().parse_args(["setup", "--head", "10.0.0.1:6379", "--model-path", "tiny-random",
                                    "--name", "h3_dit_b2"])
    assert args.name == "h3_dit_b2" and pl.matches("h3_dit*", args.name)
    assert "--name h3_dit_b2" in " ".join(service.setup_argv(args, cli.parser()))


def test_pool_a_worker_cut_off_costs_its_bound_once_while_another_answers(ray_cluster):
    """A worker whose status does not come within the bound (its link or host cut off) is quiet for a while: while
    another worker answers, the next discoveries give it only QUIET_WAIT_S, not the whole bound again; alone, or once
    it answers, it is waited for in full again. Real named actors whose pool_status hangs on request."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_concurrency=8)
    class Silent:
        def __init__(self):
            self.silent = False

        def hush(self, on: bool):
            self.silent = on

        def pool_status(self):
            t0 = time.monotonic()
            while self.silent and time.monotonic() - t0 < 30:
                time.sleep(0.05)
            return {"resident_partitions": ["transformer"], "queued_steps": 0}

    # on this process's node: an earlier module's extra node may be gone (a node-free actor could land there)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    made = [Silent.options(name=f"h3_quiet_{x}", namespace=NS, lifetime="detached", scheduling_strategy=here).remote()
            for x in "ab"]
    try:
        a, b = made
        ray.get([m.hush.remote(False) for m in made], timeout=60)
        bound = 4.0
        pool = pl.DiTPool("h3_quiet_*", NS, status_timeout=bound)
        assert [w.name for w in pool.refresh()] == ["h3_quiet_a", "h3_quiet_b"]
        ray.get(b.hush.remote(True), timeout=10)
        t0 = time.monotonic()
        assert [w.name for w in pool.refresh()] == ["h3_quiet_a"]
        first = time.monotonic() - t0
        assert first >= bound - 0.1 and pool.missing == {"h3_quiet_b": f"no status within {bound:g} s"}
        t0 = time.monotonic()
        assert [w.name for w in pool.refresh()] == ["h3_quiet_a"]
        again = time.monotonic() - t0
        assert again < bound - 1 and "nor within 0.5 s now" in pool.missing["h3_quiet_b"], (again, pool.missing)
        print(f"\nworker cut off: first discovery {first:.2f} s, the next {again:.2f} s (bound {bound:g} s)")
        # alone (its partner excluded), a quiet worker gets the whole bound: nothing else could take the request
        t0 = time.monotonic()
        assert pool.refresh(exclude=("h3_quiet_a",)) == [] and time.monotonic() - t0 >= bound - 0.1
        with pytest.raises(pl.PoolError, match="h3_quiet_b: no status within 4 s"):
            pool.pick("t2va", exclude=("h3_quiet_a",))
        ray.get(b.hush.remote(False), timeout=10)  # its link is back: found at once, no longer quiet
        assert [w.name for w in pool.refresh()] == ["h3_quiet_a", "h3_quiet_b"] and pool.quiet == {}
    finally:
        for m in made:
            ray.kill(m, no_restart=True)


# ---------------------------------------------------------------------------------------------------- three nodes
def _node_id(ip: str) -> str:
    from comfy_h3_nodes.cluster import ray_cluster as cl

    return next(n.node_id for n in cl.list_nodes() if n.alive and n.ip == ip)


def start_worker(name: str, ip: str, ckpt, **extra):
    """A DiT worker as ``remote_worker setup --name NAME`` starts it, pinned to the node at ``ip``."""
    import ray

    from comfy_h3_nodes.engine.contract.configs import BConfig
    from comfy_h3_nodes.tools.bench import substitutes

    stages = extra.pop("stages", None)
    cfg = asdict(BConfig(str(ckpt), dtype="float32", threads=1, name=name, max_restarts=0, namespace=NS, **extra))
    cfg["residency"] = "one"
    actor = substitutes.actors(stages).dit(cfg, node_id=_node_id(ip), env=substitutes.env(stages))
    assert ray.get(actor.ping.remote(), timeout=180) == ip
    return actor


def status(actor) -> dict:
    import ray

    return ray.get(actor.pool_status.remote(), timeout=20)


@pytest.fixture(scope="module")
def b2_node(ray_cluster):
    yield from add_b2(ray_cluster, B2_IP)


@pytest.fixture(scope="module")
def workers(b2_node, tiny_ckpt):
    import ray

    # each denoise lasts at least a second (a stand-in tail after the steps), so a test can kill a worker mid-call
    slow = {"stages": {"denoise": 1.0}}
    made = {"b1": start_worker("h3_pool_b1", B1_IP, tiny_ckpt, **slow),
            "b2": start_worker("h3_pool_b2", B2_IP, tiny_ckpt, **slow)}
    yield made
    for actor in made.values():
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - killed by a test already
            pass


@pytest.fixture(scope="module")
def a_side(tiny_ckpt):
    from comfy_h3_nodes.engine.a_side.side import ASide

    return ASide(str(tiny_ckpt), dtype="float32")


def make_executor(spec, tiny_ckpt, a_side):
    from comfy_h3_nodes import placement
    from comfy_h3_nodes.engine.executor import H3Executor
    from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts

    ex = H3Executor(a_side, BConfig(str(tiny_ckpt), dtype="float32", threads=1, name=spec), actors=placement.ACTORS,
                    timeouts=Timeouts(start=120, health=10, encode=60, handoff=60, stall=60, decode=60, poll=0.05))
    return ex.start()


@pytest.fixture(scope="module")
def pool_ex(workers, tiny_ckpt, a_side):
    ex = make_executor(SPEC, tiny_ckpt, a_side)
    yield ex
    ex.shutdown(kill_b=False)


def denoise_record(result):
    return next(r for r in result.records if r.stage == "denoise")


def ran_on(result) -> str:
    return denoise_record(result).info["worker"]


def test_pool_finds_every_matching_worker(pool_ex, workers):
    health = pool_ex.check_health()
    names = {w["name"]: w for w in health["workers"]}
    assert set(names) == {"h3_pool_b1", "h3_pool_b2"}
    assert {names["h3_pool_b1"]["node"], names["h3_pool_b2"]["node"]} == {B1_IP, B2_IP}
    assert all(w["partitions"] == ["transformer"] and w["queued_steps"] == 0 for w in names.values())
    assert set(pool_ex.topology.to_dict()["B_nodes"][i]["ip"] for i in range(2)) == {B1_IP, B2_IP}


def test_pool_node_connects_to_every_worker(pool_ex, workers, ray_cluster, tiny_ckpt):
    """H3RemoteDiT with a prefix spec: one connection that shows every worker it matched."""
    import comfy_h3_nodes.nodes as nodes
    from comfy_h3_nodes.engine import session
    from comfy_h3_nodes.host import LocalHost, set_host

    session.adopt_cluster(ray_cluster.address)
    set_host(LocalHost())
    try:
        out = nodes.H3RemoteDiT().connect("local", SPEC, NS, str(tiny_ckpt), "transformer", "float32", "sdpa")
        text = json.dumps(out["ui"])
        assert "pool of 2: h3_pool_b1 127.0.0.3, h3_pool_b2 127.0.0.4" in text
        assert {"h3_pool_b1", "h3_pool_b2"} <= {w["name"] for w in session.status(timeout=10)["workers"]}
        with pytest.raises(Exception, match="only a trailing"):
            nodes.H3RemoteDiT().connect("local", "h3_*pool", NS, str(tiny_ckpt), "transformer", "float32", "sdpa")
    finally:
        session.forget(SPEC)


def test_pool_routes_by_load_counted_in_steps(pool_ex, workers, media):
    import ray

    b1, b2 = workers["b1"], workers["b2"]
    try:
        ray.get(b1.enqueue.remote("other-b1", 40, "another client"), timeout=10)  # one long request
        assert status(b1)["queued_steps"] == 40
        assert ran_on(pool_ex.generate(workflow_request("t2va", media, seed=31)[0])) == "h3_pool_b2"
        ray.get([b2.enqueue.remote("other-b2a", 3, "another client"),
                 b2.enqueue.remote("other-b2b", 3, "another client")], timeout=10)  # two short ones: 6 steps
        assert ran_on(pool_ex.generate(workflow_request("t2va", media, seed=32)[0])) == "h3_pool_b2"
        ray.get(b2.enqueue.remote("other-b2c", 40, "another client"), timeout=10)  # now 46 steps on B2
        assert ran_on(pool_ex.generate(workflow_request("t2va", media, seed=33)[0])) == "h3_pool_b1"
    finally:
        ray.get([b1.dequeue.remote("other-b1")] + [b2.dequeue.remote(f"other-b2{x}") for x in "abc"], timeout=10)
    assert status(b1)["queued_steps"] == status(b2)["queued_steps"] == 0


def test_pool_routes_by_partition(pool_ex, workers, media):
    import ray

    b1, b2 = workers["b1"], workers["b2"]
    first = pool_ex.generate(workflow_request("ref2va", media, seed=41)[0])  # both must swap: the tie goes to B1
    assert ran_on(first) == "h3_pool_b1" and denoise_record(first).info["partition"] == "transformer_ref"
    assert status(b1)["resident_partitions"] == ["transformer_ref"]
    try:
        ray.get(b1.enqueue.remote("other-b1", 40, "another client"), timeout=10)
        # B1 holds transformer_ref: a ref2va goes there even behind 40 queued steps; a t2va goes to B2 (no swap)
        again = pool_ex.generate(workflow_request("ref2va", media, seed=42)[0])
        assert ran_on(again) == "h3_pool_b1" and denoise_record(again).info["swapped_s"] == 0
        assert ran_on(pool_ex.generate(workflow_request("t2va", media, seed=43)[0])) == "h3_pool_b2"
    finally:
        ray.get(b1.dequeue.remote("other-b1"), timeout=10)
    assert status(b2)["resident_partitions"] == ["transformer"]


def test_pool_status_shows_current_request_and_client(pool_ex, workers, media):
    from comfy_h3_nodes.engine import session

    req = workflow_request("t2va", media, seed=51, steps=40)[0]
    fut = pool_ex.submit(req)
    seen = None
    deadline = time.monotonic() + 60
    while seen is None and time.monotonic() < deadline and not fut.done():
        for a in workers.values():
            cur = status(a)["current"]
            if cur and cur["request_id"] == req.request_id:
                seen = cur
        time.sleep(0.05)
    fut.result(timeout=120)
    assert seen is not None and seen["client"] == pool_ex.pool.client and seen["total"] >= 39
    key = ("pool-test",) * 8
    session._executors[key] = pool_ex
    try:
        out = session.status(timeout=10)
    finally:
        session._executors.pop(key, None)
    listed = {w["name"]: w for w in out["workers"]}
    assert {"h3_pool_b1", "h3_pool_b2"} <= set(listed)
    for w in listed.values():
        assert {"node", "partitions", "queue", "current_request", "client"} <= set(w)


def test_pool_two_drivers_share_the_workers(pool_ex, workers, ray_cluster, tiny_ckpt, media):
    import ray

    script = textwrap.dedent(f"""
        import json, torch
        torch.set_num_threads(1)
        from comfy_h3_nodes import placement
        from comfy_h3_nodes.cluster.ray_cluster import connect, A_IP
        from comfy_h3_nodes.engine.executor import H3Executor
        from comfy_h3_nodes.engine.contract.configs import BConfig, SideConfig, Timeouts
        from comfy_h3_nodes.engine.contract.request import H3Request
        connect("{ray_cluster.address}", node_ip=A_IP)
        from comfy_h3_nodes.engine.a_side.side import ASide
        ex = H3Executor(ASide("{tiny_ckpt}", dtype="float32"),
                        BConfig("{tiny_ckpt}", dtype="float32", threads=1, name="{SPEC}"),
                        actors=placement.ACTORS, timeouts=Timeouts(start=120, health=10, poll=0.05))
        ex.start()
        reqs = [H3Request(prompt="second driver", height=64, width=64, num_frames=124, steps=8, seed=60 + i,
                          request_id=f"drv2-{{i}}") for i in range(3)]
        res = ex.run_many(reqs)
        print(json.dumps({{"client": ex.pool.client,
                           "workers": [next(r for r in x.records if r.stage == "denoise").info["worker"]
                                       for x in res]}}))
        ex.shutdown()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ))
    try:
        mine = pool_ex.run_many([workflow_request("t2va", media, seed=70 + i, steps=8)[0] for i in range(3)])
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    theirs = json.loads(out.strip().splitlines()[-1])
    assert theirs["client"] != pool_ex.pool.client
    assert all(r.media.frames.shape == (124, 64, 64, 3) for r in mine)
    served = [e for a in workers.values() for e in ray.get(a.health.remote(), timeout=20)["recent"]]
    clients = {e.get("client") for e in served}
    assert {pool_ex.pool.client, theirs["client"]} <= clients
    assert {e["request_id"] for e in served} >= {f"drv2-{i}" for i in range(3)}


def test_pool_bench_json_and_both_workers_serve(b2_node, tiny_ckpt):
    """``bench pool`` on the session's three nodes, shortened: its JSON line, and with two workers both serve.

    The speedup itself is the benchmark's figure (README): on this 2-core machine, with the other CI lane sharing
    the cores, a makespan is no basis for a pass or a fail."""
    from comfy_h3_nodes.tools.bench.pool import main_json, run_pool

    res = run_pool(4, {"encode": 0.02, "denoise": 0.5, "decode": 0.02}, max_in_flight=4, ckpt=tiny_ckpt,
                   log=lambda s: None)
    line = json.loads(main_json(res))
    assert set(line) == {"workers", "speedup"} and set(line["workers"]) == {"1", "2"}
    assert all(line["workers"][k]["makespan_s"] > 0 for k in ("1", "2"))
    assert line["speedup"] == round(line["workers"]["1"]["makespan_s"] / line["workers"]["2"]["makespan_s"], 3)
    assert res["served"]["1"] == {"b1": 4}, res["served"]
    assert set(res["served"]["2"]) == {"b1", "b2"}, res["served"]  # the pool routed to both workers


def test_pool_worker_killed_mid_denoise_reruns_bit_identical(pool_ex, workers, tiny_ckpt, a_side, media):
    import ray

    b1, b2 = workers["b1"], workers["b2"]
    workflow = "ref2va" if "transformer_ref" in status(b1)["resident_partitions"] else "t2va"
    req, _ = workflow_request(workflow, media, seed=81, steps=12)
    alone = make_executor("h3_pool_b2", tiny_ckpt, a_side)  # a pool of one worker: B2
    try:
        assert [w.name for w in alone.pool.refresh()] == ["h3_pool_b2"]
        expected = alone.generate(workflow_request(workflow, media, seed=81, steps=12)[0])
    finally:
        alone.shutdown(kill_b=False)
    assert ran_on(expected) == "h3_pool_b2"
    pid = ray.get(b1.health.remote(), timeout=20)["pid"]
    killed = []

    def on_step(ev):
        if ev.index == 1 and not killed:
            killed.append(time.monotonic())
            os.kill(pid, signal.SIGKILL)

    ray.get(b2.enqueue.remote("other-b2", 100, "another client"), timeout=10)  # so the request starts on B1
    try:
        t0 = time.monotonic()
        result = pool_ex.generate(req, on_step=on_step)
    finally:
        ray.get(b2.dequeue.remote("other-b2"), timeout=10)
    t_done = time.monotonic()
    assert killed, "B1 was never killed: the request did not start there"
    rec = denoise_record(result)
    a_to_b = next(r for r in result.records if r.stage == "a_to_b")
    rerun_start = a_to_b.start - time.time() + t_done  # B2's receive began (this machine's monotonic clock)
    print(f"\nre-run cost: kill -> B2 starts receiving {rerun_start - killed[0]:.3f} s; A->B again "
          f"{a_to_b.end - a_to_b.start:.3f} s; denoise again {rec.end - rec.start:.3f} s; kill -> result "
          f"{t_done - killed[0]:.3f} s")
    assert ran_on(result) == "h3_pool_b2" and "re-run on worker h3_pool_b2" in rec.note
    assert "h3_pool_b1" in rec.info["rerun"] and "lost" in rec.info["rerun"]
    assert np.array_equal(result.media.frames, expected.media.frames)
    assert np.array_equal(result.media.audio, expected.media.audio)
    assert time.monotonic() - t0 < 120


def test_pool_rerun_payload_is_a_copy_only_a_holds(b2_node):
    """A re-run fetches a payload that only A holds: the lost worker's node may keep a copy, and Ray pulls from a
    holder picked at random, asking a silent one again only after 10, 20, 40 ... s (a cut-off B2's copy once held
    a re-run's fetch past its 300 s bound)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from comfy_h3_nodes.engine.executor.handoff import get_object_locations, sole_copy

    value = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: in the object store, not inline
    ref = ray.put(value)

    @ray.remote(num_cpus=0)
    def fetch(refs):
        return float(ray.get(refs[0], timeout=30).sum())

    b2_id = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == B2_IP)
    on_b2 = NodeAffinitySchedulingStrategy(b2_id, soft=False)
    assert ray.get(fetch.options(scheduling_strategy=on_b2).remote([ref]), timeout=60) == float(value.sum())
    here = ray.get_runtime_context().get_node_id()
    held = set(get_object_locations([ref], timeout_ms=10_000)[ref]["node_ids"])
    assert held == {here, b2_id}, held  # B2 kept its copy: a re-run could pull from it
    fresh = sole_copy(ref, 30)
    assert fresh != ref
    assert get_object_locations([fresh], timeout_ms=10_000)[fresh]["node_ids"] == [here]
    assert np.array_equal(ray.get(fresh, timeout=30), value)


def test_pool_no_worker_left_says_so_within_10s(pool_ex, workers, b2_node, ray_cluster, media):
    """The last worker leaves mid-request (its machine's Ray node goes): one clear error within 10 s."""
    import threading

    from comfy_h3_nodes.engine.contract.errors import H3Error

    assert [w.name for w in pool_ex.pool.refresh()] == ["h3_pool_b2"]  # B1 was killed above
    gone = []

    def on_step(ev):
        if ev.index == 1 and not gone:
            gone.append(time.monotonic())
            threading.Thread(target=ray_cluster.remove_node, args=(b2_node,), daemon=True).start()

    req = workflow_request("t2va", media, seed=91, steps=12)[0]
    with pytest.raises(H3Error) as info:
        pool_ex.generate(req, on_step=on_step)
    assert gone and time.monotonic() - gone[0] < 10
    print(f"\nlast worker left: the error came {time.monotonic() - gone[0]:.2f} s after its node was removed")
    msg = str(info.value)
    assert req.request_id in msg and "h3_pool_b2" in msg and "not re-run" in msg and B2_IP in msg, msg
    assert "left the Ray cluster" in msg


def test_pool_worker_that_joins_later_is_used(pool_ex, tiny_ckpt, workers, media):
    import ray

    b3 = start_worker("h3_pool_b3", B1_IP, tiny_ckpt)  # a new machine's worker (on B1's node: B1 left)
    workers["b3"] = b3
    try:
        result = pool_ex.generate(workflow_request("t2va", media, seed=95)[0])
    finally:
        ray.kill(b3, no_restart=True)
    assert ran_on(result) == "h3_pool_b3" and "re-run" not in denoise_record(result).note
    assert result.media.frames.shape == (124, 64, 64, 3)



def test_pool_link_down_error_rebuilt_with_the_worker_names_keeps_its_parts():
    """A's link probe's error, rebuilt as the one sentence of a request no other worker took (the host-lost path of
    ``BClient._lost_error``): one argument builds it, and its short cause survives (it failed on CI: a TypeError)."""
    from comfy_h3_nodes.engine.contract.errors import H3Error
    from comfy_h3_nodes.engine.executor.link import LinkDown

    err = LinkDown("machine B (198.18.1.2) was lost during denoise of request r1: its Ray node refuses connections.",
                   "its host refused connections")
    again = type(err)(f"{str(err).rstrip('.')} (DiT worker h3_dit; no other DiT worker answers, so it was not re-run).")
    assert isinstance(again, H3Error) and str(again).endswith("so it was not re-run).") and again.short
