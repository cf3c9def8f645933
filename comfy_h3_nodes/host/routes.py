"""HTTP handlers behind ``GET /h3/status``, ``GET /h3/timings`` and ``POST /h3/release_b`` (aiohttp; registered on
ComfyUI's server by :func:`comfy_h3_nodes.host.register_routes`, and on any aiohttp app by :func:`add_routes`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket

from aiohttp import web

from ..engine import session
from . import host


async def status_handler(request: web.Request) -> web.Response:
    # health calls block on Ray (each bounded): keep them off the server's event loop
    data = await asyncio.to_thread(session.status)
    if request.query.get("resources"):  # what a soak samples: object store, Ray's folder, the pack's caches
        data["resources"] = await asyncio.to_thread(session.resources)
    try:  # what waits for B: ComfyUI's queued prompts that hold a node reaching B (the panel lists them)
        data["queue"] = host().queued_for_b()
    except Exception as exc:  # noqa: BLE001 - reported, never failing the status
        data["queue"], data["queue_error"] = [], str(exc)
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


async def release_b_handler(request: web.Request) -> web.Response:
    """"Release B's model" (the H3 panel's button): every DiT worker this ComfyUI uses drops its weights and keeps its
    actor. Body (optional): ``{"actor_name": spec, "namespace": ns}``. 200 with what each released, 409 when this
    ComfyUI is not joined to a cluster, 504 when no worker answered in time."""
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        return web.json_response({"error": "the body is not JSON; send {} or {\"actor_name\": ...}"}, status=400)
    spec = (body or {}).get("actor_name") or None
    namespace = (body or {}).get("namespace") or None
    try:
        out = await asyncio.to_thread(session.release_b, spec, namespace)
    except Exception as exc:  # noqa: BLE001 - the sentence goes to the panel
        status = 409 if "not connected" in str(exc) else 502
        return web.json_response({"error": str(exc)}, status=status)
    if not out["released"]:
        return web.json_response({**out, "error": "no DiT worker released its model: "
                                  + "; ".join(f"{k}: {v}" for k, v in out["missing"].items())}, status=504)
    return web.json_response(out, dumps=_dumps)


#: what the pack serves (ComfyUI mirrors each under /api/...)
ROUTES = {"/h3/status": status_handler, "/h3/timings": timings_handler}
POST_ROUTES = {"/h3/release_b": release_b_handler}


def add_routes(app: web.Application, prefix: str = "") -> None:
    for path, handler in ROUTES.items():
        app.router.add_get(f"{prefix}{path}", handler)
    for path, handler in POST_ROUTES.items():
        app.router.add_post(f"{prefix}{path}", handler)


def _dumps(obj) -> str:
    return json.dumps(obj, default=str)
