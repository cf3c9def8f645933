"""``GET /h3/status`` names A when A has no health entry of its own: its encoders run inside ComfyUI's process (no
actor to ask), and the panel says "A in ComfyUI's process" instead of an unknown health with a raw JSON tooltip."""

from __future__ import annotations

import asyncio
import os
import socket

from comfy_h3_nodes.host import routes


def test_an_a_without_a_health_entry_is_the_process_serving_the_route():
    data = {"connected": True, "actors": [{"name": "h3_dit", "health": {"B": {"ok": True}, "workers": []}}]}
    out = routes.with_a_process(data)
    assert out["a_process"] == {"in_process": True, "hostname": socket.gethostname(), "pid": os.getpid()}
    # not connected yet (no actors): still this process
    assert routes.with_a_process({"connected": False, "actors": []})["a_process"]["in_process"] is True


def test_an_a_actor_that_reports_its_health_is_left_as_it_is():
    data = {"actors": [{"name": "h3_dit", "health": {"A": {"ok": True, "pid": 7}, "B": {"ok": True}}}]}
    assert "a_process" not in routes.with_a_process(data)


def test_the_route_answers_with_it():
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    async def go():
        app = web.Application()
        routes.add_routes(app)
        async with TestClient(TestServer(app)) as client:
            return await (await client.get("/h3/status")).json()

    st = asyncio.run(go())
    assert st["a_process"]["pid"] == os.getpid() and st["a_process"]["in_process"] is True


def test_a_dit_rank_of_parallel_denoise_is_listed_with_its_pid(monkeypatch):
    """With ``parallel`` on, A's DiT rank (an actor in its own process on A) is one of /h3/status's workers, with its
    machine and pid as a B worker's; one that does not answer is listed with its last pid and why. The actor calls
    are stood in for (Ray's ``get``); tests/test_parallel.py checks it on the real cluster."""
    from comfy_h3_nodes.engine.executor import group as G

    class Call:
        def __init__(self, result):
            self.result = result

        def remote(self):
            return self.result

    class Handle:
        def __init__(self, result):
            self.pool_status = Call(result)

    answers = {"ok": {"ok": True, "node_ip": "10.0.0.1", "pid": 4242, "resident_partitions": ["transformer"],
                      "precision": "auto", "dtype": "bfloat16", "queue": [], "queued_steps": 0, "current": None}}

    def get(ref, timeout):
        assert timeout <= 2.0  # bounded by the caller's health bound
        if ref == "dead":
            raise RuntimeError("ActorDiedError: the actor died")
        return answers[ref]

    monkeypatch.setattr(G.ray, "get", get)
    groups = G.Groups(start_a_rank=None, timeouts=None)
    assert groups.a_rank_status(2.0) is None  # parallel never ran: nothing to list
    groups.a_rank = G.Rank("A", G.A_RANK_NAME, Handle("ok"), "10.0.0.1", 4242)
    row = groups.a_rank_status(2.0)
    assert (row["name"], row["machine"], row["pid"], row["node"], row["ok"]) == (G.A_RANK_NAME, "A", 4242, "10.0.0.1",
                                                                                   True)
    assert row["partitions"] == ["transformer"] and row["pid"] != os.getpid()
    groups.a_rank = G.Rank("A", G.A_RANK_NAME, Handle("dead"), "10.0.0.1", 4242)
    gone = groups.a_rank_status(2.0)
    assert gone["ok"] is False and gone["pid"] == 4242 and "did not answer" in gone["error"], gone
    assert "ActorDiedError" in gone["error"], gone
