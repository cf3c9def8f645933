"""The web extension inside ComfyUI's REAL frontend (PyPI ``comfyui-frontend-package``), without ComfyUI.

Our own harness page (tests/test_web_browser.py) attaches the sidebar tab's element before calling ``render(el)``;
the real frontend (1.49) calls ``render(el)`` first and attaches ``el`` afterwards, calls it again on re-renders and
with a new element when the tab is reopened. This test runs the pack's web/ files in the real frontend's lifecycle:

- an aiohttp server on 127.0.0.1 serves the installed frontend's static files, the pack's web/ at
  ``/extensions/comfy-h3/`` (listed by ``/api/extensions``, as ComfyUI does), and answers the frontend's API requests
  from responses recorded from a real ComfyUI 0.33 running this pack (tests/web/fixtures/comfyui_frontend/, written
  by tests/web/record_frontend_fixtures.py); settings are kept in memory and POSTs update them, like ComfyUI;
- ``/api/h3/timings`` lists the stage records of an earlier run (tests/web/fixtures/runner_events.jsonl) and
  ``/api/h3/status`` a healthy cluster (status_ok.json); the websocket ``/ws`` greets like ComfyUI and lets the test
  push a recorded ComfyUI run of the pack (tests/web/fixtures/comfyui_ws_h3_trace.jsonl);
- headless Chromium opens the H3 tab by clicking its button, checks the request rows from /h3/timings, pushes the run
  and checks that the panel and the H3RemoteDenoise node readout follow it live, then closes and reopens the tab;
  once with the classic LiteGraph canvas and once with Vue nodes (setting ``Comfy.VueNodes.Enabled``);
- B's model list (``models.B`` of /h3/status, ``summary.b_models`` of H3RemoteDiT's h3.timing) becomes the choices
  of every H3RemoteDiT node's ``model_path`` combo, the node's value kept; in Vue-node mode the opened select shows it.

Needs Debian's ``chromium``, PyPI's ``playwright`` and ``comfyui-frontend-package`` (the ``[test]`` extra pins the
version the fixtures were recorded with). Missing any fails with instructions, unless ``H3_SKIP_BROWSER=1``.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import time
import uuid

import pytest

from browser_support import CHROMIUM, CHROMIUM_ARGS, ThreadedServer, missing_browser_parts

ROOT = pathlib.Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
FIXTURES = ROOT / "tests" / "web" / "fixtures"
RECORDED = FIXTURES / "comfyui_frontend"
PACK = "comfy-h3"
TAB_BUTTON = ".comfy-h3-timeline-tab-button"  # the frontend's class for a sidebar tab's button: `${id}-tab-button`
VUE_SETTING = "Comfy.VueNodes.Enabled"
MANIFEST = json.loads((RECORDED / "manifest.json").read_text())
FRONTEND_VERSION = MANIFEST["frontend_version"]
INSTALL_HINT = (f"install them with: apt-get update && apt-get install -y chromium && .venv/bin/pip install playwright "
                f"comfyui-frontend-package=={FRONTEND_VERSION}  (or `pip install -e '.[test]'`; no `playwright "
                f"install`: the test drives /usr/bin/chromium); or set H3_SKIP_BROWSER=1 to skip the browser tests")


# ---------------------------------------------------------------------------------------------------- fixture data

def load_events(path: pathlib.Path) -> list[dict]:
    return [m for m in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
            if isinstance(m, dict) and isinstance(m.get("type"), str)]


def stage_records(events: list[dict]) -> list[dict]:
    """The StageRecords the run's h3.timing events carry, once each (what GET /h3/timings lists after the run)."""
    seen, out = set(), []
    for e in events:
        if e["type"] != "h3.timing":
            continue
        for r in e["data"].get("stages") or []:
            key = (r.get("request_id"), r["stage"], r.get("machine"), r.get("start"), r.get("end"))
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out


def by_request(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        if r.get("request_id"):
            out.setdefault(r["request_id"], []).append(r)
    return out


EARLIER = load_events(FIXTURES / "runner_events.jsonl")  # a run before the page opened: only in /h3/timings
LIVE = load_events(FIXTURES / "comfyui_ws_h3_trace.jsonl")  # a real ComfyUI run of the pack: pushed over /ws
EARLIER_RECORDS = stage_records(EARLIER)
LIVE_RECORDS = stage_records(LIVE)
STATUS_OK = json.loads((FIXTURES / "status_ok.json").read_text())


def live_graph() -> dict:
    """A UI-format workflow holding the H3 nodes of the live run, under the ids the run reports."""
    types: dict[str, str] = {}
    for e in LIVE:
        if e["type"] == "h3.timing":
            types[str(e["data"]["node"])] = e["data"]["node_type"]
    nodes = []
    for k, (nid, t) in enumerate(sorted(types.items(), key=lambda kv: int(kv[0]))):
        nodes.append({"id": int(nid), "type": t, "pos": [60 + 400 * (k % 3), 80 + 360 * (k // 3)], "size": [360, 240],
                      "flags": {}, "order": k, "mode": 0, "properties": {}})
    return {"last_node_id": max(n["id"] for n in nodes), "last_link_id": 0, "nodes": nodes, "links": [], "groups": [],
            "config": {}, "extra": {"ds": {"scale": 0.7, "offset": [40, 40]}}, "version": 0.4}


# ---------------------------------------------------------------------------------------------------- server

class FrontendServer(ThreadedServer):
    """The real frontend's files plus ComfyUI's recorded answers, on 127.0.0.1 (random port), in a thread."""

    def __init__(self, static: pathlib.Path):
        self.static = static
        self.responses: dict = json.loads((RECORDED / "responses.json").read_text())
        self.object_info: dict = json.loads((RECORDED / "object_info.json").read_text())
        self.ws_connect = load_events(RECORDED / "ws_connect.jsonl")
        self.settings: dict = {}
        self.records: list[dict] = []
        self.status = STATUS_OK
        self.hits: list[str] = []
        self.misses: list[str] = []
        self.sockets: set = set()
        super().__init__()

    def reset(self, **settings):
        recorded = self.responses["GET /api/settings"]["body"]
        self.settings = {**recorded, **settings}
        self.records = []
        self.hits.clear()
        self.misses.clear()

    # ---- websocket

    def push(self, events: list[dict]):
        """Sends each event to every connected page, in order, as ComfyUI's server does (one JSON text frame each)."""
        async def send():
            for ws in list(self.sockets):
                for e in events:
                    await ws.send_str(json.dumps(e))
        asyncio.run_coroutine_threadsafe(send(), self._loop).result(10)

    def connected(self) -> int:
        return len(self.sockets)

    def _app(self):
        from aiohttp import WSMsgType, web

        recorded_greeting = {m["type"]: m for m in self.ws_connect}

        async def ws_handler(request):
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            sid = request.query.get("clientId") or uuid.uuid4().hex
            status = json.loads(json.dumps(recorded_greeting["status"]))
            status["data"]["sid"] = sid
            await ws.send_str(json.dumps(status))
            self.sockets.add(ws)
            try:
                async for msg in ws:
                    if msg.type == WSMsgType.TEXT:
                        try:
                            data = json.loads(msg.data)
                        except ValueError:
                            continue
                        if data.get("type") == "feature_flags" and "feature_flags" in recorded_greeting:
                            await ws.send_str(json.dumps(recorded_greeting["feature_flags"]))
            finally:
                self.sockets.discard(ws)
            return ws

        def answer(key: str):
            rec = self.responses.get(key)
            if rec is None:
                return None
            body = rec["body"]
            if isinstance(body, (dict, list)) or rec.get("content_type") == "application/json":
                return web.json_response(body, status=rec["status"])
            return web.Response(status=rec["status"], text=body, content_type=rec.get("content_type") or "text/plain")

        async def recorded(request):
            path = request.path
            key = f"{request.method} {path}{'?' + request.query_string if request.query_string else ''}"
            self.hits.append(key)
            resp = answer(key) or answer(f"{request.method} {path}")
            if resp is None:
                self.misses.append(key)
                return web.json_response({"error": "not recorded"}, status=404)
            return resp

        async def index(request):
            return web.FileResponse(self.static / "index.html", headers={"Cache-Control": "no-store"})

        async def extensions(request):
            # the recorded list, with this checkout's web/ files for the pack (as ComfyUI lists them)
            listed = [p for p in self.responses["GET /api/extensions"]["body"]
                      if not p.startswith(f"/extensions/{PACK}/")]
            return web.json_response(listed + sorted(f"/extensions/{PACK}/{p.name}" for p in WEB.glob("*.js")))

        async def pack_file(request):
            path = WEB / request.match_info["name"]
            if not path.is_file() or path.suffix != ".js":
                raise web.HTTPNotFound()
            return web.Response(body=path.read_bytes(), content_type="application/javascript",
                                headers={"Cache-Control": "no-store"})

        async def settings_get(request):
            return web.json_response(self.settings)

        async def setting_get(request):
            return web.json_response(self.settings.get(request.match_info["id"]))

        async def settings_post(request):
            self.settings.update(await request.json())
            return web.Response(status=200)

        async def setting_post(request):
            self.settings[request.match_info["id"]] = await request.json()
            return web.Response(status=200)

        async def object_info(request):
            return web.json_response(self.object_info)

        async def object_info_one(request):
            name = request.match_info["name"]
            return web.json_response({name: self.object_info[name]} if name in self.object_info else {})

        async def h3_status(request):
            self.hits.append("h3/status")
            return web.json_response(self.status)

        async def h3_timings(request):
            self.hits.append("h3/timings")
            return web.json_response({"records": self.records})

        async def other_post(request):
            self.hits.append(f"POST {request.path}")
            return web.json_response({})

        app = web.Application()
        app.router.add_get("/", index)
        app.router.add_get("/ws", ws_handler)
        app.router.add_get("/api/extensions", extensions)
        app.router.add_get(f"/extensions/{PACK}/{{name}}", pack_file)
        app.router.add_get("/api/settings", settings_get)
        app.router.add_get("/api/settings/{id}", setting_get)
        app.router.add_post("/api/settings", settings_post)
        app.router.add_post("/api/settings/{id}", setting_post)
        app.router.add_get("/api/object_info", object_info)
        app.router.add_get("/api/object_info/{name}", object_info_one)
        app.router.add_get("/api/h3/status", h3_status)
        app.router.add_get("/api/h3/timings", h3_timings)
        for prefix in ("/api", "/internal", "/templates"):
            app.router.add_get(prefix + "/{tail:.*}", recorded)
            app.router.add_post(prefix + "/{tail:.*}", other_post)
        app.router.add_static("/", self.static)
        return app

    async def _closing(self) -> None:
        for ws in list(self.sockets):
            await ws.close()


# ---------------------------------------------------------------------------------------------------- fixtures

def _frontend_static() -> pathlib.Path | str:
    """The installed frontend's static folder, or why it cannot be used."""
    try:
        import comfyui_frontend_package
    except ImportError:
        return "the comfyui-frontend-package Python package"
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version("comfyui-frontend-package")
    except PackageNotFoundError:
        have = "unknown"
    if have != FRONTEND_VERSION:
        return (f"comfyui-frontend-package=={FRONTEND_VERSION} (the version the fixtures were recorded with; "
                f"{have} is installed)")
    static = pathlib.Path(comfyui_frontend_package.__file__).resolve().parent / "static"
    if not (static / "index.html").is_file():
        return f"comfyui-frontend-package's static files ({static} has no index.html)"
    return static


@pytest.fixture(scope="module")
def frontend():
    skip = os.environ.get("H3_SKIP_BROWSER") == "1"
    missing = missing_browser_parts()
    static = _frontend_static()
    if isinstance(static, str):
        missing.append(static)
    if missing:
        msg = f"the real-frontend test needs {' and '.join(missing)}: {INSTALL_HINT}"
        if skip:
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)
    server = FrontendServer(static).start()
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                yield browser, server
            finally:
                browser.close()
    finally:
        server.stop()


class FrontendPage:
    """The real frontend booted against the test server, with console and page-error capture."""

    def __init__(self, browser, server: FrontendServer, *, vue: bool):
        self.server = server
        server.reset(**{VUE_SETTING: vue})
        server.records = list(EARLIER_RECORDS)  # an earlier run the page has never seen live
        self.context = browser.new_context(viewport={"width": 1500, "height": 960})
        self.page = self.context.new_page()
        self.page.set_default_timeout(15000)
        self.console: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(f"{e}\n{getattr(e, 'stack', '')}"))
        self.page.goto(server.url)
        self.page.wait_for_selector(TAB_BUTTON, timeout=45000)
        self.page.wait_for_function("() => !!window.app?.graph && window.app.extensionManager?.setting")
        deadline = time.monotonic() + 10
        while not server.connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connected(), "the frontend did not open its websocket"
        assert self.page.evaluate(f"() => window.app.extensionManager.setting.get('{VUE_SETTING}')") is vue

    def fmt(self, seconds):
        return self.page.evaluate(
            f"async (s) => (await import('/extensions/{PACK}/h3_view.js')).fmtSeconds(s)", seconds)

    def panel(self):
        return self.page.locator(".h3-panel")

    def toggle_tab(self):
        self.page.click(TAB_BUTTON)

    def readout_text(self, node_id) -> str | None:
        """The text of the H3 readout widget on a graph node (None if the node has none or it is not in the page)."""
        return self.page.evaluate("""(id) => {
            const n = window.app.graph.getNodeById(id);
            const w = n?.widgets?.find((w) => w.name === 'h3_timing');
            const el = w?.element;
            return el && el.isConnected ? el.textContent : null;
        }""", node_id)

    def assert_clean(self):
        ours = [t for k, t in self.console if "comfy-h3" in t or "/extensions/comfy-h3/" in t]
        errs = [e for e in self.errors if "comfy-h3" in e or "h3_" in e]
        assert not errs, f"page errors from the extension: {errs}"
        assert not ours, f"console messages from the extension: {ours}"

    def close(self):
        self.context.close()


# ---------------------------------------------------------------------------------------------------- test

def test_fixtures_are_usable():
    assert by_request(EARLIER_RECORDS), "runner_events.jsonl has no stage record with a request id"
    assert by_request(LIVE_RECORDS), "comfyui_ws_h3_trace.jsonl has no stage record with a request id"
    assert not set(by_request(EARLIER_RECORDS)) & set(by_request(LIVE_RECORDS)), "the two runs share a request id"
    assert any(e["type"] == "h3.progress" for e in LIVE)
    assert MANIFEST["pack_folder"] == PACK
    info = json.loads((RECORDED / "object_info.json").read_text())
    for node_type in {e["data"]["node_type"] for e in LIVE if e["type"] == "h3.timing"}:
        assert node_type in info, f"{node_type} missing from the recorded object_info"


@pytest.mark.parametrize("vue", [False, True], ids=["litegraph", "vue-nodes"])
def test_sidebar_panel_and_readouts_in_the_real_frontend(frontend, vue):
    browser, server = frontend
    p = FrontendPage(browser, server, vue=vue)
    try:
        p.page.evaluate("(wf) => window.app.loadGraphData(wf)", live_graph())
        p.page.wait_for_function("() => window.app.graph.nodes.length > 0 && "
                                 "window.app.graph.nodes.every((n) => n.type.startsWith('H3'))")
        if vue:  # Vue nodes: real DOM nodes carrying the readout
            p.page.locator('[data-node-id="5"] .h3-readout').wait_for(state="attached")

        # ---- opened like a user: the rows of /h3/timings (an earlier run) are there
        earlier = by_request(EARLIER_RECORDS)
        p.toggle_tab()
        panel = p.panel()
        panel.wait_for()
        for rid, recs in earlier.items():
            row = panel.locator(f'.h3-request[data-request-id="{rid}"]')
            row.wait_for()
            assert row.locator(".h3-bar").count() == len(recs)
        assert panel.locator(".h3-empty").count() == 0
        # first drawn while still detached (no width yet), then redrawn at the sidebar's real width
        p.page.wait_for_function("""() => {
            const panel = document.querySelector('.h3-panel');
            const svg = panel?.querySelector('svg.h3-wf');
            const want = Math.max(320, Math.round(panel.clientWidth - 16));
            return panel.clientWidth > 0 && !!svg && Math.abs(Number(svg.getAttribute('width')) - want) <= 16;
        }""")
        ok_role_b = STATUS_OK["actors"][0]["health"]["B"]["node_ip"]
        panel.locator('.h3-status .h3-role[data-role="B"]').wait_for()
        assert ok_role_b in panel.locator('.h3-status .h3-role[data-role="B"]').inner_text()
        assert panel.locator(".h3-status .h3-warn").count() == 0

        # ---- a run arrives over the websocket: the open panel and the node readout follow it live
        live = by_request(LIVE_RECORDS)
        (live_rid,) = live
        progress = [i for i, e in enumerate(LIVE) if e["type"] == "h3.progress"]
        first = LIVE[progress[0]]["data"]
        server.push(LIVE[: progress[0] + 1])
        row = panel.locator(f'.h3-request[data-request-id="{live_rid}"]')
        row.wait_for()
        p.page.wait_for_function(
            "([id, want]) => (window.app.graph.getNodeById(id)?.widgets?.find((w) => w.name === 'h3_timing')"
            "?.element?.textContent ?? '').includes(want)",
            arg=[int(first["node"]), f"step {first['step']}/{first['total']}"])
        row.locator(".h3-bar.h3-live").wait_for()  # the running denoise (the panel redraw is debounced)
        assert row.locator(".h3-bar.h3-live").count() == 1
        assert row.get_attribute("data-state") != "done"

        server.records = EARLIER_RECORDS + LIVE_RECORDS  # what ComfyUI lists once the run is over
        server.push(LIVE[progress[0] + 1:])
        p.page.wait_for_function(
            f"() => document.querySelector('.h3-request[data-request-id=\"{live_rid}\"]')?.dataset.state === 'done'")
        assert row.locator(".h3-bar").count() == len(live[live_rid])
        final = {str(e["data"]["node"]): e["data"] for e in LIVE if e["type"] == "h3.timing"}
        for nid, t in final.items():
            text = p.readout_text(int(nid))
            assert text is not None, f"node {nid} ({t['node_type']}) has no readout in the page"
            compute = (t.get("summary") or {}).get("compute_s")
            if isinstance(compute, (int, float)):
                assert p.fmt(compute) in text, (t["node_type"], text)
        den = next(t for t in final.values() if t["node_type"] == "H3RemoteDenoise")
        den_text = p.readout_text(int(den["node"]))
        s = den["summary"]
        assert f"step {s['steps_done']}/{s['steps_total']}" in den_text, den_text
        if vue:
            assert p.page.locator(f'[data-node-id="{den["node"]}"] .h3-readout').is_visible()
        n_rows = len(earlier) + len(live)
        assert panel.locator(".h3-request").count() == n_rows

        # ---- closing and reopening the tab: the frontend renders into a new element; the rows are still there
        p.toggle_tab()
        p.page.wait_for_function("() => !document.querySelector('.h3-panel')?.isConnected")
        p.toggle_tab()
        panel = p.panel()
        panel.wait_for()
        p.page.wait_for_function(f"() => document.querySelectorAll('.h3-panel .h3-request').length === {n_rows}")
        for rid in [*earlier, live_rid]:
            assert panel.locator(f'.h3-request[data-request-id="{rid}"] .h3-bar').count() > 0
        assert p.page.locator(".h3-panel").count() == 1
        p.assert_clean()
        assert "h3/timings" in server.hits
    finally:
        p.close()


# ---------------------------------------------------------------------------------------------------- model pickers

STATUS_B_MODELS = ["/models/B/from-status", "tiny-random"]
TIMING_B_MODELS = ["/models/B/MiniMax-H3", "/models/B/vendor/MiniMax-H3-turbo", "tiny-random"]
TYPED_ON_B = "/typed/path/on/B"


def _dit_picker(page, node_id=None):
    """``{id, type, values, value}`` of an H3RemoteDiT node's model_path widget (the first such node by default)."""
    return page.evaluate("""(id) => {
        const nodes = window.app.graph.nodes.filter((n) => n.type === 'H3RemoteDiT');
        const n = id === null ? nodes[0] : nodes.find((x) => String(x.id) === String(id));
        const w = n?.widgets?.find((w) => w.name === 'model_path');
        if (!w) return null;
        const v = w.options?.values;
        return {id: n.id, type: w.type, values: Array.isArray(v) ? [...v] : v ?? null, value: w.value};
    }""", node_id)


@pytest.mark.parametrize("vue", [False, True], ids=["litegraph", "vue-nodes"])
def test_model_picker_offers_what_b_reported(frontend, vue):
    """B's model list, from /h3/status (`models.B`) and from H3RemoteDiT's h3.timing (`summary.b_models`), becomes
    the choices of every H3RemoteDiT node's model_path combo; the node's current value is kept."""
    browser, server = frontend
    p = FrontendPage(browser, server, vue=vue)
    server.status = {**STATUS_OK, "models": {"A": ["tiny-random"], "B": STATUS_B_MODELS}}
    try:
        p.page.evaluate("(wf) => window.app.loadGraphData(wf)", live_graph())
        p.page.wait_for_function("() => window.app.graph.nodes.some((n) => n.type === 'H3RemoteDiT')")
        before = _dit_picker(p.page)
        assert before["type"] == "combo" and "tiny-random" in before["values"], before
        dit_id = before["id"]
        # a typed path on B (API prompts, older workflows) is not among the choices: it must stay as it is
        p.page.evaluate("""([id, v]) => {
            const w = window.app.graph.getNodeById(id).widgets.find((w) => w.name === 'model_path');
            w.value = v;
        }""", [dit_id, TYPED_ON_B])

        # ---- /h3/status, fetched when the H3 tab opens
        p.toggle_tab()
        p.panel().wait_for()
        p.page.wait_for_function("""([id, want]) => {
            const w = window.app.graph.getNodeById(id)?.widgets?.find((w) => w.name === 'model_path');
            return JSON.stringify(w?.options?.values) === JSON.stringify(want);
        }""", arg=[dit_id, STATUS_B_MODELS])
        assert _dit_picker(p.page, dit_id)["value"] == TYPED_ON_B

        # ---- an h3.timing of H3RemoteDiT (what the node sends after connecting) carries B's list
        event = {"type": "h3.timing", "data": {
            "prompt_id": "p-models", "node": str(dit_id), "node_type": "H3RemoteDiT", "request_id": None,
            "stages": [], "summary": {"compute_s": 0.25, "machine": "B", "b_models": TIMING_B_MODELS}}}
        # the same list from another node type means nothing to the picker
        other = {"type": "h3.timing", "data": {**event["data"], "node": "5", "node_type": "H3RemoteDenoise",
                                               "summary": {"compute_s": 1.0, "b_models": ["/not/a/picker/list"]}}}
        server.push([other, event])
        p.page.wait_for_function("""([id, want]) => {
            const w = window.app.graph.getNodeById(id)?.widgets?.find((w) => w.name === 'model_path');
            return JSON.stringify(w?.options?.values) === JSON.stringify(want);
        }""", arg=[dit_id, TIMING_B_MODELS])
        picker = _dit_picker(p.page, dit_id)
        assert picker["values"] == TIMING_B_MODELS and picker["value"] == TYPED_ON_B, picker

        # ---- a H3RemoteDiT added afterwards offers the same list
        new_id = p.page.evaluate("""() => {
            const n = window.LiteGraph.createNode('H3RemoteDiT');
            n.pos = [80, 520];
            window.app.graph.add(n);
            return n.id;
        }""")
        p.page.wait_for_function("""([id, want]) => {
            const w = window.app.graph.getNodeById(id)?.widgets?.find((w) => w.name === 'model_path');
            return JSON.stringify(w?.options?.values) === JSON.stringify(want);
        }""", arg=[new_id, TIMING_B_MODELS])

        if vue:  # what the user sees: the Vue node's select lists B's models when opened
            widgets = p.page.locator(f'[data-node-id="{dit_id}"] [data-testid="node-widget"]')
            field = widgets.filter(has_text="model_path")
            trigger = field.locator('[role="combobox"]')
            assert trigger.inner_text().strip() == TYPED_ON_B
            trigger.click()
            p.page.locator('[role="option"]').first.wait_for()
            shown = [t.strip() for t in p.page.locator('[role="option"]').all_inner_texts()]
            assert shown == TIMING_B_MODELS, shown
            p.page.keyboard.press("Escape")
        p.assert_clean()
    finally:
        server.status = STATUS_OK
        p.close()
