"""The web extension in a real headless Chromium, against a stand-in of ComfyUI's frontend.

An aiohttp server on 127.0.0.1 serves the REAL modules of web/ at /extensions/comfy-h3/ (listed by /api/extensions,
loaded like ComfyUI loads a pack), a small fake ``/scripts/app.js`` and ``/scripts/api.js`` (tests/web/harness/), and
canned ``/api/h3/status`` and ``/api/h3/timings``. The test replays tests/web/fixtures/runner_events.jsonl (one
websocket message a line, ``{"type", "data"}``) and checks the readouts on the nodes, the waterfall bars, the status
warnings, the exports and that nothing reaches the console as an error. Expected values are derived from the fixture,
so a recorded event stream can replace it.

Needs Debian's ``chromium`` and PyPI's ``playwright`` (no ``playwright install``). Missing either fails the test with
instructions, unless ``H3_SKIP_BROWSER=1`` (then it is skipped).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import pathlib
import re
import shutil

import pytest

from browser_support import ThreadedServer, launched_chromium

ROOT = pathlib.Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
HARNESS = ROOT / "tests" / "web" / "harness"
FIXTURES = ROOT / "tests" / "web" / "fixtures"
EVENTS_FILE = FIXTURES / "runner_events.jsonl"
SHARED_TRACE = ROOT.parent / "shared" / "samples" / "comfyui_ws_trace.jsonl"
PACK = "comfy-h3"
SETTING = "comfy-h3.TransferWarnPercent"
INSTALL_HINT = ("install them with: apt-get update && apt-get install -y chromium && "
                ".venv/bin/pip install playwright  (no `playwright install`: the test drives /usr/bin/chromium); "
                "or set H3_SKIP_BROWSER=1 to skip the browser test")
CSV_FIELDS = ("request_id", "stage", "machine", "node", "start", "end", "producer_wait_s", "fetch_s", "materialize_s",
              "validate_s", "serialize_s", "compute_s", "bytes", "steps", "load_s", "note")


# ---------------------------------------------------------------------------------------------------- fixture data

def load_events(path: pathlib.Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            msg = json.loads(line)
            if isinstance(msg, dict) and isinstance(msg.get("type"), str):
                out.append(msg)
    return out


EVENTS = load_events(EVENTS_FILE)
TIMINGS = [e["data"] for e in EVENTS if e["type"] == "h3.timing"]
PROGRESS = [e["data"] for e in EVENTS if e["type"] == "h3.progress"]
FINAL_TIMING = {str(t["node"]): t for t in TIMINGS}  # the last payload per node


def stage_records() -> list[dict]:
    """Every StageRecord the run reported (what GET /h3/timings would list)."""
    seen, out = set(), []
    for t in TIMINGS:
        for r in t.get("stages") or []:
            key = (r.get("request_id"), r["stage"], r.get("machine"), r.get("start"), r.get("end"))
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out


def records_by_request() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in stage_records():
        if r.get("request_id"):
            out.setdefault(r["request_id"], []).append(r)
    return out


def timings_csv(records: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_FIELDS)
    for r in records:
        d = dict(r)
        d["bytes"] = ";".join(f"{k}={v}" for k, v in (r.get("bytes") or {}).items())
        d["steps"] = ";".join(f"{s:.6f}" for s in r.get("steps") or [])
        w.writerow([d.get(k, "") for k in CSV_FIELDS])
    return buf.getvalue()


def graph_nodes() -> list[tuple[str, str]]:
    """(id, class) of every node the run mentions: H3 nodes by their node_type, others as a plain core node."""
    types: dict[str, str] = {}
    for e in EVENTS:
        d = e["data"] if isinstance(e.get("data"), dict) else {}
        if e["type"] == "executing" and d.get("node") is not None:
            types.setdefault(str(d.get("display_node") or d["node"]), "PreviewAny")
        if e["type"] in ("h3.timing", "h3.progress") and d.get("node") is not None:
            types[str(d["node"])] = d.get("node_type") or types.get(str(d["node"])) or "H3RemoteDenoise"
    return sorted(types.items(), key=lambda kv: (len(kv[0]), kv[0]))


def parse_seconds(text: str) -> tuple[float, float] | None:
    """The first duration in a readout text as (seconds, tolerance of its rounding)."""
    m = re.search(r"(\d+) h (\d+) m", text)
    if m:
        return int(m[1]) * 3600 + int(m[2]) * 60, 30.0
    m = re.search(r"(\d+) m (\d+) s", text)
    if m:
        return int(m[1]) * 60 + int(m[2]), 0.5
    m = re.search(r"(-?\d+(?:\.(\d+))?) (ms|s)\b", text)
    if not m:
        return None
    value = float(m[1])
    decimals = len(m[2] or "")
    tol = 0.5 * 10 ** -decimals
    return (value / 1000, tol / 1000 + 1e-12) if m[3] == "ms" else (value, tol + 1e-12)


def lane_gaps(records: list[dict]) -> dict[str, int]:
    """How many idle stretches each lane should show (same rule as the chart: >= 0.2 % of the request, >= 0.5 ms)."""
    t0 = min(r["start"] for r in records)
    t1 = max(r["end"] for r in records)
    min_gap = max(0.0005, 0.002 * (t1 - t0))
    out = {}
    for lane in ("A", "B"):
        busy = sorted((r["start"], r["end"]) for r in records if r.get("machine", "A") == lane)
        merged: list[list[float]] = []
        for a, b in busy:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        holes, cursor = [], t0
        for a, b in merged:
            if a > cursor:
                holes.append(a - cursor)
            cursor = max(cursor, b)
        if t1 > cursor:
            holes.append(t1 - cursor)
        out[lane] = sum(1 for h in holes if h >= min_gap)
    return out


# ---------------------------------------------------------------------------------------------------- server

class HarnessServer(ThreadedServer):
    """aiohttp on 127.0.0.1 (random port) in a thread; ``mode`` picks the canned /h3/status answer."""

    def __init__(self):
        self.mode = "ok"
        self.status = {"ok": json.loads((FIXTURES / "status_ok.json").read_text()),
                       "unreachable": json.loads((FIXTURES / "status_unreachable.json").read_text())}
        self.records: list[dict] = []  # what /h3/timings lists; tests fill it as the run "happens"
        self.hits: list[str] = []
        self.release_bodies: list = []
        super().__init__()

    def _app(self):
        from aiohttp import web

        def static(path: pathlib.Path, ctype: str):
            if not path.is_file():
                raise web.HTTPNotFound()
            return web.Response(body=path.read_bytes(), content_type=ctype, headers={"Cache-Control": "no-store"})

        async def index(request):
            return static(HARNESS / "index.html", "text/html")

        async def scripts(request):
            return static(HARNESS / "scripts" / request.match_info["name"], "application/javascript")

        async def extensions(request):
            return web.json_response(sorted(f"/extensions/{PACK}/{p.name}" for p in WEB.glob("*.js")))

        async def ext_file(request):
            return static(WEB / request.match_info["name"], "application/javascript")

        async def status(request):
            self.hits.append("status")
            if self.mode == "down":
                return web.Response(status=502, text="bad gateway")
            return web.json_response(self.status[self.mode])

        async def timings(request):
            self.hits.append("timings")
            rid = request.query.get("request_id")
            recs = [r for r in self.records if rid is None or r.get("request_id") == rid]
            if request.query.get("format") == "csv":
                return web.Response(text=timings_csv(recs), content_type="text/csv")
            return web.json_response({"records": recs})

        async def release_b(request):  # the panel's "Release B's model": what ComfyUI's route answers
            self.hits.append("release_b")
            self.release_bodies.append(await request.json())
            return web.json_response({"released": [{"name": "h3_dit", "partitions": ["transformer"],
                                                    "bytes": {"transformer": 12 * 2**20}, "total_bytes": 12 * 2**20}],
                                      "missing": {}})

        async def favicon(request):
            return web.Response(status=204)

        async def history(request):  # ComfyUI's prompt history: none in this harness
            self.hits.append("history")
            return web.json_response({})

        app = web.Application()
        app.router.add_get("/", index)
        app.router.add_get("/favicon.ico", favicon)
        app.router.add_get("/scripts/{name}", scripts)
        app.router.add_get("/api/extensions", extensions)
        app.router.add_get(f"/extensions/{PACK}/{{name}}", ext_file)
        app.router.add_get("/api/h3/status", status)
        app.router.add_get("/api/h3/timings", timings)
        app.router.add_get("/api/history", history)
        app.router.add_post("/api/h3/release_b", release_b)
        return app


# ---------------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def browser():
    yield from launched_chromium("browser test", INSTALL_HINT)


@pytest.fixture(scope="module")
def server():
    s = HarnessServer().start()
    yield s
    s.stop()


class Page:
    """A harness page with console/page-error capture."""

    def __init__(self, browser, server, query=""):
        self.server = server
        self.context = browser.new_context(viewport={"width": 1500, "height": 960}, accept_downloads=True)
        self.page = self.context.new_page()
        self.console: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(server.url + query)
        self.page.wait_for_function("window.__h3_ready === true || window.__h3_boot_error !== undefined",
                                    timeout=15000)
        boot_error = self.page.evaluate("window.__h3_boot_error")
        assert boot_error is None, boot_error

    def add_nodes(self, nodes):
        self.page.evaluate("(nodes) => { for (const [id, type] of nodes) app.addNode(/^\\d+$/.test(id) ? Number(id) : id, type); }",
                           [list(n) for n in nodes])

    def replay(self, events):
        self.page.evaluate("(events) => window.__api.replay(events)", events)

    def fmt(self, seconds):
        return self.page.evaluate(
            f"async (s) => (await import('/extensions/{PACK}/h3_view.js')).fmtSeconds(s)", seconds)

    def readout(self, node_id):
        return self.page.locator(f'.node[data-node-id="{node_id}"] .h3-readout')

    def settle(self):
        self.page.wait_for_timeout(150)  # the panel redraw is debounced (60 ms)

    def assert_clean(self, allow_http_errors=False):
        """No page error, no console error (but the browser's own log of a failed HTTP answer, when allowed) and no
        warning from the extension."""
        bad = [t for k, t in self.console if k in ("error", "assert")
               and not (allow_http_errors and t.startswith("Failed to load resource"))]
        ours = [t for k, t in self.console if k == "warning" and "comfy-h3" in t]
        assert not self.errors, f"page errors: {self.errors}"
        assert not bad, f"console errors: {bad}"
        assert not ours, f"console warnings from the extension: {ours}"

    def close(self):
        self.context.close()


@pytest.fixture
def page(browser, server):
    server.mode = "ok"
    server.records = []  # nothing recorded yet; tests fill it when the run "has happened"
    p = Page(browser, server)
    yield p
    p.close()


def open_sidebar(p: Page):
    p.page.click('#sidebar-icons button[data-tab="comfy-h3-timeline"]')
    p.page.wait_for_selector("#sidebar-content .h3-panel")


# ---------------------------------------------------------------------------------------------------- tests

def test_fixture_is_usable():
    assert EVENTS, f"{EVENTS_FILE} holds no events"
    assert TIMINGS, "the event stream has no h3.timing"
    assert any(t.get("node_type") == "H3RemoteDenoise" for t in TIMINGS)
    assert records_by_request(), "no stage record carries a request id"


def test_replay_readouts_and_timeline(page, tmp_path, capsys):
    p = page
    nodes = graph_nodes()
    p.add_nodes(nodes)
    h3_ids = [nid for nid, t in nodes if t.startswith("H3")]
    assert p.page.locator(".h3-readout").count() == len(h3_ids)
    # non-H3 nodes get no readout
    for nid, t in nodes:
        if not t.startswith("H3"):
            assert p.readout(nid).count() == 0
    open_sidebar(p)

    # ---- replay up to the middle of the denoise: live step count and summed step seconds
    idx = [i for i, e in enumerate(EVENTS) if e["type"] == "h3.progress"]
    if idx:
        cut = idx[(len(idx) - 1) // 2]
        p.replay(EVENTS[: cut + 1])
        last = EVENTS[cut]["data"]
        mine = {e["data"]["step"]: e["data"]["seconds"] for e in EVENTS[: cut + 1]
                if e["type"] == "h3.progress" and e["data"]["node"] == last["node"]
                and e["data"]["request_id"] == last["request_id"]}
        text = p.readout(last["node"]).locator(".h3-line-0").inner_text()
        # h3.progress counts forwards; the node's `steps` input counts sigma points, one more
        assert f"forward {last['step']} of {last['total']} ({last['total'] + 1} sigma points)" in text, text
        assert f"denoise {p.fmt(sum(mine.values()))}" in text, text
        secs, tol = parse_seconds(text.split("denoise", 1)[1])
        assert math.isclose(secs, sum(mine.values()), abs_tol=tol), (text, mine)
        assert "h3-live" in p.readout(last["node"]).get_attribute("class")
        p.settle()
        live = p.page.locator(f'.h3-request[data-request-id="{last["request_id"]}"] .h3-bar.h3-live')
        assert live.count() == 1
        assert int(live.locator(".h3-tick").get_attribute("data-steps")) == len(mine)
        rest = EVENTS[cut + 1:]
    else:
        rest = EVENTS
    p.server.records = stage_records()  # re-read on execution_success, merged without duplicates
    p.replay(rest)
    p.settle()

    # ---- final readouts: compute time of every H3 node; denoise steps, transfers and their split
    for nid, t in FINAL_TIMING.items():
        ro = p.readout(nid)
        line0 = ro.locator(".h3-line-0").inner_text()
        summary = t.get("summary") or {}
        assert p.fmt(summary.get("compute_s")) in line0, (t["node_type"], line0)
        if isinstance(summary.get("compute_s"), (int, float)):
            secs, tol = parse_seconds(line0)
            assert math.isclose(secs, summary["compute_s"], abs_tol=tol), (line0, summary["compute_s"])
        if t["node_type"] == "H3RemoteDenoise":
            if summary.get("steps_total") is not None:  # the count once, as forwards and sigma points
                n, text = summary["steps_total"], ro.inner_text()
                assert f"{n + 1} sigma points" in text and f"{n} forwards" in text, text
                assert "step " not in text, text
            for key, label in (("a_to_b", "A->B"), ("b_to_a", "B->A")):
                f = summary.get(key)
                if not f:
                    continue
                receive = (f.get("fetch_s") or 0) + (f.get("materialize_s") or 0)
                span = ro.locator(f'.h3-line-0 [data-key="{key}"]')
                assert span.inner_text() == f"{label} {p.fmt(receive)}"
                title = span.get_attribute("title")
                assert f"fetch {p.fmt(f.get('fetch_s') or 0)}" in title and \
                    f"materialise {p.fmt(f.get('materialize_s') or 0)}" in title, title
                split = ro.locator(f'.h3-line-1 [data-key="{key}_split"]').inner_text()
                assert split == f"{label} fetch {p.fmt(f.get('fetch_s') or 0)} + mat {p.fmt(f.get('materialize_s') or 0)}"

    # ---- the timeline: one waterfall per request, a bar per record on its machine's lane
    by_req = records_by_request()
    assert p.page.locator("#sidebar-content .h3-request").count() == min(len(by_req), 20)
    for rid, recs in by_req.items():
        wf = p.page.locator(f'svg.h3-wf[data-request-id="{rid}"]')
        assert wf.count() == 1
        bars = wf.locator(".h3-bar")
        assert bars.count() == len(recs)
        lane_bg = wf.locator(".h3-lane-bg").first
        min_w = float(wf.get_attribute("data-min-bar-width"))
        x0 = float(lane_bg.get_attribute("x"))
        plot_w = float(lane_bg.get_attribute("width"))
        t0 = min(r["start"] for r in recs)
        span = max(r["end"] for r in recs) - t0
        lanes = {lbl.text_content(): float(lbl.get_attribute("y")) for lbl in wf.locator(".h3-lane-label").all()}
        assert set(lanes) == {"A", "B"}
        for r in recs:
            bar = wf.locator(f'.h3-bar[data-stage="{r["stage"]}"][data-start="{r["start"]}"]')
            assert bar.count() == 1, r["stage"]
            assert bar.get_attribute("data-lane") == r["machine"]
            rect = bar.locator(".h3-bar-rect")
            x, w = float(rect.get_attribute("x")), float(rect.get_attribute("width"))
            assert math.isclose(x, x0 + (r["start"] - t0) / span * plot_w, abs_tol=0.02)
            assert math.isclose(w, max(min_w, (r["end"] - r["start"]) / span * plot_w), abs_tol=0.02)
            y = float(rect.get_attribute("y"))
            assert abs(y - lanes[r["machine"]]) < 18  # inside its lane
            ticks = bar.locator(".h3-tick")  # one path holds every forward's tick
            assert (int(ticks.get_attribute("data-steps")) if ticks.count() else 0) == len(r.get("steps") or [])
            title = bar.locator("title").text_content()
            assert title.startswith({"a_to_b": "A->B", "b_to_a": "B->A"}.get(r["stage"], r["stage"]))
            if r["stage"] in ("a_to_b", "b_to_a") and (r.get("fetch_s") or 0) > 0:
                assert bar.locator(".h3-seg-fetch").count() == 1
        want = lane_gaps(recs)
        for lane, n in want.items():
            assert wf.locator(f'.h3-gap[data-lane="{lane}"]').count() == n, (lane, n)
        # pointing shows the numbers in the details box
        den = [r for r in recs if r["stage"] == "denoise"]
        if den:
            wf.locator('.h3-bar[data-stage="denoise"] .h3-bar-rect').hover()
            n = len(den[0].get("steps") or [])
            p.page.wait_for_function("(want) => document.querySelector('#sidebar-content .h3-details')"
                                     "?.textContent.includes(want)", arg=f"{n} forwards ({n + 1} sigma points)")

    # ---- status from /h3/status
    ok = p.server.status["ok"]
    status = p.page.locator("#sidebar-content .h3-status")
    assert status.locator(".h3-warn").count() == 0
    for role in ("A", "B"):
        ip = ok["actors"][0]["health"][role]["node_ip"]
        assert ip in status.locator(f'.h3-role[data-role="{role}"]').inner_text()
        assert ok["actors"][0]["health"][role]["versions"]["torch"] in \
            status.locator(f'.h3-versions[data-role="{role}"]').inner_text()

    shot = tmp_path / "web_screenshot.png"
    p.page.screenshot(path=str(shot), full_page=True)
    with capsys.disabled():
        print(f"\n[web] screenshot: {shot}")
    out = os.environ.get("H3_SCREENSHOT_DIR")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, pathlib.Path(out) / "web_screenshot.png")
    p.assert_clean()


def test_transfer_highlight_follows_the_setting(page):
    p = page
    p.add_nodes(graph_nodes())
    open_sidebar(p)
    p.replay(EVENTS)
    p.settle()
    by_req = records_by_request()
    den = [t for t in FINAL_TIMING.values() if t["node_type"] == "H3RemoteDenoise" and t.get("request_id") in by_req]
    assert den
    t = den[0]
    recs = by_req[t["request_id"]]
    total = max(r["end"] for r in recs) - min(r["start"] for r in recs)
    shares = {k: ((t["summary"][k].get("fetch_s") or 0) + (t["summary"][k].get("materialize_s") or 0)) / total
              for k in ("a_to_b", "b_to_a") if t["summary"].get(k)}
    assert shares
    ro = p.readout(t["node"])

    def slow_keys():
        return {k for k in shares if "h3-slow" in (ro.locator(f'.h3-line-0 [data-key="{k}"]').get_attribute("class") or "")}

    # default threshold: 10 % of the request
    assert slow_keys() == {k for k, s in shares.items() if s > 0.10}
    for percent in sorted({min(shares.values()) * 100 / 2, (min(shares.values()) + max(shares.values())) * 50, 100.0}):
        p.page.evaluate("([id, v]) => app.extensionManager.setting.set(id, v)", [SETTING, percent])
        p.settle()
        expected = {k for k, s in shares.items() if s > percent / 100}
        assert slow_keys() == expected, (percent, shares)
        head = p.page.locator(f'.h3-request[data-request-id="{t["request_id"]}"]')
        assert set(filter(None, (head.get_attribute("data-slow") or "").split())) == expected
        for k in shares:
            bar = head.locator(f'.h3-bar[data-stage="{k}"]')
            assert ("h3-slow" in bar.get_attribute("class")) == (k in expected)
    p.assert_clean()


def test_status_warning_and_reconnect(page):
    p = page
    open_sidebar(p)
    status = p.page.locator("#sidebar-content .h3-status")
    status.locator(".h3-role").first.wait_for()
    assert status.locator(".h3-warn").count() == 0
    bad = p.server.status["unreachable"]

    p.server.mode = "unreachable"
    before = p.server.hits.count("status")
    p.page.evaluate("window.__api.reconnect()")
    warn = status.locator(".h3-warn")
    warn.wait_for()
    assert "B unreachable" in warn.inner_text()
    assert bad["error"] in warn.inner_text()
    assert p.server.hits.count("status") > before  # re-fetched on `reconnected`

    p.server.mode = "down"
    p.page.evaluate("window.__api.reconnect()")
    p.page.wait_for_function(
        "document.querySelector('#sidebar-content .h3-warn')?.textContent.includes('H3 status unavailable')")
    assert "502" in warn.inner_text()

    p.server.mode = "ok"
    p.page.evaluate("window.__api.reconnect()")
    p.page.wait_for_function("!document.querySelector('#sidebar-content .h3-warn')")
    # `status` websocket events (queue changes) re-fetch too, at most every few seconds
    n = p.server.hits.count("status")
    p.page.evaluate("for (let i = 0; i < 20; i++) window.__api.receive({type: 'status', data: {status: {exec_info: {queue_remaining: 0}}}})")
    p.page.wait_for_timeout(300)
    assert p.server.hits.count("status") - n <= 1
    p.assert_clean(allow_http_errors=True)  # Chromium logs the 502 of the "down" phase itself


def test_export_json_and_csv(page):
    p = page
    p.server.records = stage_records()
    open_sidebar(p)
    with p.page.expect_download() as dl:
        p.page.click('#sidebar-content button[data-action="exportJSON"]')
    d = dl.value
    assert d.suggested_filename.endswith(".json")
    data = json.loads(pathlib.Path(d.path()).read_text())
    assert data == {"records": p.server.records}
    with p.page.expect_download() as dl:
        p.page.click('#sidebar-content button[data-action="exportCSV"]')
    d = dl.value
    assert d.suggested_filename.endswith(".csv")
    assert pathlib.Path(d.path()).read_bytes().decode() == timings_csv(p.server.records)
    p.assert_clean()


def test_release_b_button_posts_and_says_what_b_released(page):
    """The panel's "Release B's model" (issue 29): one POST /h3/release_b, the answer in the panel's message, and the
    status read again so that the worker's row shows it."""
    p = page
    open_sidebar(p)
    before = p.server.hits.count("status")
    p.page.click('#sidebar-content button[data-action="releaseB"]')
    p.page.wait_for_function("() => (document.querySelector('#sidebar-content .h3-message')?.textContent || '')"
                             ".includes('the next run reloads on B')", timeout=10_000)
    text = p.page.inner_text("#sidebar-content .h3-message")
    assert "h3_dit released 12.0 MiB" in text, text
    assert p.server.hits.count("release_b") == 1 and p.server.release_bodies == [{}]
    for _ in range(50):  # the status is read again right after the message
        if p.server.hits.count("status") > before:
            break
        p.page.wait_for_timeout(100)
    assert p.server.hits.count("status") > before
    p.assert_clean()


def test_floating_panel_when_the_frontend_has_no_sidebar_api(browser, server):
    server.mode = "ok"
    server.records = []
    p = Page(browser, server, "?sidebar=0")
    try:
        assert p.page.locator("#sidebar-icons button").count() == 0
        box = p.page.locator(".h3-float")
        assert box.is_hidden()
        p.page.click(".h3-float-btn")
        assert box.is_visible()
        p.add_nodes(graph_nodes())
        p.replay(EVENTS)
        p.settle()
        for rid in records_by_request():
            assert box.locator(f'svg.h3-wf[data-request-id="{rid}"] .h3-bar').count() > 0
        box.locator(".h3-role").first.wait_for()
        # the threshold is read from the legacy settings API there
        t = next(iter(FINAL_TIMING))
        assert p.readout(t).count() == 1
        p.page.click(".h3-float-btn")
        assert box.is_hidden()
        p.assert_clean()
    finally:
        p.close()


def test_graph_without_h3_nodes(page):
    p = page
    open_sidebar(p)
    p.add_nodes([("1", "EmptyImage"), ("2", "PreviewAny"), ("4", "PreviewImage")])
    trace = load_events(SHARED_TRACE) if SHARED_TRACE.is_file() else \
        [e for e in EVENTS if not e["type"].startswith("h3.") and e["type"] != "executed"]
    p.replay(trace)
    p.settle()
    assert p.page.locator(".h3-readout").count() == 0
    assert p.page.locator("#sidebar-content .h3-empty").count() == 1
    p.assert_clean()


def test_malformed_events_never_throw(page):
    p = page
    p.add_nodes(graph_nodes())
    open_sidebar(p)
    junk = [None, 1, "x", [], {}, {"node": None}, {"node": "4", "stages": "x", "summary": 5},
            {"node": "4", "step": "NaN"}, {"node": "4", "request_id": "r", "step": 1, "total": "?", "seconds": None},
            {"node": "3", "output": {"h3_timing": [None, 3, {"stages": [{"stage": None}]}]}}]
    msgs = [{"type": t, "data": d} for t in ("h3.timing", "h3.progress", "executed", "executing", "execution_start",
                                             "execution_cached", "execution_error", "execution_success", "status")
            for d in junk]
    p.replay(msgs)
    p.page.evaluate("window.__api.reconnect()")
    p.settle()
    # and a normal run still renders afterwards
    p.replay(EVENTS)
    p.settle()
    for nid, t in FINAL_TIMING.items():
        assert p.fmt((t.get("summary") or {}).get("compute_s")) in p.readout(nid).inner_text()
    p.assert_clean()
