"""Records what a real ComfyUI (with this pack loaded) answers to its own frontend, for tests/test_web_frontend.py.

    COMFYUI_URL=http://127.0.0.1:8188 .venv/bin/python tests/web/record_frontend_fixtures.py [--trace h3_t2va_turbo]

Run it once per frontend version (ComfyUI's ``--front-end-root`` picks the frontend): the answers go into a folder
named after the version the page reports (tests/web/fixtures/comfyui_frontend/<version>/), and the test runs every
recorded version.

Start ComfyUI first (README "Tests": ``python main.py --cpu --listen 127.0.0.1 --port 8188 --disable-auto-launch
--extra-model-paths-config <yaml with custom_nodes: a folder holding a ``comfy-h3`` link to this repo>``). The script
opens the frontend ComfyUI serves in headless Chromium (Playwright, /usr/bin/chromium), once in the classic canvas and
once in Vue-node mode, and keeps every answer the page got from ``/api/...``, ``/internal/...`` and ``/templates/...``
plus the websocket messages the server sent on connect. Writes into tests/web/fixtures/comfyui_frontend/<frontend version>/:

- ``responses.json``: ``{"GET /api/path?query": {"status", "content_type", "body"}}`` (body: parsed JSON, else text);
- ``object_info.json``: ``GET /api/object_info`` trimmed to this pack's nodes, the nodes of the frontend's default
  graph and a few core nodes the pack's workflows connect to (``--keep``);
- ``ws_connect.jsonl``: the messages the server sends a new websocket client (``status`` with its sid, then
  ``feature_flags`` in answer to the client's own);
- ``manifest.json``: ComfyUI and frontend versions, when and what was trimmed;
- with ``--trace TEMPLATE``: ``tests/web/fixtures/comfyui_ws_h3_trace.jsonl``, the websocket messages of one run of
  that example workflow queued from the page like a user (its pickers set to ``tiny-random``, the cluster ``local``);
  start ComfyUI with ``--preview-method latent2rgb`` so that the run carries B's previews.

Trimmed to stay small: the core blueprint subgraphs (``/api/global_subgraphs`` becomes ``{}``), object_info as above.
The first page load is not recorded (the frontend writes its first-run settings then); the Vue-node setting is
switched on for the second recorded load and restored afterwards. Nothing is copied from ComfyUI's source.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import sys
import urllib.error
import urllib.parse
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
OUT = ROOT / "tests" / "web" / "fixtures" / "comfyui_frontend"
CHROMIUM = os.environ.get("H3_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
VUE_SETTING = "Comfy.VueNodes.Enabled"
# the sidebar tab web/h3_extension.js registers: 1.49 names its button by the tab's id, 1.58 by its tooltip
TAB_BUTTON = '.comfy-h3-timeline-tab-button, .side-bar-button[aria-label^="H3 timings"]'
TRACE_OUT = ROOT / "tests" / "web" / "fixtures" / "comfyui_ws_h3_trace.jsonl"
PICKS = {"H3LoadEncoders": {"model_path": "tiny-random"},
         "H3RemoteDiT": {"model_path": "tiny-random", "cluster_address": "local"}, "H3LoRA": {"lora_path": "tiny-random"}}
# core nodes the pack's example workflows and docs connect to (besides the frontend's default graph)
KEEP = ["LoadImage", "LoadAudio", "PreviewAny", "PreviewImage", "EmptyImage", "CreateVideo", "SaveVideo",
        # the h3_core_* templates: ComfyUI's own H3 graph (scripts/snapshot_core_nodes.py's CORE_TYPES)
        "CLIPLoader", "VAELoader", "MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo", "RandomNoise", "KSamplerSelect",
        "BasicScheduler", "BasicGuider", "SamplerCustomAdvanced", "VAEDecode", "VAEDecodeAudio"]
RECORDED_PREFIXES = ("/api/", "/internal/", "/templates/")
# fetched directly as well: older/other frontends ask for them, the test server should know the real answer
EXTRA_GETS = ["/api/workflow_templates", "/api/userdata/comfy.templates.json", "/api/embeddings", "/api/queue",
              "/api/history?max_items=64", "/api/history?max_items=16", "/api/prompt", "/api/features", "/api/system_stats", "/api/h3/status",
              "/api/h3/timings"]


def http(base: str, method: str, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
        return r.status, r.headers.get("Content-Type", ""), raw


def decode(ctype: str, raw: bytes):
    text = raw.decode("utf-8", errors="replace")
    if "json" in ctype:
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def key_of(method: str, url: str) -> str:
    u = urllib.parse.urlsplit(url)
    return f"{method} {u.path}{'?' + u.query if u.query else ''}"


def record_load(browser, base: str, into: dict, ws_out: list, wait_ms: int) -> dict:
    """One page load; fills ``into`` with the answers and ``ws_out`` with the server's first websocket messages."""
    context = browser.new_context(viewport={"width": 1500, "height": 960})
    page = context.new_page()
    pending = []

    def on_response(resp):
        u = urllib.parse.urlsplit(resp.url)
        if not u.path.startswith(RECORDED_PREFIXES):
            return
        if u.path.startswith("/api/global_subgraphs/"):
            return  # blueprint bodies: dropped with the list
        pending.append(resp)

    def on_ws(ws):
        if not ws_out:
            ws.on("framereceived", lambda payload: ws_out.append(payload) if isinstance(payload, str) else None)

    page.on("response", on_response)
    page.on("websocket", on_ws)
    page.goto(base)
    page.wait_for_selector(TAB_BUTTON, timeout=60000)
    page.wait_for_load_state("networkidle")
    page.click(TAB_BUTTON)  # the H3 tab's own requests
    page.wait_for_timeout(wait_ms)
    info = page.evaluate("""() => ({
        frontend: window.__COMFYUI_FRONTEND_VERSION__ ?? null,
        graph_types: [...new Set((window.app?.graph?.nodes ?? []).map((n) => n.type))],
    })""")
    for resp in pending:
        k = key_of(resp.request.method, resp.url)
        if resp.request.method != "GET" or k in into:
            continue
        try:
            raw = resp.body()
        except Exception:  # a redirect or an aborted request has no body
            continue
        ctype = resp.headers.get("content-type", "")
        into[k] = {"status": resp.status, "content_type": ctype.split(";")[0], "body": decode(ctype, raw)}
    context.close()
    return info


def record_trace(browser, base: str, template: str, out: pathlib.Path, timeout_s: float = 900) -> int:
    """Queues an example workflow from the page like a user and writes the websocket text messages of its run."""
    wf = json.loads((ROOT / "example_workflows" / f"{template}.json").read_text())
    context = browser.new_context(viewport={"width": 1500, "height": 960})
    page = context.new_page()
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived",
                                          lambda p: frames.append(p) if isinstance(p, str) else None))
    page.goto(base)
    page.wait_for_selector(TAB_BUTTON, timeout=60000)
    page.evaluate("([wf, name]) => window.app.loadGraphData(wf, true, true, name)", [wf, f"{template}.json"])
    page.evaluate("""async ([picks]) => {
        const { api } = await import('/scripts/api.js');
        window.__h3end = null;
        for (const k of ['execution_success', 'execution_error', 'execution_interrupted'])
            api.addEventListener(k, () => { window.__h3end = k; });
        for (const node of window.app.graph.nodes) {
            for (const [name, value] of Object.entries(picks[node.type] ?? {})) {
                const w = node.widgets.find((w) => w.name === name);
                w.value = value;
            }
        }
        await window.app.queuePrompt(0, 1);
    }""", [PICKS])
    page.wait_for_function("() => window.__h3end !== null", timeout=timeout_s * 1000)
    end = page.evaluate("() => window.__h3end")
    context.close()
    if end != "execution_success":
        raise SystemExit(f"the {template} run ended with {end}: see ComfyUI's log")
    keep = [f for f in frames if json.loads(f).get("type") != "crystools.monitor"]
    out.write_text("".join(f.rstrip("\n") + "\n" for f in keep))
    return len(keep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("COMFYUI_URL", "http://127.0.0.1:8188"))
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    ap.add_argument("--pack", default="comfy-h3", help="the pack's folder name in ComfyUI (its /extensions/<name>/)")
    ap.add_argument("--keep", nargs="*", default=KEEP, help="core node types kept in object_info")
    ap.add_argument("--wait-ms", type=int, default=2500)
    ap.add_argument("--trace", metavar="TEMPLATE", help="also record a run of this example workflow (its name)")
    args = ap.parse_args(argv)
    base = args.url.rstrip("/") + "/"

    from playwright.sync_api import sync_playwright

    _, _, raw = http(base, "GET", "/api/settings")
    settings_before = json.loads(raw)
    if "Comfy.TutorialCompleted" not in settings_before:  # a new user's first page opens the templates dialog over all
        http(base, "POST", "/api/settings/Comfy.TutorialCompleted", True)
    responses: dict = {}
    ws_msgs: list = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            record_load(browser, base, {}, [], 500)  # first run: the frontend writes its settings
            http(base, "POST", f"/api/settings/{VUE_SETTING}", False)
            classic = record_load(browser, base, responses, ws_msgs, args.wait_ms)
            http(base, "POST", f"/api/settings/{VUE_SETTING}", True)
            vue = record_load(browser, base, responses, [], args.wait_ms)
        finally:
            browser.close()
            restore = settings_before.get(VUE_SETTING, False)
            http(base, "POST", f"/api/settings/{VUE_SETTING}", restore)
    # the settings as they were in the classic load (the test switches the Vue setting itself)
    _, _, raw = http(base, "GET", "/api/settings")
    settings = json.loads(raw)
    settings.pop(VUE_SETTING, None)
    responses["GET /api/settings"] = {"status": 200, "content_type": "application/json", "body": settings}
    for path in EXTRA_GETS:
        k = f"GET {path}"
        if k in responses:
            continue
        try:
            status, ctype, raw = http(base, "GET", path)
        except urllib.error.HTTPError as e:
            status, ctype, raw = e.code, e.headers.get("Content-Type", ""), e.read()
        responses[k] = {"status": status, "content_type": ctype.split(";")[0], "body": decode(ctype, raw)}

    if args.trace:  # last: the answers above must not hold this run (the test pushes it as a live run)
        http(base, "POST", f"/api/settings/{VUE_SETTING}", False)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                n = record_trace(browser, base, args.trace, TRACE_OUT)
            finally:
                browser.close()
                http(base, "POST", f"/api/settings/{VUE_SETTING}", settings_before.get(VUE_SETTING, False))
        print(f"wrote {n} websocket messages of a {args.trace} run into {TRACE_OUT}")

    # ---- trim
    full = responses.pop("GET /api/object_info")["body"]
    mine = {k for k, v in full.items() if str(v.get("python_module", "")).split(".")[-1] == args.pack}
    keep = mine | set(classic["graph_types"]) | set(vue["graph_types"]) | set(args.keep)
    object_info = {k: full[k] for k in sorted(keep) if k in full}
    n_subgraphs = 0
    if "GET /api/global_subgraphs" in responses:
        n_subgraphs = len(responses["GET /api/global_subgraphs"]["body"] or {})
        responses["GET /api/global_subgraphs"]["body"] = {}

    out: pathlib.Path = args.out / classic["frontend"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "responses.json").write_text(json.dumps(dict(sorted(responses.items())), indent=1, sort_keys=False) + "\n")
    (out / "object_info.json").write_text(json.dumps(object_info, indent=1) + "\n")
    (out / "ws_connect.jsonl").write_text("".join(m if m.endswith("\n") else m + "\n" for m in ws_msgs[:2]))
    stats = responses.get("GET /api/system_stats", {}).get("body") or {}
    manifest = {
        "recorded": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "comfyui_version": (stats.get("system") or {}).get("comfyui_version"),
        "frontend_version": classic["frontend"],
        "pack_folder": args.pack,
        "object_info": {"kept": sorted(object_info), "of": len(full), "pack_nodes": sorted(mine)},
        "trimmed": {"GET /api/global_subgraphs": f"{n_subgraphs} core blueprints -> {{}}"},
        "default_graph_types": sorted(set(classic["graph_types"])),
        "recorder": "tests/web/record_frontend_fixtures.py",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {len(responses)} responses, {len(object_info)}/{len(full)} node types, {len(ws_msgs[:2])} websocket "
          f"messages into {out} ({size / 1024:.0f} KiB); ComfyUI {manifest['comfyui_version']}, "
          f"frontend {manifest['frontend_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
