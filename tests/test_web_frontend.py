"""The web extension inside ComfyUI's REAL frontend (PyPI ``comfyui-frontend-package``), without ComfyUI, with every
frontend version of ``browser_support.FRONTEND_VERSIONS`` (1.49.6, the one ComfyUI 0.33 pins, and 1.58.1).

Our own harness page (tests/test_web_browser.py) attaches the sidebar tab's element before calling ``render(el)``;
the real frontend (1.49) calls ``render(el)`` first and attaches ``el`` afterwards, calls it again on re-renders and
with a new element when the tab is reopened. This test runs the pack's web/ files in the real frontend's lifecycle:

- an aiohttp server on 127.0.0.1 serves the installed frontend's static files, the pack's web/ at
  ``/extensions/comfy-h3/`` (listed by ``/api/extensions``, as ComfyUI does), and answers the frontend's API requests
  from responses recorded from a real ComfyUI 0.33 running this pack with that frontend
  (tests/web/fixtures/comfyui_frontend/<version>/, written by tests/web/record_frontend_fixtures.py); settings are
  kept in memory and POSTs update them, like ComfyUI;
- ``/api/h3/timings`` lists the stage records of an earlier run (tests/web/fixtures/runner_events.jsonl) and
  ``/api/h3/status`` a healthy cluster (status_ok.json); the websocket ``/ws`` greets like ComfyUI and lets the test
  push a recorded ComfyUI run of the pack (tests/web/fixtures/comfyui_ws_h3_trace.jsonl);
- headless Chromium opens the H3 tab by clicking its button, checks the request rows from /h3/timings, pushes the run
  and checks that the panel and the H3RemoteDenoise node readout follow it live, then closes and reopens the tab;
  once with the classic LiteGraph canvas and once with Vue nodes (setting ``Comfy.VueNodes.Enabled``);
- B's model list (``models.B`` of /h3/status, ``summary.b_models`` of H3RemoteDiT's h3.timing) becomes the choices
  of every H3RemoteDiT node's ``model_path`` combo, the node's value kept; in Vue-node mode the opened select shows it;
- every example workflow opened as a file on a laptop's first screen (``browser_support.FIRST_SCREEN``): zoom at
  least 0.6 (LiteGraph draws empty boxes below), no node under the frontend's bars, menus or minimap, no two nodes
  overlapping, and still none once every node's readout holds a run's figures (each readout's text complete).

Needs Debian's ``chromium``, PyPI's ``playwright`` and the frontend packages: the ``[test]`` extra installs 1.49.6,
any other version is installed into ``H3_FRONTEND_CACHE`` (``pip install --target``) on first use. Missing any fails
with instructions, unless ``H3_SKIP_BROWSER=1``. ``H3_SCREENSHOTS=<folder>`` keeps a screenshot of each check.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import pathlib
import time
import uuid

import pytest

from browser_support import (
    FIRST_SCREEN, FRONTEND_VERSIONS, JS_CLOSE_ERRORS, JS_NODE_BOXES, JS_WAIT_QUIET,
    ThreadedServer, frontend_static, launched_chromium, no_browser, opened_problems, overlaps, stable_free_mask,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
FIXTURES = ROOT / "tests" / "web" / "fixtures"
RECORDED = FIXTURES / "comfyui_frontend"
EXAMPLES = ROOT / "example_workflows"
TEMPLATES = sorted(p.stem for p in EXAMPLES.glob("*.json"))
LIVE_TEMPLATE = "h3_t2va_turbo"  # the template comfyui_ws_h3_trace.jsonl is a run of
PACK = "comfy-h3"
# the sidebar tab's button: 1.49 gives it the class `${id}-tab-button`, 1.58 the test id and the tooltip as its label
TAB_BUTTON = ('.comfy-h3-timeline-tab-button, [data-testid="comfy-h3-timeline-tab-button"], '
              '.side-bar-button[aria-label^="H3 timings"]')
VUE_SETTING = "Comfy.VueNodes.Enabled"
#: the bound of the page's load and of a loaded graph's nodes: on CI's two saturated cores (beside the CPU and
#: real-ComfyUI suites) a graph once took over the page's default 15 s to appear
LOAD_MS = 45000
SHOTS = pathlib.Path(os.environ["H3_SCREENSHOTS"]) if os.environ.get("H3_SCREENSHOTS") else None
INSTALL_HINT = ("install them with: apt-get update && apt-get install -y chromium && .venv/bin/pip install playwright "
                "(or `pip install -e '.[test]'`; no `playwright install`: the test drives /usr/bin/chromium; frontend "
                "versions besides the installed one are pip-installed into H3_FRONTEND_CACHE on first use); or set "
                "H3_SKIP_BROWSER=1 to skip the browser tests")


def manifest(version: str) -> dict:
    return json.loads((RECORDED / version / "manifest.json").read_text())


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


def template(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def final_timings() -> dict[str, dict]:
    """The last h3.timing payload of each node type in the live run, plus the node types that run has not (their
    records as the nodes write them), to fill every node's readout of any template."""
    out = {e["data"]["node_type"]: e["data"] for e in LIVE if e["type"] == "h3.timing"}
    def local(node_type, stage, note="", **summary):
        rec = {"request_id": "", "stage": stage, "machine": "A", "node": "spark-a", "start": 1.0, "end": 1.002,
               "compute_s": 0.002, "note": note}
        return {"prompt_id": "p-fill", "node": None, "node_type": node_type, "request_id": None, "stages": [rec],
                "summary": {"compute_s": 0.002, "machine": "A", "a_to_b": None, "b_to_a": None, **summary}}
    out.setdefault("H3Keyframes", local("H3Keyframes", "keyframes"))
    out.setdefault("H3References", local("H3References", "references"))
    out.setdefault("H3PromptList", local("H3PromptList", "prompts", "4 prompts, seeds increment: 42, 43, 44, 45",
                                         prompts=4, seeds=[42, 43, 44, 45]))
    return out


# ---------------------------------------------------------------------------------------------------- server

class FrontendServer(ThreadedServer):
    """The real frontend's files plus ComfyUI's recorded answers, on 127.0.0.1 (random port), in a thread."""

    def __init__(self, static: pathlib.Path, recorded: pathlib.Path):
        self.static = static
        self.responses: dict = json.loads((recorded / "responses.json").read_text())
        self.object_info: dict = json.loads((recorded / "object_info.json").read_text())
        self.ws_connect = load_events(recorded / "ws_connect.jsonl")
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

        async def view(request):
            # an example workflow's input files (LoadImage / LoadAudio previews), as ComfyUI serves its input folder
            name = pathlib.Path(request.query.get("filename", "")).name
            path = EXAMPLES / "inputs" / name
            if not name or not path.is_file():
                raise web.HTTPNotFound()
            return web.FileResponse(path)

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
        app.router.add_get("/api/view", view)
        for prefix in ("/api", "/internal", "/templates"):
            app.router.add_get(prefix + "/{tail:.*}", recorded)
            app.router.add_post(prefix + "/{tail:.*}", other_post)
        app.router.add_static("/", self.static)
        return app

    async def _closing(self) -> None:
        for ws in list(self.sockets):
            await ws.close()


# ---------------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def chromium():
    yield from launched_chromium("the real-frontend test", INSTALL_HINT)


@pytest.fixture(scope="module", params=FRONTEND_VERSIONS)
def frontend(request, chromium):
    """``(browser, server, version)``: the test server with one frontend version's files and recorded answers."""
    version = request.param
    static = frontend_static(version)
    if isinstance(static, str):
        no_browser("the real-frontend test", static, INSTALL_HINT)
    assert (RECORDED / version / "responses.json").is_file(), (
        f"no answers recorded for frontend {version}: run tests/web/record_frontend_fixtures.py against a ComfyUI "
        f"started with --front-end-root <that version's static folder>")
    server = FrontendServer(static, RECORDED / version).start()
    try:
        yield chromium, server, version
    finally:
        server.stop()


class FrontendPage:
    """The real frontend booted against the test server, with console and page-error capture."""

    def __init__(self, browser, server: FrontendServer, *, vue: bool, version: str, viewport=(1500, 960)):
        self.server = server
        self.version = version
        server.reset(**{VUE_SETTING: vue})
        server.records = list(EARLIER_RECORDS)  # an earlier run the page has never seen live
        self.context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        self.page = self.context.new_page()
        self.page.set_default_timeout(15000)
        self.console: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(f"{e}\n{getattr(e, 'stack', '')}"))
        self.page.goto(server.url)
        self.page.wait_for_selector(TAB_BUTTON, timeout=LOAD_MS)
        self.page.wait_for_function("() => !!window.app?.graph && window.app.extensionManager?.setting")
        deadline = time.monotonic() + 10
        while not server.connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connected(), "the frontend did not open its websocket"
        assert self.page.evaluate(f"() => window.app.extensionManager.setting.get('{VUE_SETTING}')") is vue
        assert self.page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__") == version

    def open_workflow(self, name: str, wf: dict | None = None):
        """Opens an example workflow the way a dropped or opened file is: its saved view applied, named after it."""
        self.page.evaluate("([wf, name]) => window.app.loadGraphData(wf, true, true, name)",
                           [wf or template(name), f"{name}.json"])
        n = len((wf or template(name))["nodes"])
        self.page.wait_for_function("(n) => window.app.graph.nodes.length === n", arg=n, timeout=LOAD_MS)
        if self.page.evaluate("() => window.app.extensionManager.setting.get('Comfy.VueNodes.Enabled')"):
            self.page.wait_for_function("(n) => document.querySelectorAll('[data-node-id]').length >= n", arg=n,
                                        timeout=LOAD_MS)
        self.settle()

    def settle(self, ms: int = 400):
        """Two animation frames and a pause: the canvas and the Vue nodes have drawn what changed."""
        self.page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
        self.page.wait_for_timeout(ms)

    def boxes(self) -> list[dict]:
        return self.page.evaluate(JS_NODE_BOXES)

    def free_mask(self) -> list[str]:
        """Where the canvas shows through, on an empty graph (what the frontend draws over it is marked)."""
        self.page.evaluate("() => { window.app.graph.clear(); window.app.canvas.setDirty(true, true); }")
        self.settle(600)
        return stable_free_mask(self.page)

    def readouts(self) -> list[dict]:
        """Every H3 readout: its node, text, and whether its text fits the room the node gives it."""
        return self.page.evaluate("""() => window.app.graph.nodes.flatMap((n) => {
            const el = n.widgets?.find((w) => w.name === 'h3_timing')?.element;
            if (!el) return [];
            return [{id: String(n.id), type: n.type, text: el.innerText, connected: el.isConnected,
                     client: el.clientHeight, scroll: el.scrollHeight, cw: el.clientWidth, sw: el.scrollWidth}];
        })""")

    def shot(self, name: str):
        if SHOTS is not None:
            SHOTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(SHOTS / f"frontend_{self.version}_{name}.png"))

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

@pytest.mark.parametrize("version", FRONTEND_VERSIONS)
def test_fixtures_are_usable(version):
    assert by_request(EARLIER_RECORDS), "runner_events.jsonl has no stage record with a request id"
    assert by_request(LIVE_RECORDS), "comfyui_ws_h3_trace.jsonl has no stage record with a request id"
    assert not set(by_request(EARLIER_RECORDS)) & set(by_request(LIVE_RECORDS)), "the two runs share a request id"
    assert any(e["type"] == "h3.progress" for e in LIVE)
    m = manifest(version)
    assert m["pack_folder"] == PACK and m["frontend_version"] == version, m
    info = json.loads((RECORDED / version / "object_info.json").read_text())
    from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS
    from comfy_h3_nodes.tools.runner import UI_ONLY_TYPES  # the frontend's own nodes (notes): not in object_info

    wanted = set(NODE_CLASS_MAPPINGS) | {n["type"] for name in TEMPLATES for n in template(name)["nodes"]}
    wanted -= UI_ONLY_TYPES
    assert not wanted - set(info), f"missing from the recorded object_info of {version}: {sorted(wanted - set(info))}"
    live_types = {e["data"]["node_type"]: e["data"]["node"] for e in LIVE if e["type"] == "h3.timing"}
    nodes = {n["type"]: str(n["id"]) for n in template(LIVE_TEMPLATE)["nodes"]}
    for t, nid in live_types.items():
        assert nodes.get(t) == str(nid), f"the live trace's {t} is node {nid}, {LIVE_TEMPLATE}.json has {nodes.get(t)}"


def _breakdown_adds_up(page, rid: str) -> tuple[float, float]:
    """(total, sum of the parts) of a request row's header: the parts must add up to the total."""
    return tuple(page.evaluate("""(rid) => {
        const row = document.querySelector(`.h3-request[data-request-id="${rid}"] .h3-req-sum`);
        if (!row) return [null, null];
        const parts = Object.entries(row.dataset).filter(([k]) => k.startsWith('part_')).map(([, v]) => Number(v));
        return [Number(row.dataset.totalS), parts.reduce((a, b) => a + b, 0)];
    }""", rid))


def _labels_inside(page) -> list[str]:
    """Axis, bar and gap labels of every waterfall that reach past its SVG's edges."""
    return page.evaluate("""() => [...document.querySelectorAll('.h3-panel svg.h3-wf:not(.h3-swatch)')].flatMap((svg) => {
        const w = Number(svg.getAttribute('width'));
        return [...svg.querySelectorAll('text')].flatMap((t) => {
            const b = t.getBBox();
            return b.x < -0.5 || b.x + b.width > w + 0.5 ? [`${t.textContent} [${b.x.toFixed(1)}, ${(b.x + b.width).toFixed(1)}] of ${w}`] : [];
        });
    })""")


@pytest.mark.parametrize("vue", [False, True], ids=["litegraph", "vue-nodes"])
def test_sidebar_panel_and_readouts_in_the_real_frontend(frontend, vue):
    browser, server, version = frontend
    p = FrontendPage(browser, server, vue=vue, version=version)
    try:
        p.open_workflow(LIVE_TEMPLATE)  # the template the live trace ran, as its file
        den_id = next(str(n["id"]) for n in template(LIVE_TEMPLATE)["nodes"] if n["type"] == "H3RemoteDenoise")
        if vue:  # Vue nodes: real DOM nodes carrying the readout
            p.page.locator(f'[data-node-id="{den_id}"] .h3-readout').wait_for(state="attached")

        # ---- opened like a user: the rows of /h3/timings (an earlier run) are there, with the legend
        earlier = by_request(EARLIER_RECORDS)
        p.toggle_tab()
        panel = p.panel()
        panel.wait_for()
        for rid, recs in earlier.items():
            row = panel.locator(f'.h3-request[data-request-id="{rid}"]')
            row.wait_for()
            assert row.locator(".h3-bar").count() == len(recs)
        assert panel.locator(".h3-empty").count() == 0
        legend = panel.locator(".h3-legend .h3-key")
        assert legend.count() >= 10
        legend_text = panel.locator(".h3-legend").inner_text()
        for words in ("encode", "denoise", "decode", "transfer", "fetch", "materialise", "idle", "running", "slow"):
            assert words in legend_text, legend_text
        # first drawn while still detached (no width yet), then redrawn at the sidebar's real width
        p.page.wait_for_function("""() => {
            const list = document.querySelector('.h3-panel .h3-requests');
            const svg = list?.querySelector('svg.h3-wf');
            const want = Math.max(280, Math.round(list.clientWidth));
            return list.clientWidth > 0 && !!svg && Math.abs(Number(svg.getAttribute('width')) - want) <= 24;
        }""")
        ok_role_b = STATUS_OK["actors"][0]["health"]["B"]["node_ip"]
        panel.locator('.h3-status .h3-role[data-role="B"]').wait_for()
        assert ok_role_b in panel.locator('.h3-status .h3-role[data-role="B"]').inner_text()
        assert panel.locator(".h3-status .h3-warn").count() == 0

        # ---- a run arrives over the websocket: the open panel and the node readout follow it live
        live = by_request(LIVE_RECORDS)
        live_rid = max(live, key=lambda r: len(live[r]))
        progress = [i for i, e in enumerate(LIVE) if e["type"] == "h3.progress"]
        first = LIVE[progress[0]]["data"]
        server.push(LIVE[: progress[0] + 1])
        row = panel.locator(f'.h3-request[data-request-id="{live_rid}"]')
        row.wait_for()
        # the count once, in the node's words: h3.progress counts forwards, the `steps` input sigma points (one more)
        words = f"forward {first['step']} of {first['total']} ({first['total'] + 1} sigma points)"
        p.page.wait_for_function(
            "([id, want]) => (window.app.graph.getNodeById(id)?.widgets?.find((w) => w.name === 'h3_timing')"
            "?.element?.textContent ?? '').includes(want)", arg=[int(den_id), words])
        row.locator(".h3-bar.h3-live").wait_for()  # the running denoise (the panel redraw is debounced)
        assert row.locator(".h3-bar.h3-live").count() == 1
        assert row.get_attribute("data-state") != "done"

        server.records = EARLIER_RECORDS + LIVE_RECORDS  # what ComfyUI lists once the run is over
        server.push(LIVE[progress[0] + 1:])
        p.page.wait_for_function(
            f"() => document.querySelector('.h3-request[data-request-id=\"{live_rid}\"]')?.dataset.state === 'done'")
        assert row.locator(".h3-bar").count() == len(live[live_rid])
        p.settle()
        final = {str(e["data"]["node"]): e["data"] for e in LIVE if e["type"] == "h3.timing"}
        readouts = {r["id"]: r for r in p.readouts()}
        for nid, t in final.items():
            r = readouts.get(nid)
            assert r is not None and r["connected"], f"node {nid} ({t['node_type']}) has no readout in the page"
            compute = (t.get("summary") or {}).get("compute_s")
            if isinstance(compute, (int, float)):
                assert p.fmt(compute) in r["text"], (t["node_type"], r["text"])
            # wrapped and complete: nothing hidden below or beside the readout's room
            assert r["scroll"] <= r["client"] + 1 and r["sw"] <= r["cw"] + 1, (t["node_type"], r)
        den = final[den_id]
        den_text = readouts[den_id]["text"]
        s = den["summary"]
        assert s["schedule"] in den_text.replace("\n", " "), den_text
        assert "step " not in den_text, den_text
        preview = s.get("preview") or {}
        if preview.get("count"):
            assert f"previews: {preview['count']} × " in den_text, den_text
        else:
            assert preview.get("note", "") in den_text.replace("\n", " "), den_text
        dit = next(t for t in final.values() if t["node_type"] == "H3RemoteDiT")
        for part in dit["summary"]["status"].split(" · "):
            assert part in readouts[str(dit["node"])]["text"].replace("\n", " "), readouts[str(dit["node"])]["text"]
        lora = next((t for t in final.values() if t["node_type"] == "H3LoRA"), None)
        if lora:
            assert readouts[str(lora["node"])]["text"].startswith("B lora"), readouts[str(lora["node"])]
            assert lora["summary"]["resolved"] in readouts[str(lora["node"])]["text"].replace("\n", "")
        boxes = p.boxes()
        assert not overlaps(boxes), overlaps(boxes)  # the readouts were reserved: nothing grew over its neighbour
        if vue:
            assert p.page.locator(f'[data-node-id="{den_id}"] .h3-readout').is_visible()
        n_rows = len(earlier) + len(live)
        assert panel.locator(".h3-request").count() == n_rows

        # ---- every row reads without pointing: named, its parts adding up to its total, labels inside the chart
        head = row.locator(".h3-req-head").inner_text()
        assert f"{LIVE_TEMPLATE}.json" in head or "t2va" in head, head
        for rid in [*earlier, *live]:
            total, parts = _breakdown_adds_up(p.page, rid)
            assert total is not None and abs(total - parts) <= 1e-6 * max(1.0, total), (rid, total, parts)
        assert not _labels_inside(p.page), _labels_inside(p.page)
        # the live run is a ComfyUI's first: its connect started Ray and B, drawn and named inside the row
        connect = next(r for e in LIVE if e["type"] == "h3.timing" and e["data"]["node_type"] == "H3RemoteDiT"
                       for r in e["data"]["stages"] if r["stage"] == "connect")
        if connect["end"] - connect["start"] > 2:
            ctx = row.locator('.h3-ctx[data-stage="connect"]')
            assert ctx.count() == 1 and "start" in (ctx.text_content() or ""), row.inner_html()[:400]

        # ---- pointing at the denoise bar shows its figures without moving anything (it once stalled the page)
        bar = row.locator('.h3-bar[data-stage="denoise"] .h3-bar-rect')
        assert p.page.evaluate(JS_WAIT_QUIET, [".h3-panel .h3-requests", 600, 10000]), "the panel keeps redrawing"
        row.scroll_into_view_if_needed()
        before = row.bounding_box()
        p.page.evaluate("""() => { window.__h3mut = 0; new MutationObserver((m) => { window.__h3mut += m.length; })
            .observe(document.querySelector('.h3-panel .h3-requests'), {subtree: true, childList: true, attributes: true}); }""")
        box = bar.bounding_box()
        for k in range(12):  # the pointer wanders over the bar and back
            p.page.mouse.move(box["x"] + box["width"] * (k % 4 + 0.5) / 4, box["y"] + box["height"] / 2)
        p.page.wait_for_timeout(300)
        t0 = time.monotonic()
        assert p.page.evaluate("() => 1") == 1
        assert time.monotonic() - t0 < 1.0, "the page stalls while a denoise bar is pointed at"
        details = panel.locator(".h3-details").inner_text()
        assert "forwards" in details and "denoise on B" in details, details
        assert row.bounding_box() == before, "pointing at a bar moved the rows"
        assert p.page.evaluate("() => window.__h3mut") == 0, "pointing at a bar redrew the rows"
        p.shot(f"panel_{'vue' if vue else 'litegraph'}")

        # ---- closing and reopening the tab: the frontend renders into a new element; the rows are still there
        p.toggle_tab()
        p.page.wait_for_function("() => !document.querySelector('.h3-panel')?.isConnected")
        p.toggle_tab()
        panel = p.panel()
        panel.wait_for()
        p.page.wait_for_function(f"() => document.querySelectorAll('.h3-panel .h3-request').length === {n_rows}")
        for rid in [*earlier, *live]:
            assert panel.locator(f'.h3-request[data-request-id="{rid}"] .h3-bar').count() > 0
        assert p.page.locator(".h3-panel").count() == 1
        p.assert_clean()
        assert "h3/timings" in server.hits
    finally:
        p.close()


@pytest.mark.parametrize("vue", [False, True], ids=["litegraph", "vue-nodes"])
def test_templates_open_on_the_first_screen_and_keep_their_room(frontend, vue):
    """Every example workflow opened as a file on a laptop's first screen: the saved view's zoom draws titles and
    widgets (>= 0.6), no node lies under the frontend's bars, menus or minimap, none overlaps another; with every
    readout filled by a run's figures the text is complete and still no node overlaps another."""
    browser, server, version = frontend
    recorded = server.object_info
    server.object_info = with_core_files(recorded)
    p = FrontendPage(browser, server, vue=vue, version=version, viewport=FIRST_SCREEN)
    fills = final_timings()
    try:
        mask = p.free_mask()
        problems = []
        for name in TEMPLATES:
            p.page.evaluate(JS_CLOSE_ERRORS)  # the default graph's check, if it answered late: not this template's
            p.open_workflow(name)
            problems += opened_problems(name, p.page, mask)
            p.shot(f"{name}_{'vue' if vue else 'litegraph'}_open")
            # every node's readout filled with a run's figures
            events = []
            for n in template(name)["nodes"]:
                payload = fills.get(n["type"])
                if payload:
                    events.append({"type": "h3.timing", "data": {**payload, "node": str(n["id"])}})
            server.push(events)
            p.settle(600)
            for r in p.readouts():
                if not r["connected"] or "–" in r["text"].split("\n")[0]:
                    problems.append(f"{name}: node {r['id']} ({r['type']}) shows no figures: {r['text']!r}")
                elif r["scroll"] > r["client"] + 1 or r["sw"] > r["cw"] + 1:
                    problems.append(f"{name}: node {r['id']} ({r['type']}) readout cut: {r}")
            boxes = p.boxes()
            problems += [f"{name} after a run: {x}" for x in overlaps(boxes)]
            p.shot(f"{name}_{'vue' if vue else 'litegraph'}_filled")
        assert not problems, "\n".join(problems)
        p.assert_clean()
    finally:
        p.close()
        server.object_info = recorded


def with_core_files(object_info: dict) -> dict:
    """``object_info`` as ComfyUI answers it where the h3_core_* templates' files are in place: A's text encoder and
    VAEs in its folders, B's transformer in B's list (what the templates' note asks a user to choose first). The
    frontend flags a loader whose file is not in its list as an error, which is right on a machine without them."""
    info = copy.deepcopy(object_info)
    for name in TEMPLATES:
        for n in template(name)["nodes"]:
            slot = {"CLIPLoader": "clip_name", "VAELoader": "vae_name", "H3RemoteModel": "unet_name"}.get(n["type"])
            if slot:
                choices = info[n["type"]]["input"]["required"][slot][0]
                if n["widgets_values"][0] not in choices:
                    choices.append(n["widgets_values"][0])
    return info


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
    browser, server, version = frontend
    p = FrontendPage(browser, server, vue=vue, version=version)
    server.status = {**STATUS_OK, "models": {"A": ["tiny-random"], "B": STATUS_B_MODELS}}
    try:
        p.open_workflow(LIVE_TEMPLATE)
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
            n.pos = [1600, 1100]; // clear of the template's nodes
            window.app.graph.add(n);
            return n.id;
        }""")
        p.page.wait_for_function("""([id, want]) => {
            const w = window.app.graph.getNodeById(id)?.widgets?.find((w) => w.name === 'model_path');
            return JSON.stringify(w?.options?.values) === JSON.stringify(want);
        }""", arg=[new_id, TIMING_B_MODELS])

        if vue:  # what the user sees: the Vue node's select lists B's models when opened
            p.toggle_tab()  # the open sidebar panel covers the left of the graph
            p.page.wait_for_function("() => !document.querySelector('.h3-panel')?.isConnected")
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


def test_status_names_an_a_inside_comfyui(frontend):
    """A's encoders inside ComfyUI's own process have no actor and no health entry: /h3/status says so
    (``a_process``) and the panel names A that way instead of an amber "?" with a raw JSON tooltip."""
    browser, server, version = frontend
    status = json.loads(json.dumps(STATUS_OK))
    for a in status["actors"]:
        a["health"].pop("A", None)
    status["a_process"] = {"in_process": True, "hostname": "spark-a", "pid": 4242}
    server.status = status
    p = FrontendPage(browser, server, vue=False, version=version)
    try:
        p.toggle_tab()
        role = p.panel().locator('.h3-status .h3-role[data-role="A"]')
        role.wait_for()
        text = role.inner_text()
        assert "in ComfyUI's process on spark-a" in text and "ok" in text, text
        assert role.get_attribute("data-state") == "ok"
        title = role.get_attribute("title")
        assert "{" not in title and "null" not in title, title
        p.assert_clean()
    finally:
        server.status = STATUS_OK
        p.close()
