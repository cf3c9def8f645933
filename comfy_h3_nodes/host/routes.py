"""HTTP handlers behind ``GET /h3/status`` and ``GET /h3/timings`` (aiohttp; registered on ComfyUI's server by
:func:`comfy_h3_nodes.host.register_routes`, and on any aiohttp app by :func:`add_routes`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket

from aiohttp import web

from ..engine import session


async def status_handler(request: web.Request) -> web.Response:
    # health calls block on Ray (each bounded): keep them off the server's event loop
    data = await asyncio.to_thread(session.status)
    return web.json_response(with_a_process(data), dumps=_dumps)


def with_a_process(data: dict) -> dict:
    """Names A when no actor reports a health entry for it: A's encoders then run inside this (ComfyUI's) process,
    which has no actor to ask, so the panel says so instead of showing A's health as unknown."""
    actors = data.get("actors") or []
    if not any(isinstance(a, dict) and (a.get("health") or {}).get("A") for a in actors):
        data["a_process"] = {"in_process": True, "hostname": socket.gethostname(), "pid": os.getpid()}
    return data


async def timings_handler(request: web.Request) -> web.Response:
    rid = request.query.get("request_id") or None
    if request.query.get("format") == "csv":
        return web.Response(text=session.TIMINGS.to_csv(rid), content_type="text/csv",
                            headers={"Content-Disposition": 'attachment; filename="h3_timings.csv"'})
    return web.json_response({"records": session.TIMINGS.to_json(rid)}, dumps=_dumps)


#: what the pack serves (ComfyUI mirrors each under /api/...)
ROUTES = {"/h3/status": status_handler, "/h3/timings": timings_handler}


def add_routes(app: web.Application, prefix: str = "") -> None:
    for path, handler in ROUTES.items():
        app.router.add_get(f"{prefix}{path}", handler)


def _dumps(obj) -> str:
    return json.dumps(obj, default=str)
