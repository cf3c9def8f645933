// comfy-h3 web extension: DOM rendering of the node readout, the timeline panel and the cluster status.
//
// No ComfyUI import and no side effects at load time (ComfyUI also loads it as an extension script on its own):
// every function takes the document it draws into. The glue (h3_extension.js) decides when to call them.

import { fmtPercent, fmtSeconds, requestSummary, shortId, stageLabel, workerText } from "./h3_view.js";
import { waterfall } from "./h3_timeline.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const STYLE_ID = "comfy-h3-styles";

export const CSS = `
.h3-readout { font: 11px/1.35 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; color: var(--input-text, #ddd);
  padding: 2px 4px; box-sizing: border-box; overflow: hidden; pointer-events: auto; user-select: text; }
.h3-readout .h3-line { white-space: normal; overflow: hidden; }
.h3-readout .h3-line > span:not(.h3-sep) { white-space: nowrap; display: inline-block; }
.h3-readout .h3-line + .h3-line { font-size: 10px; opacity: .75; }
.h3-readout .h3-sep { opacity: .5; }
.h3-readout.h3-state-stale, .h3-readout.h3-state-cached { opacity: .6; }
.h3-readout .h3-running, .h3-readout.h3-live .h3-steps { color: #7fb8ff; }
.h3-readout .h3-muted { opacity: .5; }
.h3-readout .h3-error { color: #ff6b6b; }
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
.h3-hover { font: 11px/1.35 ui-monospace, monospace; white-space: pre-wrap; min-height: 1.4em; opacity: .85; }
.h3-request { border-top: 1px solid var(--border-color, #444); padding-top: 4px; }
.h3-req-head { font-size: 11px; overflow-wrap: anywhere; }
.h3-req-head .h3-req-id { font-weight: 600; }
.h3-empty { opacity: .6; font-style: italic; }
svg.h3-wf { display: block; width: 100%; height: auto; overflow: visible; }
svg.h3-wf .h3-lane-bg { fill: rgba(127, 127, 127, .08); }
svg.h3-wf .h3-lane-label { fill: currentColor; font: 11px system-ui, sans-serif; dominant-baseline: middle; }
svg.h3-wf .h3-gap { fill: url(#h3-hatch); stroke: rgba(160, 160, 160, .35); stroke-dasharray: 2 2; }
svg.h3-wf .h3-bar-rect { stroke: rgba(0, 0, 0, .35); stroke-width: .5; }
svg.h3-wf .h3-stage-encode .h3-bar-rect { fill: #4e9af1; }
svg.h3-wf .h3-stage-a_to_b .h3-bar-rect, svg.h3-wf .h3-stage-b_to_a .h3-bar-rect { fill: #f0a030; }
svg.h3-wf .h3-stage-denoise .h3-bar-rect { fill: #8e6cf0; }
svg.h3-wf .h3-stage-decode .h3-bar-rect { fill: #3cb371; }
svg.h3-wf .h3-stage-save .h3-bar-rect { fill: #2e8b57; }
svg.h3-wf .h3-stage-load .h3-bar-rect, svg.h3-wf .h3-stage-connect .h3-bar-rect { fill: #888; }
svg.h3-wf .h3-live .h3-bar-rect { fill-opacity: .55; stroke-dasharray: 3 2; }
svg.h3-wf .h3-bar.h3-slow .h3-bar-rect { stroke: #ff3b30; stroke-width: 1.5; }
svg.h3-wf .h3-seg-wait { fill: rgba(255, 255, 255, .35); }
svg.h3-wf .h3-seg-fetch { fill: #f07b30; }
svg.h3-wf .h3-seg-materialize { fill: #ffd36b; }
svg.h3-wf .h3-seg-validate { fill: #c9a0ff; }
svg.h3-wf .h3-tick { stroke: rgba(255, 255, 255, .8); stroke-width: 1; }
svg.h3-wf .h3-bar:hover .h3-bar-rect { stroke: #fff; stroke-width: 1; }
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

/** SVG of a waterfall() geometry; every bar and gap carries a <title> (hover shows the numbers). */
export function renderWaterfall(doc, geom, { onHover } = {}) {
  const root = svg(doc, "svg", { class: "h3-wf", width: geom.width, height: geom.height,
                                 viewBox: `0 0 ${geom.width} ${geom.height}` });
  if (geom.request_id) root.dataset.requestId = geom.request_id;
  root.dataset.totalS = String(geom.total_s);
  root.dataset.minBarWidth = String(geom.minBarWidth);
  const defs = svg(doc, "defs");
  const pat = svg(doc, "pattern", { id: "h3-hatch", width: 4, height: 4, patternUnits: "userSpaceOnUse",
                                    patternTransform: "rotate(45)" });
  pat.appendChild(svg(doc, "rect", { width: 4, height: 4, fill: "rgba(160,160,160,0.06)" }));
  pat.appendChild(svg(doc, "line", { x1: 0, y1: 0, x2: 0, y2: 4, stroke: "rgba(160,160,160,0.35)", "stroke-width": 1 }));
  defs.appendChild(pat);
  root.appendChild(defs);

  const hover = (text) => (onHover ? () => onHover(text) : null);
  for (const lane of geom.lanes) {
    root.appendChild(svg(doc, "rect", { class: "h3-lane-bg", x: geom.plot.x0, y: lane.y, width: geom.plot.w,
                                        height: lane.h }));
    const label = svg(doc, "text", { class: "h3-lane-label", x: 4, y: lane.y + lane.h / 2 });
    label.textContent = lane.id;
    root.appendChild(label);
  }
  const gaps = svg(doc, "g", { class: "h3-gaps" });
  for (const g of geom.gaps) {
    const r = svg(doc, "rect", { class: "h3-gap", x: g.x, y: g.y + 2, width: g.w, height: g.h - 4 });
    r.dataset.lane = g.lane;
    r.dataset.durS = String(g.dur_s);
    const t = svg(doc, "title");
    t.textContent = g.title;
    r.appendChild(t);
    const h = hover(g.title);
    if (h) r.addEventListener("mouseenter", h);
    gaps.appendChild(r);
  }
  root.appendChild(gaps);

  const bars = svg(doc, "g", { class: "h3-bars" });
  for (const b of geom.bars) {
    const g = svg(doc, "g", { class: `${b.cls}${b.slow ? " h3-slow" : ""}` });
    g.dataset.stage = b.stage;
    g.dataset.lane = b.lane;
    g.dataset.start = String(b.start);
    g.dataset.end = String(b.end);
    g.dataset.durS = String(b.dur_s);
    const t = svg(doc, "title");
    t.textContent = b.title;
    g.appendChild(t);
    g.appendChild(svg(doc, "rect", { class: "h3-bar-rect", x: b.x, y: b.y, width: b.w, height: b.h, rx: 1.5 }));
    for (const s of b.segments) {
      const r = svg(doc, "rect", { class: `h3-seg h3-seg-${s.kind}`, x: s.x, y: b.y + b.h * 0.55, width: s.w,
                                   height: b.h * 0.45 });
      r.dataset.kind = s.kind;
      r.dataset.seconds = String(s.seconds);
      g.appendChild(r);
    }
    for (const k of b.ticks) {
      const line = svg(doc, "line", { class: "h3-tick", x1: k.x, x2: k.x, y1: b.y + 2, y2: b.y + b.h - 2 });
      line.dataset.step = String(k.step);
      line.dataset.seconds = String(k.seconds);
      g.appendChild(line);
    }
    if (b.w > 48) {
      const label = svg(doc, "text", { class: "h3-bar-label", x: b.x + 3, y: b.y + b.h / 2, fill: "#fff",
                                       "font-size": 10, "dominant-baseline": "middle", "pointer-events": "none" });
      label.textContent = `${b.label} ${fmtSeconds(b.dur_s)}`;
      g.appendChild(label);
    }
    const h = hover(b.title);
    if (h) g.addEventListener("mouseenter", h);
    bars.appendChild(g);
  }
  root.appendChild(bars);

  const axis = svg(doc, "g", { class: "h3-axis" });
  const ay = geom.axisY;
  axis.appendChild(svg(doc, "line", { x1: geom.plot.x0, x2: geom.plot.x1, y1: ay, y2: ay }));
  for (const a of geom.axis) {
    axis.appendChild(svg(doc, "line", { x1: a.x, x2: a.x, y1: ay, y2: ay + 3 }));
    const text = svg(doc, "text", { x: a.x, y: ay + 12, "text-anchor": a.t === 0 ? "start" : "middle" });
    text.textContent = a.label;
    axis.appendChild(text);
  }
  root.appendChild(axis);
  return root;
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
    const row = el(doc, "div", "h3-role");
    row.dataset.role = r.role;
    const bits = [r.ip ?? "?"];
    if (r.node_id) bits.push(shortId(r.node_id, 8));
    if (r.device) bits.push([r.device, r.dtype, r.attention_backend].filter(Boolean).join(" "));
    if (r.role === "B" && r.partition) bits.push(`partition ${r.partition}`);
    if (r.busy !== null && r.busy !== undefined) bits.push(r.busy ? "busy" : "idle");
    if (r.uptime_s !== null) bits.push(`up ${fmtSeconds(r.uptime_s)}`);
    if (r.memory) bits.push(r.memory);
    const health = r.healthy === null ? "?" : r.healthy ? "ok" : "unhealthy";
    row.appendChild(el(doc, "b", "", `${r.role} `));
    row.appendChild(el(doc, "span", r.healthy ? "h3-ok" : "h3-mismatch", `${health} `));
    row.appendChild(el(doc, "span", "h3-role-ip", bits.join(" · ")));
    row.title = JSON.stringify(r, null, 1);
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
  for (const a of m.actors) {
    const row = el(doc, "div", a.error ? "h3-actor h3-mismatch" : "h3-actor",
                   `actor ${a.name}${a.namespace ? ` (${a.namespace})` : ""}${a.partition ? ` · ${a.partition}` : ""}` +
                   `${a.error ? ` · ${a.error}` : ""}`);
    kids.push(row);
  }
  root.replaceChildren(...kids);
}

// ------------------------------------------------------------------------------------------------ panel

/**
 * The timeline panel: header with buttons, cluster status, hover line and one waterfall per request.
 * `handlers`: {refresh(), exportJSON(), exportCSV()} (each may return a promise).
 */
export class TimelinePanel {
  constructor(doc, handlers = {}) {
    this.doc = doc;
    this.handlers = handlers;
    this._cache = new Map(); // request id -> {key, node}
    this._width = 0;
    const root = el(doc, "div", "h3-panel");
    root.dataset.h3 = "panel";
    const head = el(doc, "div", "h3-panel-head");
    head.appendChild(el(doc, "span", "h3-title", "H3 timings"));
    for (const [name, label, title] of [["refresh", "Refresh", "Re-read /h3/status and /h3/timings"],
                                        ["exportJSON", "JSON", "Export /h3/timings as JSON"],
                                        ["exportCSV", "CSV", "Export /h3/timings as CSV"]]) {
      const b = el(doc, "button", `h3-btn h3-btn-${name}`, label);
      b.type = "button";
      b.title = title;
      b.dataset.action = name;
      b.addEventListener("click", () => this._run(name));
      head.appendChild(b);
    }
    this.message = el(doc, "div", "h3-message");
    this.status = el(doc, "div", "h3-status");
    this.hover = el(doc, "div", "h3-hover", "Hover a bar for its figures.");
    this.list = el(doc, "div", "h3-requests");
    root.append(head, this.message, this.status, this.hover, this.list);
    this.el = root;
    this.setMessage("");
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
    const w = Math.max(320, Math.round(width ?? (this.el.clientWidth ? this.el.clientWidth - 16 : 640)));
    if (Math.abs(w - this._width) > 16) {
      this._width = w;
      this._cache.clear();
    }
    const reqs = store.requestList();
    const nodes = [];
    const seen = new Set();
    for (const req of reqs) {
      seen.add(req.request_id);
      const key = `${req.version}|${req.state}|${warnShare}|${this._width}`;
      let entry = this._cache.get(req.request_id);
      if (!entry || entry.key !== key) {
        entry = { key, node: this._renderRequest(req, warnShare) };
        this._cache.set(req.request_id, entry);
      }
      nodes.push(entry.node);
    }
    for (const k of [...this._cache.keys()]) if (!seen.has(k)) this._cache.delete(k);
    if (!nodes.length) nodes.push(el(this.doc, "div", "h3-empty", "No H3 requests yet."));
    this.list.replaceChildren(...nodes);
  }

  _renderRequest(req, warnShare) {
    const doc = this.doc;
    const box = el(doc, "div", "h3-request");
    box.dataset.requestId = req.request_id;
    box.dataset.state = req.state;
    const s = requestSummary(req);
    const geom = waterfall(req, { width: this._width || 640 });
    const head = el(doc, "div", "h3-req-head");
    head.appendChild(el(doc, "span", "h3-req-id", `req ${shortId(req.request_id, 8)}`));
    const bits = []; // [text, cls]
    const total = Math.max(s.total_s ?? 0, geom.total_s ?? 0); // a running denoise extends the request
    if (total > 0) bits.push([`total ${fmtSeconds(total)}`, ""]);
    for (const stage of ["encode", "denoise", "decode"]) {
      if (s.stages[stage] !== undefined) bits.push([`${stage} ${fmtSeconds(s.stages[stage])}`, ""]);
    }
    if (s.steps && s.steps.count) bits.push([`${s.steps.count} steps`, ""]);
    const slow = [];
    for (const dir of ["a_to_b", "b_to_a"]) {
      const t = s.transfers[dir];
      if (!t) continue;
      const isSlow = t.share !== null && t.share > warnShare;
      if (isSlow) slow.push(dir);
      bits.push([`${stageLabel(dir)} ${fmtSeconds(t.receive_s)}${t.share !== null ? ` (${fmtPercent(t.share)})` : ""}` +
                 `${isSlow ? " ⚠" : ""}`, isSlow ? "h3-xfer h3-slow" : "h3-xfer"]);
    }
    if (req.state !== "done") bits.push([req.state, `h3-req-state h3-req-${req.state}`]);
    for (const [text, cls] of bits) {
      head.appendChild(el(doc, "span", "h3-sep", " · "));
      head.appendChild(el(doc, "span", cls, text));
    }
    head.title = `request ${req.request_id}${req.prompt_id ? `\nprompt ${req.prompt_id}` : ""}\n` +
      [...req.nodes.entries()].map(([id, t]) => `node ${id}: ${t}`).join("\n");
    box.dataset.slow = slow.join(" ");
    box.appendChild(head);
    for (const b of geom.bars) b.slow = slow.includes(b.stage);
    box.appendChild(renderWaterfall(doc, geom, { onHover: (text) => { this.hover.textContent = text; } }));
    return box;
  }
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
