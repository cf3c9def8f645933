"""Measures how big the real frontend draws each node of the example workflows, for scripts/make_example_workflows.py.

    .venv/bin/python tests/web/measure_node_sizes.py        # writes scripts/node_sizes.json

For every frontend version of ``browser_support.FRONTEND_VERSIONS`` (installed on first use like the tests do), in
the classic canvas and with Vue nodes, it opens each example workflow with every node shrunk to a sliver, so the
frontend grows each to the least room its widgets need (an H3 node's readout included: its height is reserved from
the node's creation), and keeps the largest box of each node type in canvas units, title bar included (LiteGraph's
node size plus its title; a Vue node's DOM box over the zoom). The page is the real frontend package served by
tests/test_web_frontend.py's test server (recorded ComfyUI answers, the example inputs as ComfyUI's input folder).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from browser_support import CHROMIUM, CHROMIUM_ARGS, FRONTEND_VERSIONS, frontend_static  # noqa: E402
from test_web_frontend import RECORDED, TEMPLATES, FrontendPage, FrontendServer, template  # noqa: E402

OUT = ROOT / "scripts" / "node_sizes.json"
WIDTH = 340  # every template node's width (canvas units)

JS_SIZES = """() => {
  const ds = window.app.canvas.ds;
  const title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  return window.app.graph.nodes.map((n) => {
    const el = document.querySelector(`[data-node-id="${n.id}"]`);
    const r = el?.getBoundingClientRect();
    const box = r && r.width > 0 ? [r.width / ds.scale, r.height / ds.scale] : [n.size[0], n.size[1] + title];
    return { type: n.type, w: box[0], h: box[1] };
  });
}"""


def shrunk(name: str) -> dict:
    wf = copy.deepcopy(template(name))
    for n in wf["nodes"]:
        n["size"] = [WIDTH, 40]
    wf["extra"]["ds"] = {"scale": 1.0, "offset": [40, 60]}
    return wf


def measure(versions=FRONTEND_VERSIONS) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for version in versions:
                static = frontend_static(version)
                if isinstance(static, str):
                    raise SystemExit(f"cannot measure with frontend {version}: {static}")
                server = FrontendServer(static, RECORDED / version).start()
                try:
                    for mode, vue in (("litegraph", False), ("vue", True)):
                        page = FrontendPage(browser, server, vue=vue, version=version, viewport=(2400, 1400))
                        sizes: dict = {}
                        try:
                            for name in TEMPLATES:
                                page.open_workflow(name, shrunk(name))
                                page.settle(800)
                                for s in page.page.evaluate(JS_SIZES):
                                    w, h = sizes.get(s["type"], (0, 0))
                                    sizes[s["type"]] = (max(w, s["w"]), max(h, s["h"]))
                        finally:
                            page.close()
                        out.setdefault(version, {})[mode] = {k: [round(w, 1), round(h, 1)] for k, (w, h) in sorted(sizes.items())}
                        print(f"{version} {mode}: " + ", ".join(f"{k} {h:.0f}" for k, (w, h) in sorted(sizes.items())))
                finally:
                    server.stop()
        finally:
            browser.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args(argv)
    measured = measure()
    largest: dict = {}
    for modes in measured.values():
        for sizes in modes.values():
            for k, (w, h) in sizes.items():
                lw, lh = largest.get(k, (0, 0))
                largest[k] = [max(lw, w), max(lh, h)]
    doc = {
        "about": "boxes (canvas units, title bar included) the real frontend draws each node type of the example "
                 "workflows in, at their width; written by tests/web/measure_node_sizes.py, read by "
                 "scripts/make_example_workflows.py",
        "measured": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "width": WIDTH,
        "largest": dict(sorted(largest.items())),
        "by_frontend": measured,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
