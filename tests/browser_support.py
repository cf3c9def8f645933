"""What the browser tests share: Debian's Chromium driven by Playwright, and an aiohttp app served from a thread.

Used by ``test_web_browser`` (our own page), ``test_web_frontend`` (the real frontend package) and
``test_comfyui_integration`` (a real ComfyUI).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import threading
import time

CHROMIUM = os.environ.get("H3_CHROMIUM", "/usr/bin/chromium")
# the last four keep Chromium from trying to reach the (closed) network at start
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def missing_browser_parts() -> list[str]:
    """What the browser tests need and this machine lacks (Chromium, the playwright package), in words."""
    missing = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"Chromium ({CHROMIUM})")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package")
    return missing


class ThreadedServer:
    """An aiohttp app (``_app()``) on 127.0.0.1 at a random port, run by its own event loop in a daemon thread."""

    def __init__(self):
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = None

    def _app(self):  # pragma: no cover - every server defines its routes
        raise NotImplementedError

    async def _closing(self) -> None:
        """Runs on the server's loop after it stopped, before the app is cleaned up (open websockets, ...)."""

    def _run(self):
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self._app())
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._closing())
        self._loop.run_until_complete(runner.cleanup())

    def start(self):
        self._thread.start()
        assert self._ready.wait(10), f"{type(self).__name__} did not start"
        return self

    def stop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/"


# ---------------------------------------------------------------------------------------------------- frontends

#: The frontend versions the web extension is checked with: the one ComfyUI 0.33 pins (the ``[test]`` extra installs
#: it) and the newest on PyPI when the issue was fixed. A version that is not installed is installed with
#: ``pip install --target`` into ``H3_FRONTEND_CACHE`` (default ``~/.cache/comfy-h3/frontends``) on first use.
FRONTEND_VERSIONS = ("1.49.6", "1.58.1")
FRONTEND_CACHE = pathlib.Path(os.environ.get("H3_FRONTEND_CACHE") or pathlib.Path.home() / ".cache" / "comfy-h3" / "frontends")


def frontend_static(version: str, install: bool | None = None) -> pathlib.Path | str:
    """The static folder of ``comfyui-frontend-package==version``, or a sentence saying why there is none.

    Looks at the installed package, then at ``FRONTEND_CACHE/<version>`` (a ``pip install --target`` folder); with
    ``install`` (default: unless ``H3_FRONTEND_INSTALL=0``) it installs the version there with this Python's pip."""
    try:
        from importlib.metadata import PackageNotFoundError, version as installed_version

        try:
            if installed_version("comfyui-frontend-package") == version:
                import comfyui_frontend_package

                static = pathlib.Path(comfyui_frontend_package.__file__).resolve().parent / "static"
                if (static / "index.html").is_file():
                    return static
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - Python < 3.8
        pass
    target = FRONTEND_CACHE / version
    static = target / "comfyui_frontend_package" / "static"
    if (static / "index.html").is_file():
        return static
    if install is None:
        install = os.environ.get("H3_FRONTEND_INSTALL", "1") != "0"
    if not install:
        return (f"comfyui-frontend-package=={version} (not installed and not in {target}; run `python -m pip install "
                f"--no-deps --target {target} comfyui-frontend-package=={version}`)")
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
           f"comfyui-frontend-package=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not (static / "index.html").is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return (f"comfyui-frontend-package=={version} (`{' '.join(cmd)}` failed: {tail[0]}; install it there by hand "
                f"or set H3_FRONTEND_CACHE to a folder holding <version>/comfyui_frontend_package)")
    return static


# ---------------------------------------------------------------------------------------------------- the first screen

#: What a template must fit when it opens: a laptop's browser window, every node at a zoom the canvas still draws
#: with titles and widgets (LiteGraph draws nodes as plain boxes below 0.6), none under the frontend's own bars,
#: menus and minimap.
FIRST_SCREEN = (1280, 720)
MIN_ZOOM = 0.6
MASK_STEP = 10  # px between two sampled points of the free-area mask

#: JS: the screen points where the graph canvas itself is on top (``.``) or something of the frontend is (``#``),
#: sampled every ``step`` px; run it on an empty graph (``app.graph.clear()``).
JS_FREE_MASK = """(step) => {
  const c = window.app.canvas.canvas;
  const rows = [];
  for (let y = step / 2; y < innerHeight; y += step) {
    let row = '';
    for (let x = step / 2; x < innerWidth; x += step) {
      const e = document.elementFromPoint(x, y);
      row += e === c ? '.' : '#';
    }
    rows.push(row);
  }
  return rows;
}"""

def no_browser(what: str, missing: str, hint: str):
    """A browser test that cannot run: skipped where ``H3_SKIP_BROWSER=1`` says so, else a failure naming what is
    missing and how to install it (a missing browser never passes silently)."""
    import pytest  # the test runner: browser_support is also imported by the measuring scripts outside pytest

    msg = f"{what} needs {missing}: {hint}"
    if os.environ.get("H3_SKIP_BROWSER") == "1":
        pytest.skip(msg)
    pytest.fail(msg, pytrace=False)


def launched_chromium(what: str, hint: str):
    """A module fixture's body (``yield from``): Debian's Chromium driven by Playwright, closed afterwards."""
    missing = missing_browser_parts()
    if missing:
        no_browser(what, " and ".join(missing), hint)
    from playwright.sync_api import sync_playwright  # present: missing_browser_parts checked it

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


#: JS: the texts of the toasts the frontend shows now
JS_TOASTS = "() => [...document.querySelectorAll('.p-toast-message')].map((t) => t.innerText.trim())"


#: JS: what the frontend draws over the canvas, one entry per element (its tag, classes and first words), sampled
#: like ``JS_FREE_MASK``: named when a node lies under it
JS_COVERS = """(step) => {
  const c = window.app.canvas.canvas, seen = new Map();
  for (let y = step / 2; y < innerHeight; y += step)
    for (let x = step / 2; x < innerWidth; x += step) {
      const e = document.elementFromPoint(x, y);
      if (e && e !== c && !seen.has(e))
        seen.set(e, `${e.tagName.toLowerCase()}.${[...e.classList].slice(0, 3).join('.')} at (${x}, ${y}) `
                    + JSON.stringify((e.innerText || '').trim().slice(0, 40)));
    }
  return [...seen.values()];
}"""


class Mask(list):
    """A free-area mask (rows of ``.``/``#``) with what covers the ``#`` points, for an assertion's message."""

    def __init__(self, rows, covers=()):
        super().__init__(rows)
        self.covers = list(covers)


#: JS: closes the frontend's "N errors found" panel (1.49+: missing models or inputs of the graph it was showing) and
#: says whether there was one. The page boots into the frontend's default graph, whose checkpoint no test server has;
#: that check may answer after the graph was cleared, and its panel then stays over the canvas until closed.
JS_CLOSE_ERRORS = """() => {
  const panels = [...document.querySelectorAll('div')].filter((d) => /\\d+ errors? found|is missing a required model/
      .test(d.innerText || '') && d.querySelector('button [class*="lucide--x"]'));
  const panel = panels.sort((a, b) => a.innerText.length - b.innerText.length)[0];
  const close = panel?.querySelector('button [class*="lucide--x"]')?.closest('button');
  if (close) close.click();
  return !!close;
}"""


#: JS: the text of the frontend's "N errors found" panel, or null (JS_CLOSE_ERRORS above also closes the card a
#: frontend shows for the default graph's missing model, which can answer after the free-screen mask settled)
JS_ERRORS_PANEL = """() => {
  const panels = [...document.querySelectorAll('div')].filter((d) => /\\d+ errors? found/.test(d.innerText || ''));
  return panels.sort((a, b) => a.innerText.length - b.innerText.length)[0]?.innerText.trim() ?? null;
}"""


def stable_free_mask(page, toast_s: float = 20.0, stable_s: float = 15.0) -> list[str]:
    """``JS_FREE_MASK`` of an emptied graph once the frontend has settled: a toast it shows on load (a passing one:
    "reconnected", a slow answer) is waited out, bounded, and named if it stays; the errors panel of the default
    graph it booted into is closed (``JS_CLOSE_ERRORS``); then the first mask that two captures 400 ms apart agree
    on (a loaded machine caught the bars mid-layout once)."""
    page.evaluate(JS_CLOSE_ERRORS)
    deadline = time.monotonic() + toast_s
    while (shown := page.evaluate(JS_TOASTS)) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert not shown, f"the frontend kept showing a toast over the canvas for {toast_s:.0f} s: {shown}"
    mask, deadline = page.evaluate(JS_FREE_MASK, MASK_STEP), time.monotonic() + stable_s
    while time.monotonic() < deadline:
        page.wait_for_timeout(400)
        if page.evaluate(JS_CLOSE_ERRORS):  # the default graph's check answered late
            page.wait_for_timeout(400)
        again = page.evaluate(JS_FREE_MASK, MASK_STEP)
        if again == mask:
            return Mask(mask, page.evaluate(JS_COVERS, MASK_STEP))
        mask = again
    raise AssertionError(f"what the frontend draws over the canvas kept changing for {stable_s:.0f} s")


#: JS: every node's box on screen ``{id, type, box: [left, top, right, bottom], zoom, vue}`` with its title bar: the
#: DOM element of a Vue node, else LiteGraph's bounding box through the canvas transform.
JS_NODE_BOXES = """() => {
  const c = window.app.canvas;
  const ds = c.ds;
  const rect = c.canvas.getBoundingClientRect();
  const title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  return window.app.graph.nodes.map((n) => {
    const el = document.querySelector(`[data-node-id="${n.id}"]`);
    let box;
    if (el && el.getBoundingClientRect().width > 0) {
      const r = el.getBoundingClientRect();
      box = [r.left, r.top, r.right, r.bottom];
    } else {
      const sx = (x) => (x + ds.offset[0]) * ds.scale + rect.left;
      const sy = (y) => (y + ds.offset[1]) * ds.scale + rect.top;
      const collapsed = n.flags?.collapsed;
      box = [sx(n.pos[0]), sy(n.pos[1] - title), sx(n.pos[0] + n.size[0]), sy(n.pos[1] + (collapsed ? 0 : n.size[1]))];
    }
    return { id: String(n.id), type: n.type, box, zoom: ds.scale, vue: !!el, size: [n.size[0], n.size[1]] };
  });
}"""


def opened_problems(name: str, page, mask: list[str]) -> list[str]:
    """What is wrong with workflow ``name`` as the page shows it now: a zoom below ``MIN_ZOOM``, nodes over each
    other, nodes under the frontend's bars (``mask``: ``stable_free_mask`` of the empty graph)."""
    zoom = page.evaluate("() => window.app.canvas.ds.scale")
    out = [f"{name}: opens at zoom {zoom:.3f} < {MIN_ZOOM}"] if zoom < MIN_ZOOM else []
    errors = page.evaluate(JS_ERRORS_PANEL)
    if errors:  # the frontend's own check of the graph (missing models, inputs or nodes) found something
        out.append(f"{name}: the frontend says {errors!r}")
    boxes = page.evaluate(JS_NODE_BOXES)
    cut = [f"{name}: {x}" for x in page.evaluate(JS_CUT_LABELS)]
    notes = [f"{name}: {x}" for x in note_problems(page.evaluate(JS_NOTES))]
    return out + cut + notes + [f"{name}: {x}" for x in overlaps(boxes) + covered(boxes, mask)]


#: The least size (screen px) the first-run note's heading, the words a user needs first, is drawn in at the zoom a
#: template opens with; its body text is the frontend's 10 canvas px (6.3 px at 0.62)
NOTE_HEADING_PX = 9.5

#: JS: each markdown note as drawn: its first heading's font size on screen (``null`` without one), the bottom of its
#: last line of text and of its box (page px)
JS_NOTES = """() => window.app.graph.nodes.filter((n) => n.type === 'MarkdownNote').map((n) => {
  const root = document.querySelector(`[data-node-id="${n.id}"]`) || n.widgets?.[0]?.element;
  if (!root) return { id: String(n.id), drawn: false };
  const onScreen = (e) => parseFloat(getComputedStyle(e).fontSize) * e.getBoundingClientRect().width / (e.offsetWidth || 1);
  const heading = root.querySelector('h1, h2, h3');
  const texts = [...root.querySelectorAll('h1, h2, h3, h4, p, li')].filter((e) => e.getBoundingClientRect().height > 0);
  return { id: String(n.id), drawn: true, heading: heading ? (heading.innerText || '').trim() : null,
           heading_px: heading ? onScreen(heading) : null,
           text_bottom: Math.max(0, ...texts.map((e) => e.getBoundingClientRect().bottom)),
           box_bottom: root.getBoundingClientRect().bottom };
})"""


def note_problems(notes: list[dict]) -> list[str]:
    """What makes a note hard to read on the first screen: no heading, a heading under ``NOTE_HEADING_PX``, text
    that runs out of its box."""
    out = []
    for n in notes:
        if not n["drawn"]:
            out.append(f"note {n['id']} is not drawn")
        elif n["heading_px"] is None:
            out.append(f"note {n['id']} has no heading: its text alone is too small to read at this zoom")
        elif n["heading_px"] < NOTE_HEADING_PX:
            out.append(f"note {n['id']}'s heading {n['heading']!r} is {n['heading_px']:.1f} px on screen "
                       f"(< {NOTE_HEADING_PX})")
        if n["drawn"] and n["text_bottom"] > n["box_bottom"] + 1:
            out.append(f"note {n['id']}'s text ends {n['text_bottom'] - n['box_bottom']:.0f} px below its box")
    return out


#: JS: the widget labels of the pack's nodes the page shows cut short, in words (``H3LoRA 11: lora_path drawn as 'lora_…'``). The classic
#: canvas truncates a label to fit its value (``drawTruncatingText``: a prefix, then an ellipsis): each widget's draw
#: is watched for the texts it draws, and one that draws a strict prefix of its label but never the label is cut. A
#: Vue node's label is cut by CSS: an element holding just the label text that is narrower than that text.
JS_CUT_LABELS = """() => {
  const app = window.app, out = [];
  const vue = !!app.extensionManager?.setting?.get?.('Comfy.VueNodes.Enabled');
  const label = (w) => String(w.label || w.name || '');
  // the pack's nodes, whose defaults are the pack's: 1.49.6's canvas also cuts ComfyUI's own VAELoader's vae_name
  // to fit Comfy-Org's file names (the h3_core_* templates), as it does in ComfyUI's own templates
  const ours = (n) => String(n.type).startsWith('H3');
  if (vue) {
    for (const n of app.graph.nodes.filter(ours)) {
      const el = document.querySelector(`[data-node-id="${n.id}"]`);
      if (!el) continue;
      const names = new Set((n.widgets ?? []).map(label).filter(Boolean));
      for (const e of el.querySelectorAll('*')) {
        const text = e.children.length === 0 ? (e.textContent || '').trim() : '';
        if (names.has(text) && e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1)
          out.push(`${n.type} ${n.id}: label ${text} shown ${e.clientWidth} px wide of ${e.scrollWidth}`);
      }
    }
    return out;
  }
  const proto = CanvasRenderingContext2D.prototype, fillText = proto.fillText;
  let drawing = null;
  const drawn = new Map();
  proto.fillText = function (text, ...rest) {
    if (drawing) drawn.get(drawing).push(String(text));
    return fillText.call(this, text, ...rest);
  };
  const wrapped = [];
  for (const n of app.graph.nodes.filter(ours))
    for (const w of n.widgets ?? []) {
      if (typeof w.drawWidget !== 'function' || Object.prototype.hasOwnProperty.call(w, 'drawWidget')) continue;
      drawn.set(w, []);
      w.drawWidget = function (...args) {
        drawing = w;
        try { return Object.getPrototypeOf(w).drawWidget.apply(this, args); } finally { drawing = null; }
      };
      wrapped.push([n, w]);
    }
  try {
    app.canvas.draw(true, true);
  } finally {
    proto.fillText = fillText;
    for (const [, w] of wrapped) delete w.drawWidget;
  }
  for (const [n, w] of wrapped) {
    const name = label(w), texts = drawn.get(w);
    if (!name || texts.includes(name)) continue;
    const prefix = texts.find((t) => t.length > 0 && t.length < name.length && name.startsWith(t));
    if (prefix !== undefined) out.push(`${n.type} ${n.id}: ${name} drawn as '${prefix}…'`);
  }
  return out;
}"""


def overlaps(boxes: list[dict], slack: float = 1.0) -> list[str]:
    """Pairs of node boxes that overlap by more than ``slack`` px each way, in words."""
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            (l1, t1, r1, b1), (l2, t2, r2, b2) = a["box"], b["box"]
            if min(r1, r2) - max(l1, l2) > slack and min(b1, b2) - max(t1, t2) > slack:
                out.append(f"{a['type']} {a['id']} {fmt_box(a['box'])} overlaps {b['type']} {b['id']} {fmt_box(b['box'])}")
    return out


def covered(boxes: list[dict], mask: list[str], step: int = MASK_STEP) -> list[str]:
    """Nodes with a sampled point of their box where the frontend draws something over the canvas (or off screen)."""
    out = []
    rows, cols = len(mask), len(mask[0]) if mask else 0
    for b in boxes:
        left, top, right, bottom = b["box"]
        bad = []
        for i in range(rows):
            y = step / 2 + i * step
            if not top <= y <= bottom:
                continue
            for j in range(cols):
                x = step / 2 + j * step
                if left <= x <= right and mask[i][j] != ".":
                    bad.append((x, y))
        if left < 0 or top < 0 or right > cols * step or bottom > rows * step:
            bad.append(("off screen",))
        if bad:
            out.append(f"{b['type']} {b['id']} {fmt_box(b['box'])}: {len(bad)} points under the frontend's bars or off "
                       f"screen (first {bad[0]})")
    if out and getattr(mask, "covers", None):
        out.append("what covers the canvas: " + "; ".join(mask.covers))
    return out


def fmt_box(box) -> str:
    return "[" + ", ".join(f"{v:.0f}" for v in box) + "]"


#: JS: resolves once nothing under ``selector`` changed for ``quiet`` ms (at most ``limit`` ms): the panel redraws
#: a debounced moment after each event and after the routes it reads answer.
JS_WAIT_QUIET = """([selector, quiet, limit]) => new Promise((resolve) => {
  const root = document.querySelector(selector);
  if (!root) return resolve(false);
  let last = performance.now();
  const obs = new MutationObserver(() => { last = performance.now(); });
  obs.observe(root, { subtree: true, childList: true, attributes: true, characterData: true });
  const t0 = performance.now();
  const tick = () => {
    const now = performance.now();
    if (now - last >= quiet || now - t0 >= limit) { obs.disconnect(); resolve(now - last >= quiet); }
    else setTimeout(tick, 50);
  };
  tick();
})"""
