// comfy-h3 web extension: DOM rendering of the node readout, the timeline panel and the cluster status.
//
// No ComfyUI import and no side effects at load time (ComfyUI also loads it as an extension script on its own):
// every function takes the document it draws into. The glue (h3_extension.js) decides when to call them.

import { batchText } from "./h3_readout.js";
import { queueText, roleText, workerText } from "./h3_status.js";
import { LEGEND, requestSummary, waterfall } from "./h3_timeline.js";
import { fmtPercent, fmtSeconds, shortId, stageLabel } from "./h3_view.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const STYLE_ID = "comfy-h3-styles";

export const CSS = `
.h3-readout { font: 11px/14px system-ui, -apple-system, "Segoe UI", sans-serif; font-variant-numeric: tabular-nums;
  color: var(--input-text, #ddd); padding: 3px 4px; box-sizing: border-box; overflow: hidden; pointer-events: auto;
  user-select: text; width: 100%; }
.h3-readout .h3-line { white-space: normal; overflow-wrap: anywhere; word-break: normal; }
.h3-readout .h3-line > span { white-space: normal; }
.h3-readout .h3-line + .h3-line { opacity: .8; }
.h3-readout .h3-sep { opacity: .5; }
.h3-readout.h3-state-stale, .h3-readout.h3-state-cached { opacity: .6; }
.h3-readout .h3-running, .h3-readout.h3-live .h3-steps { color: #7fb8ff; }
.h3-readout .h3-muted { opacity: .5; }
.h3-readout .h3-error { color: #ff6b6b; }
.h3-readout .h3-b-share { color: #b9a4ff; }
.h3-slow { color: #ffb347 !important; font-weight: 600; background: rgba(255, 140, 66, .16); border-radius: 3px; }
.h3-panel { font: 12px/1.4 system-ui, sans-serif; color: var(--fg-color, #ddd); padding: 6px; box-sizing: border-box;
  display: flex; flex-direction: column; gap: 6px; min-width: 0; }
.h3-panel button { font: inherit; color: inherit; background: var(--comfy-input-bg, #333); cursor: pointer;
  border: 1px solid var(--border-color, #555); border-radius: 4px; padding: 1px 8px; }
.h3-panel-head { display: flex; align-items: center; gap: 6px; flex-wrap: wrap; }
.h3-panel-head .h3-title { font-weight: 600; margin-right: auto; }
.h3-message { font-size: 11px; opacity: .8; }
.h3-status { border: 1px solid var(--border-color, #444); border-radius: 4px; padding: 4px 6px; font-size: 11px; }
.h3-status .h3-role { overflow-wrap: anywhere; }
.h3-status .h3-versions { opacity: .7; }
.h3-warn { background: rgba(220, 60, 40, .22); border: 1px solid #d9534f; color: #ffb3a7; border-radius: 4px;
  padding: 4px 6px; font-weight: 600; }
.h3-warn .h3-warn-detail { font-weight: 400; display: block; word-break: break-word; }
.h3-mismatch { color: #ffb347; }
.h3-ok { color: #6fcf6f; }
.h3-details { font: 11px/14px ui-monospace, monospace; white-space: pre-wrap; height: 84px; overflow: auto;
  opacity: .85; border: 1px dashed var(--border-color, #444); border-radius: 4px; padding: 2px 4px; contain: strict; }
.h3-legend { display: flex; flex-wrap: wrap; gap: 2px 10px; font-size: 10.5px; opacity: .9; }
.h3-legend .h3-key { display: inline-flex; align-items: center; gap: 4px; }
.h3-legend svg.h3-wf.h3-swatch { flex: none; width: 18px; height: 10px; display: inline-block; }
.h3-request { border-top: 1px solid var(--border-color, #444); padding-top: 4px; }
.h3-req-head { font-size: 11px; overflow-wrap: anywhere; }
.h3-req-head .h3-req-name { font-weight: 600; }
.h3-req-head .h3-req-id { opacity: .75; }
.h3-req-sum { font-size: 10.5px; opacity: .8; overflow-wrap: anywhere; }
.h3-empty { opacity: .6; font-style: italic; }
svg.h3-wf { display: block; width: 100%; height: auto; overflow: visible; }
svg.h3-wf .h3-lane-bg { fill: rgba(127, 127, 127, .08); }
svg.h3-wf .h3-lane-label { fill: currentColor; font: 11px system-ui, sans-serif; dominant-baseline: middle; }
svg.h3-wf .h3-gap { fill: url(#h3-hatch); stroke: rgba(160, 160, 160, .35); stroke-dasharray: 2 2; }
svg.h3-wf .h3-bar-rect { stroke: rgba(0, 0, 0, .35); stroke-width: .5; }
svg.h3-wf .h3-stage-encode .h3-bar-rect { fill: #4e9af1; }
svg.h3-wf .h3-stage-a_to_b .h3-bar-rect, svg.h3-wf .h3-stage-b_to_a .h3-bar-rect { fill: #f0a030; }
svg.h3-wf .h3-stage-denoise .h3-bar-rect { fill: #8e6cf0; }
svg.h3-wf .h3-stage-sampling .h3-bar-rect { fill: #8e6cf0; }
svg.h3-wf .h3-stage-decode .h3-bar-rect { fill: #3cb371; }
svg.h3-wf .h3-stage-save .h3-bar-rect { fill: #2e8b57; }
svg.h3-wf .h3-stage-load .h3-bar-rect, svg.h3-wf .h3-stage-connect .h3-bar-rect { fill: #888; }
svg.h3-wf .h3-ctx .h3-bar-rect, svg .h3-ctx-key { fill: rgba(150, 150, 150, .45); stroke: #aaa; stroke-dasharray: 3 2; }
svg.h3-wf .h3-gap-label, svg.h3-wf .h3-bar-label { fill: currentColor; font: 10px system-ui, sans-serif;
  dominant-baseline: middle; pointer-events: none; }
svg.h3-wf .h3-bar-label { fill: #fff; font-size: 9.5px; paint-order: stroke; stroke: rgba(0, 0, 0, .45); stroke-width: 2px; }
svg.h3-wf .h3-gaps .h3-gap-label { font-style: italic; opacity: .75; }
svg.h3-wf .h3-live .h3-bar-rect { fill-opacity: .55; stroke-dasharray: 3 2; }
svg.h3-wf .h3-bar.h3-slow .h3-bar-rect { stroke: #ff3b30; stroke-width: 1.5; }
svg.h3-wf .h3-seg-wait { fill: rgba(255, 255, 255, .35); }
svg.h3-wf .h3-seg-fetch { fill: #f07b30; }
svg.h3-wf .h3-seg-materialize { fill: #ffd36b; }
svg.h3-wf .h3-seg-validate { fill: #c9a0ff; }
svg.h3-wf .h3-tick { stroke: rgba(255, 255, 255, .8); stroke-width: 1; }
svg.h3-wf .h3-bar:hover .h3-bar-rect, svg.h3-wf .h3-ctx:hover .h3-bar-rect { stroke: #fff; stroke-width: 1; }
svg.h3-wf .h3-axis line { stroke: rgba(160, 160, 160, .6); }
svg.h3-wf .h3-axis text { fill: currentColor; opacity: .7; font: 9px system-ui, sans-serif; }
.h3-float-btn { position: fixed; right: 12px; bottom: 12px; z-index: 1000; font: 600 12px system-ui, sans-serif;
  padding: 4px 10px; border-radius: 14px; border: 1px solid #666; background: #2b2b2b; color: #ddd; cursor: pointer; }
.h3-float { position: fixed; right: 12px; bottom: 44px; z-index: 1000; width: min(720px, 90vw); max-height: 70vh;
  overflow: auto; background: var(--comfy-menu-bg, #1e1e1e); border: 1px solid #555; border-radius: 6px;
  box-shadow: 0 6px 24px rgba(0, 0, 0, .5); }
`;

/** Adds the pack's stylesheet to the document once. */
export function ensureStyles(doc) {
  if (!doc || doc.getElementById(STYLE_ID)) return;
  const style = doc.createElement("style");
  style.id = STYLE_ID;
  style.textContent = CSS;
  (doc.head ?? doc.documentElement).appendChild(style);
}

function el(doc, tag, cls, text) {
  const e = doc.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}

function svg(doc, tag, attrs = {}) {
  const e = doc.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) e.setAttribute(k, typeof v === "number" ? String(Math.round(v * 100) / 100) : v);
  }
  return e;
}

// ------------------------------------------------------------------------------------------------ node readout

export function createReadoutElement(doc) {
  const root = el(doc, "div", "h3-readout h3-state-idle");
  root.dataset.h3 = "readout";
  return root;
}

/** Draws a readoutModel() into the element made by createReadoutElement(). */
export function renderReadout(root, model) {
  const doc = root.ownerDocument;
  root.className = model.classes.join(" ");
  root.title = model.title;
  root.dataset.state = model.state;
  root.dataset.slow = model.slow.join(" ");
  const lines = model.lines.map((parts, i) => {
    const line = el(doc, "div", `h3-line h3-line-${i}`);
    parts.forEach((p, k) => {
      if (k) line.appendChild(el(doc, "span", "h3-sep", " · "));
      const span = el(doc, "span", p.cls ?? "", p.text);
      if (p.key) span.dataset.key = p.key;
      if (p.title) span.title = p.title;
      line.appendChild(span);
    });
    return line;
  });
  root.replaceChildren(...lines);
}

// ------------------------------------------------------------------------------------------------ waterfall

function hatch(doc) {
  const defs = svg(doc, "defs");
  const pat = svg(doc, "pattern", { id: "h3-hatch", width: 4, height: 4, patternUnits: "userSpaceOnUse",
                                    patternTransform: "rotate(45)" });
  pat.appendChild(svg(doc, "rect", { width: 4, height: 4, fill: "rgba(160,160,160,0.06)" }));
  pat.appendChild(svg(doc, "line", { x1: 0, y1: 0, x2: 0, y2: 4, stroke: "rgba(160,160,160,0.35)", "stroke-width": 1 }));
  defs.appendChild(pat);
  return defs;
}

function titled(doc, node, text) {
  const t = svg(doc, "title");
  t.textContent = text;
  node.appendChild(t);
  node.dataset.details = text; // what the details box shows on hover (no tooltip wait)
  return node;
}

function label(doc, cls, x, y, text) {
  const t = svg(doc, "text", { class: cls, x, y });
  t.textContent = text;
  return t;
}

/** SVG of a waterfall() geometry: every bar, context bar and gap carries its figures as a <title> and as
 * `data-details`, and its label when it fits. */
export function renderWaterfall(doc, geom) {
  const root = svg(doc, "svg", { class: "h3-wf", width: geom.width, height: geom.height,
                                 viewBox: `0 0 ${geom.width} ${geom.height}` });
  if (geom.request_id) root.dataset.requestId = geom.request_id;
  root.dataset.totalS = String(geom.total_s);
  root.dataset.minBarWidth = String(geom.minBarWidth);
  root.appendChild(hatch(doc));
  for (const lane of geom.lanes) {
    root.appendChild(svg(doc, "rect", { class: "h3-lane-bg", x: geom.plot.x0, y: lane.y, width: geom.plot.w,
                                        height: lane.h }));
    root.appendChild(label(doc, "h3-lane-label", 4, lane.y + lane.h / 2, lane.id));
  }
  const gaps = svg(doc, "g", { class: "h3-gaps" });
  for (const g of geom.gaps) {
    const r = svg(doc, "rect", { class: "h3-gap", x: g.x, y: g.y + 2, width: g.w, height: g.h - 4 });
    r.dataset.lane = g.lane;
    r.dataset.durS = String(g.dur_s);
    gaps.appendChild(titled(doc, r, g.title));
    if (g.text) {
      const t = label(doc, "h3-gap-label", g.x + 3, g.y + g.h / 2, g.text);
      t.dataset.lane = g.lane;
      gaps.appendChild(t);
    }
  }
  root.appendChild(gaps);

  const ctx = svg(doc, "g", { class: "h3-context" });
  for (const c of geom.context) {
    const g = svg(doc, "g", { class: `h3-ctx h3-ctx-${c.stage}` });
    g.dataset.stage = c.stage;
    g.dataset.lane = c.lane;
    g.dataset.durS = String(c.dur_s);
    titled(doc, g, c.title);
    g.appendChild(svg(doc, "rect", { class: "h3-bar-rect", x: c.x, y: c.y + 1, width: c.w, height: c.h - 2, rx: 1.5 }));
    if (c.text) g.appendChild(label(doc, "h3-gap-label", c.x + 3, c.y + c.h / 2, c.text));
    ctx.appendChild(g);
  }
  root.appendChild(ctx);

  const bars = svg(doc, "g", { class: "h3-bars" });
  for (const b of geom.bars) {
    const g = svg(doc, "g", { class: `${b.cls}${b.slow ? " h3-slow" : ""}` });
    g.dataset.stage = b.stage;
    g.dataset.lane = b.lane;
    g.dataset.start = String(b.start);
    g.dataset.end = String(b.end);
    g.dataset.durS = String(b.dur_s);
    titled(doc, g, b.title);
    g.appendChild(svg(doc, "rect", { class: "h3-bar-rect", x: b.x, y: b.y, width: b.w, height: b.h, rx: 1.5 }));
    for (const s of b.segments) {
      const r = svg(doc, "rect", { class: `h3-seg h3-seg-${s.kind}`, x: s.x, y: b.y + b.h * 0.55, width: s.w,
                                   height: b.h * 0.45 });
      r.dataset.kind = s.kind;
      r.dataset.seconds = String(s.seconds);
      g.appendChild(r);
    }
    if (b.ticks.length) {
      // one path for all forwards: a 50-step denoise is one element, not fifty
      // in the bar's lower third, so that its label above stays readable
      const d = b.ticks.map((k) => `M${Math.round(k.x * 100) / 100} ${b.y + b.h * 0.65}V${b.y + b.h - 1.5}`).join("");
      const path = svg(doc, "path", { class: "h3-tick", d });
      path.dataset.steps = String(b.ticks.length);
      path.dataset.seconds = b.ticks.map((k) => k.seconds).join(";");
      g.appendChild(path);
    }
    if (b.text) g.appendChild(label(doc, "h3-bar-label", b.x + 3, b.y + b.h / 2, b.text));
    bars.appendChild(g);
  }
  root.appendChild(bars);

  const axis = svg(doc, "g", { class: "h3-axis" });
  const ay = geom.axisY;
  axis.appendChild(svg(doc, "line", { x1: geom.plot.x0, x2: geom.plot.x1, y1: ay, y2: ay }));
  for (const a of geom.axis) {
    axis.appendChild(svg(doc, "line", { x1: a.x, x2: a.x, y1: ay, y2: ay + 3 }));
    if (!a.label) continue;
    const text = svg(doc, "text", { x: a.x, y: ay + 12, "text-anchor": a.anchor });
    text.textContent = a.label;
    axis.appendChild(text);
  }
  root.appendChild(axis);
  return root;
}

/** The legend: what each colour, pattern and outline of the waterfall means (LEGEND of h3_timeline.js). */
export function renderLegend(doc) {
  const box = el(doc, "div", "h3-legend");
  box.dataset.h3 = "legend";
  for (const item of LEGEND) {
    const key = el(doc, "span", "h3-key");
    key.dataset.key = item.key;
    const sw = svg(doc, "svg", { class: "h3-wf h3-swatch", width: 18, height: 10, viewBox: "0 0 18 10" });
    if (item.kind === "bar") {
      const g = svg(doc, "g", { class: item.key === "context" ? "h3-ctx" : `h3-bar ${item.cls}` });
      g.appendChild(svg(doc, "rect", { class: "h3-bar-rect", x: 0.5, y: 0.5, width: 17, height: 9, rx: 1.5 }));
      sw.appendChild(g);
    } else if (item.kind === "seg") {
      sw.appendChild(svg(doc, "rect", { class: `h3-seg ${item.cls}`, x: 0.5, y: 0.5, width: 17, height: 9 }));
    } else if (item.key === "gap") {
      sw.appendChild(hatch(doc));
      sw.appendChild(svg(doc, "rect", { class: "h3-gap", x: 0.5, y: 0.5, width: 17, height: 9 }));
    } else if (item.key === "tick") {
      const g = svg(doc, "g", { class: "h3-bar h3-stage-denoise" });
      g.appendChild(svg(doc, "rect", { class: "h3-bar-rect", x: 0.5, y: 0.5, width: 17, height: 9, rx: 1.5 }));
      g.appendChild(svg(doc, "path", { class: "h3-tick", d: "M6 2V8M12 2V8" }));
      sw.appendChild(g);
    } else {
      const g = svg(doc, "g", { class: `h3-bar h3-stage-denoise ${item.cls}` });
      g.appendChild(svg(doc, "rect", { class: "h3-bar-rect", x: 0.5, y: 0.5, width: 17, height: 9, rx: 1.5 }));
      sw.appendChild(g);
    }
    key.append(sw, el(doc, "span", "", item.label));
    box.appendChild(key);
  }
  return box;
}

// ------------------------------------------------------------------------------------------------ status

/** Fills `root` with a statusModel(). */
export function renderStatus(root, m) {
  const doc = root.ownerDocument;
  const kids = [];
  root.dataset.ok = m.ok ? "true" : "false";
  if (m.warning) {
    const w = el(doc, "div", "h3-warn");
    w.appendChild(el(doc, "span", "h3-warn-title", `⚠ ${m.warning}`));
    if (m.detail) w.appendChild(el(doc, "span", "h3-warn-detail", m.detail));
    kids.push(w);
  }
  const head = el(doc, "div", "h3-cluster");
  head.appendChild(el(doc, "span", m.ok ? "h3-ok" : "", m.ok ? "● " : "○ "));
  head.appendChild(el(doc, "span", "", `cluster: ${m.cluster || "–"}`));
  kids.push(head);
  for (const r of m.roles) {
    const t = roleText(r);
    const row = el(doc, "div", "h3-role");
    row.dataset.role = r.role;
    row.dataset.state = t.state;
    row.appendChild(el(doc, "b", "", `${r.role} `));
    row.appendChild(el(doc, "span", t.cls, `${t.state} `));
    row.appendChild(el(doc, "span", "h3-role-ip", t.text));
    row.title = t.title;
    kids.push(row);
    const vers = Object.entries(r.versions || {}).map(([k, v]) => `${k} ${v}`).join(" · ");
    if (vers) {
      const vrow = el(doc, "div", "h3-versions", `   ${vers}`);
      vrow.dataset.role = r.role;
      kids.push(vrow);
    }
  }
  for (const mm of m.mismatches) {
    kids.push(el(doc, "div", "h3-mismatch", `version mismatch: ${mm.name} A ${mm.A} / B ${mm.B}`));
  }
  if (m.nodes.length) {
    const n = el(doc, "div", "h3-nodes", `nodes: ${m.nodes.join("; ")}`);
    kids.push(n);
  }
  for (const w of m.workers || []) {
    const row = el(doc, "div", "h3-worker", `worker ${workerText(w)}`);
    row.dataset.worker = w.name;
    kids.push(row);
  }
  if (m.aRank && !(m.workers || []).some((w) => w.machine === "A")) { // else it is one of the worker rows
    const row = el(doc, "div", m.aRank.error ? "h3-worker h3-mismatch" : "h3-worker",
                   `A's DiT rank ${workerText(m.aRank)}${m.aRank.error ? ` · ${m.aRank.error}` : ""}`);
    row.dataset.worker = "a_rank";
    kids.push(row);
  }
  const waiting = queueText(m.queue);
  if (waiting) {
    const row = el(doc, "div", "h3-queue", waiting);
    row.dataset.waiting = String(m.queue.length);
    kids.push(row);
  }
  for (const a of m.actors) {
    const row = el(doc, "div", a.error ? "h3-actor h3-mismatch" : "h3-actor",
                   `actor ${a.name}${a.namespace ? ` (${a.namespace})` : ""}${a.partition ? ` · ${a.partition}` : ""}` +
                   `${a.error ? ` · ${a.error}` : ""}`);
    kids.push(row);
  }
  root.replaceChildren(...kids);
}

// ------------------------------------------------------------------------------------------------ panel

const DETAILS_HINT = "Point at a bar for its figures (every bar's label and the totals above read without it).";

/**
 * The timeline panel: header with buttons, cluster status, legend, a details box (fixed height: what the pointer is
 * on; pointing never moves the rows) and one waterfall per request, each headed by its workflow, its place in a
 * batch, its request id and its wall time split into parts that add up to it.
 * `handlers`: {refresh(), exportJSON(), exportCSV(), releaseB()} (each may return a promise).
 */
export class TimelinePanel {
  constructor(doc, handlers = {}) {
    this.doc = doc;
    this.handlers = handlers;
    this._cache = new Map(); // request id -> {key, node}
    this._width = 0;
    this._detailsText = "";
    this._detailsFrame = null;
    const root = el(doc, "div", "h3-panel");
    root.dataset.h3 = "panel";
    const head = el(doc, "div", "h3-panel-head");
    head.appendChild(el(doc, "span", "h3-title", "H3 timings"));
    for (const [name, text, title] of [["refresh", "Refresh", "Re-read /h3/status and /h3/timings"],
                                       ["exportJSON", "JSON", "Export /h3/timings as JSON"],
                                       ["exportCSV", "CSV", "Export /h3/timings as CSV"],
                                       ["releaseB", "Release B's model", "B's DiT workers drop their weights and keep " +
                                        "their actors; the next run reloads them. ComfyUI's Unload models frees A only."]]) {
      const b = el(doc, "button", `h3-btn h3-btn-${name}`, text);
      b.type = "button";
      b.title = title;
      b.dataset.action = name;
      b.addEventListener("click", () => this._run(name));
      head.appendChild(b);
    }
    this.message = el(doc, "div", "h3-message");
    this.status = el(doc, "div", "h3-status");
    this.legend = renderLegend(doc);
    this.details = el(doc, "div", "h3-details", DETAILS_HINT);
    this.hover = this.details; // the name older callers used
    this.list = el(doc, "div", "h3-requests");
    // one listener for every bar: the details box follows the pointer, at most once per frame
    this.list.addEventListener("pointerover", (e) => {
      const target = e.target?.closest?.("[data-details]");
      if (target) this._showDetails(target.dataset.details);
    });
    root.append(head, this.message, this.status, this.legend, this.details, this.list);
    this.el = root;
    this.setMessage("");
  }

  _showDetails(text) {
    if (!text || text === this._detailsText) return;
    this._detailsText = text;
    const win = this.doc.defaultView;
    if (this._detailsFrame !== null) return;
    const apply = () => {
      this._detailsFrame = null;
      if (this.details.textContent !== this._detailsText) this.details.textContent = this._detailsText;
    };
    this._detailsFrame = win?.requestAnimationFrame ? win.requestAnimationFrame(apply) : (apply(), null);
  }

  _run(name) {
    try {
      const r = this.handlers[name]?.();
      if (r && typeof r.then === "function") {
        r.catch((e) => this.setMessage(`${name} failed: ${e?.message ?? e}`));
      }
    } catch (e) {
      this.setMessage(`${name} failed: ${e?.message ?? e}`);
    }
  }

  setMessage(text) {
    this.message.textContent = text || "";
    this.message.hidden = !text;
  }

  setStatus(model) {
    renderStatus(this.status, model);
  }

  /** Redraws the request list from an H3Store; unchanged requests keep their SVG. */
  setRequests(store, { warnShare = 0.1, width = null } = {}) {
    const measured = this.list.clientWidth || (this.el.clientWidth ? this.el.clientWidth - 12 : 0);
    const w = Math.max(280, Math.round(width ?? (measured || 640)));
    if (Math.abs(w - this._width) > 24) {
      this._width = w;
      this._cache.clear();
    }
    const reqs = store.requestList();
    const nodes = [];
    const seen = new Set();
    // a row also shows the records without a request inside it and what other requests ran meanwhile
    let records = 0;
    for (const r of reqs) records += r.records.length;
    const loadsKey = `${records}|${store.loads.length ? `${store.loads.length}:${store.loads[store.loads.length - 1].end}` : "0"}`;
    for (const req of reqs) {
      seen.add(req.request_id);
      const name = store.promptNames.get(req.run_prompt ?? req.prompt_id ?? "") ?? "";
      const key = `${req.version}|${req.state}|${warnShare}|${this._width}|${loadsKey}|${name}`;
      let entry = this._cache.get(req.request_id);
      if (!entry || entry.key !== key) {
        entry = { key, node: this._renderRequest(req, warnShare, store, name) };
        this._cache.set(req.request_id, entry);
      }
      nodes.push(entry.node);
    }
    for (const k of [...this._cache.keys()]) if (!seen.has(k)) this._cache.delete(k);
    if (!nodes.length) nodes.push(el(this.doc, "div", "h3-empty", "No H3 requests yet."));
    const same = nodes.length === this.list.childNodes.length && nodes.every((n, i) => this.list.childNodes[i] === n);
    if (!same) this.list.replaceChildren(...nodes);
  }

  _renderRequest(req, warnShare, store, name) {
    const doc = this.doc;
    const box = el(doc, "div", "h3-request");
    box.dataset.requestId = req.request_id;
    box.dataset.state = req.state;
    const context = store?.loads ?? [];
    const s = requestSummary(req, { context });
    const others = [];
    for (const other of store?.requests?.values?.() ?? []) if (other !== req) others.push(...other.records);
    const geom = waterfall(req, { width: this._width || 640 }, { context, others });
    const head = el(doc, "div", "h3-req-head");
    const title = requestName(req, name, store);
    head.appendChild(el(doc, "span", "h3-req-name", title));
    const batch = batchText(req.batch);
    const bits = []; // [text, cls]
    if (batch) bits.push([batch, "h3-req-batch"]);
    bits.push([`req ${shortId(req.request_id, 8)}`, "h3-req-id"]);
    const total = Math.max(s.total_s ?? 0, geom.total_s ?? 0); // a running denoise extends the request
    if (total > 0) bits.push([`total ${fmtSeconds(total)}`, "h3-req-total"]);
    if (s.steps && s.steps.count) bits.push([`${s.steps.count} forwards`, ""]);
    const slow = [];
    for (const dir of ["a_to_b", "b_to_a"]) {
      const t = s.transfers[dir];
      if (!t) continue;
      const isSlow = t.share !== null && t.share > warnShare;
      if (isSlow) {
        slow.push(dir);
        bits.push([`${stageLabel(dir)} ${fmtSeconds(t.receive_s)} (${fmtPercent(t.share)}) ⚠`, "h3-xfer h3-slow"]);
      }
    }
    if (req.state !== "done") bits.push([req.state, `h3-req-state h3-req-${req.state}`]);
    for (const [text, cls] of bits) {
      head.appendChild(el(doc, "span", "h3-sep", " · "));
      head.appendChild(el(doc, "span", cls, text));
    }
    head.title = `request ${req.request_id}${req.run_prompt ?? req.prompt_id ? `\nprompt ${req.run_prompt ?? req.prompt_id}` : ""}\n` +
      [...req.nodes.entries()].map(([id, t]) => `node ${id}: ${t}`).join("\n");
    box.dataset.slow = slow.join(" ");
    box.appendChild(head);
    // the wall time in parts that add up to the total (overlaps counted once), readable without pointing
    if (s.breakdown.length && req.state === "done") {
      const sum = el(doc, "div", "h3-req-sum");
      sum.dataset.totalS = String(s.total_s);
      sum.textContent = `= ${s.breakdown.map((p) => `${p.label} ${fmtSeconds(p.seconds)}`).join(" + ")}`;
      for (const p of s.breakdown) sum.dataset[`part_${p.label.replace(/[^a-z0-9]+/gi, "_")}`] = String(p.seconds);
      box.appendChild(sum);
    }
    if (s.cached.length) {
      const c = el(doc, "div", "h3-req-sum h3-req-cached",
                   `cached from an earlier run: ${s.cached.map((x) => `${stageLabel(x.stage)} ${fmtSeconds(x.seconds)}`).join(", ")}`);
      box.appendChild(c);
    }
    for (const b of geom.bars) b.slow = slow.includes(b.stage);
    box.appendChild(renderWaterfall(doc, geom));
    return box;
  }
}

/** What a request's row is called: the workflow it was queued from, else the kind of run its encode reported. */
export function requestName(req, promptName = "", store = null) {
  // a re-run on the same encoded conditioning (`<id>.2`) has no encode of its own: its first run's kind is its kind
  const base = /^(.+?)\.\d+$/.exec(req?.request_id ?? "")?.[1];
  const workflow = req?.workflow ?? (base ? store?.request(base, { create: false })?.workflow : null) ?? null;
  if (promptName && workflow) return `${promptName} (${workflow})`;
  return promptName || workflow || "request";
}

// ------------------------------------------------------------------------------------------------ helpers

/** Saves `text` as a file through a temporary link. */
export function downloadText(doc, filename, text, mime = "text/plain") {
  const win = doc.defaultView;
  const blob = new win.Blob([text], { type: mime });
  const url = win.URL.createObjectURL(blob);
  const a = doc.createElement("a");
  a.href = url;
  a.download = filename;
  a.style.display = "none";
  doc.body.appendChild(a);
  a.click();
  a.remove();
  win.setTimeout(() => win.URL.revokeObjectURL(url), 10000);
}

/** Fallback when the frontend has no sidebar API: a small fixed button that shows/hides a floating panel. */
export function createFloatingPanel(doc, content) {
  const box = el(doc, "div", "h3-float");
  box.dataset.h3 = "floating";
  box.hidden = true;
  box.appendChild(content);
  const button = el(doc, "button", "h3-float-btn", "H3");
  button.type = "button";
  button.title = "H3 timings and cluster status";
  button.dataset.h3 = "toggle";
  button.addEventListener("click", () => {
    box.hidden = !box.hidden;
    if (!box.hidden) box.dispatchEvent(new doc.defaultView.CustomEvent("h3-open"));
  });
  doc.body.append(box, button);
  return { box, button };
}
