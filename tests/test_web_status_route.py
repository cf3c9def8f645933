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
