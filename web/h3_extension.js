// comfy-h3 web extension: the thin glue between ComfyUI's frontend and the view modules.
//
// - a readout DOM widget on every H3 node (works in the classic LiteGraph canvas and in Vue-node mode), updated
//   from the websocket events `h3.progress` (live) and `h3.timing` (final figures);
// - a timeline panel (sidebar tab when the frontend has the API, else a floating panel behind a small button):
//   one waterfall per request, cluster status from /h3/status, JSON/CSV export of /h3/timings. The frontend
//   (1.49) calls the tab's render(el) before `el` is in the page (attached right after), destroy() when the tab
//   closes and render() with a fresh `el` when it is reopened (its slot may also call render again with the same
//   `el`): one panel object lives for the whole session, is moved into whatever element render() hands over, and
//   is drawn whether or not that element is attached yet;
// - the `model_path` picker of every H3RemoteDiT node offers what machine B reported it has (`b_models` of the
//   node's h3.timing, `models.B` of /h3/status), the node's current value kept as it is;
// - "Run on machine B" in the context menu of every UNETLoader (root graph or subgraph, classic canvas or Vue nodes):
//   the node becomes an H3RemoteModel (h3_swap.js), in one undo step; the frontends' node-menu hook
//   (`getNodeMenuItems`, 1.49 and later, both UI modes read it) or, without it, the node's `getExtraMenuOptions`;
//   the same swap is `window.comfyH3.runOnMachineB(node)`;
// - every handler is wrapped: nothing here throws into the console (console.warn at most).
// The logic lives in h3_view.js, h3_timeline.js, h3_dom.js and h3_swap.js (no ComfyUI import there).

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { READOUT_LINE_PX, READOUT_PAD_PX, readoutHeight, readoutModel } from "./h3_readout.js";
import { statusModel } from "./h3_status.js";
import {
  B_MODEL_NODE_TYPE, bModelsFrom, DEFAULT_WARN_PERCENT, H3Store, isH3NodeType, MODEL_WIDGET, sameChoices,
} from "./h3_view.js";
import { clearBelow, isSwappable, SWAP_FROM_TYPE, SWAP_MENU_LABEL, swapToRemoteModel } from "./h3_swap.js";
import {
  createFloatingPanel, createReadoutElement, downloadText, ensureStyles, renderReadout, TimelinePanel,
} from "./h3_dom.js";

const EXTENSION = "comfy-h3.timing";
export const SETTING_WARN_PERCENT = "comfy-h3.TransferWarnPercent";
const SIDEBAR_ID = "comfy-h3-timeline";
const WIDGET_NAME = "h3_timing";
const STATUS_MIN_INTERVAL_MS = 3000;
const TIMINGS_MIN_INTERVAL_MS = 1000;
const HISTORY_ITEMS = 16; // prompts read from ComfyUI's history when the panel opens (each holds its whole workflow)

const store = new H3Store();
const readouts = new Map(); // graph node -> readout element
const reserved = new WeakMap(); // readout element -> the height it holds on its node (CSS px = canvas units)
const fittedText = new WeakMap(); // readout element -> the text it was last grown for
const READOUT_CHAR_PX = 6.4; // the readout's average character width (11 px system font), for a late readout's room
const READOUT_SIDE_PX = 8; // the readout's side padding and the node's inner margin
const panels = new Set(); // the sidebar panel and/or the floating one; made once, never dropped
let sidebarPanel = null; // reused across the frontend's render(el) calls
let sidebarContainer = null; // the element the frontend last handed to render()
const state = { status: null, statusError: null, reconnecting: false, bModels: null };

function warn(...args) {
  try {
    console.warn("[comfy-h3]", ...args);
  } catch {
    /* nothing left to do */
  }
}

/** Wraps a handler so that neither a throw nor a rejected promise reaches the console as an error. */
function safe(fn) {
  return function wrapped(...args) {
    try {
      const r = fn.apply(this, args);
      if (r && typeof r.then === "function") return r.catch((e) => warn(e));
      return r;
    } catch (e) {
      warn(e);
      return undefined;
    }
  };
}

function warnShare() {
  let v;
  try {
    v = app.extensionManager?.setting?.get?.(SETTING_WARN_PERCENT);
  } catch {
    v = undefined;
  }
  if (v === undefined || v === null) {
    try {
      v = app.ui?.settings?.getSettingValue?.(SETTING_WARN_PERCENT);
    } catch {
      v = undefined;
    }
  }
  const n = Number(v);
  return (v !== undefined && v !== null && v !== "" && Number.isFinite(n) && n >= 0 ? n : DEFAULT_WARN_PERCENT) / 100;
}

// ------------------------------------------------------------------------------------------------ node readouts

function nodeClass(node) {
  return node?.comfyClass ?? node?.constructor?.comfyClass ?? node?.type ?? null;
}

function renderNode(node, el) {
  const model = readoutModel(store, node.id, { warnShare: warnShare(), nodeType: readoutType(node) ?? nodeClass(node) });
  renderReadout(el, model);
  if (el.isConnected) fitReadout(node, el);
}

/**
 * The readout keeps the height its node type reserved when the node was made (the templates leave room for it), so
 * a run never grows the node over its neighbour. Text that still needs more room is never cut: the readout and its
 * node grow by the lines it lacks.
 */
function reserve(el, height) {
  reserved.set(el, height);
  el.style.height = `${height}px`;
  el.style.minHeight = `${height}px`;
  el.style.maxHeight = `${height}px`;
}

function fitReadout(node, el) {
  const have = reserved.get(el);
  if (!have || !el.clientHeight) return; // not laid out (collapsed node, hidden widget, zoomed out)
  const need = el.scrollHeight;
  if (need <= el.clientHeight + 1) return;
  // a core node's late readout, once per text: a node whose only widget is the readout (a core sampler) hands it all
  // its height in the classic canvas, so fitting again on the same text would grow it without end
  if (drivenB.has(node)) {
    if (fittedText.get(el) === el.textContent) return;
    fittedText.set(el, el.textContent);
  }
  const lines = Math.ceil((need - READOUT_PAD_PX) / READOUT_LINE_PX);
  reserve(el, lines * READOUT_LINE_PX + READOUT_PAD_PX);
  try {
    if (Array.isArray(node.size) && typeof node.computeSize === "function" && typeof node.setSize === "function") {
      const want = node.computeSize();
      node.setSize([Math.max(node.size[0], want[0]), Math.max(node.size[1], want[1])]);
    }
    app.canvas?.setDirty?.(true, true);
    roomBelow(node);
  } catch {
    /* sizing is cosmetic */
  }
}

/**
 * The height a core node's readout needs for the text it already has (a sampler's readout is made when its record
 * comes), wrapped at the node's width: the classic canvas of 1.49 does not grow a node for a widget added late.
 */
function wrappedHeight(node) {
  if (!drivenB.has(node)) return 0;
  const model = readoutModel(store, node.id, { warnShare: warnShare(), nodeType: readoutType(node) });
  const width = Math.max(80, (Number(node.size?.[0]) || 200) - 2 * READOUT_SIDE_PX);
  const lines = model.lines.reduce((n, parts) => {
    const chars = parts.reduce((c, p) => c + String(p.text ?? "").length + 1, 0);
    return n + Math.max(1, Math.ceil((chars * READOUT_CHAR_PX) / width));
  }, 0);
  return readoutHeight(null, lines);
}

/**
 * A readout made after the node was laid out grows the node: the nodes below it in its column move down by what it
 * now covers (as the swap does), so a late readout never lies over its neighbour.
 */
function roomBelow(node) {
  if (!drivenB.has(node)) return;
  const canvas = app.canvas;
  let bottom = node.pos[1] + node.size[1];
  const r = document.querySelector(`[data-node-id="${node.id}"]`)?.getBoundingClientRect?.();
  const c = canvas?.canvas?.getBoundingClientRect?.();
  const ds = canvas?.ds;
  if (r && c && ds && r.height > 0 && canvas?.graph === node.graph) {
    bottom = Math.max(bottom, (r.bottom - c.top) / ds.scale - ds.offset[1]);
  }
  if (clearBelow(node.graph, node, bottom, globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30)) canvas?.setDirty?.(true, true);
}

function renderNodes() {
  for (const [node, el] of readouts) {
    try {
      renderNode(node, el);
    } catch (e) {
      warn(e);
    }
  }
}

// ComfyUI's own graph with the DiT on B: H3RemoteModel (registered beside the pack's nodes) and the core sampler whose
// forwards ran on B get a readout once their record ("connect", "sampler") names them
const REMOTE_MODEL_TYPE = "H3RemoteModel";
const drivenB = new WeakSet();

function readoutType(node) {
  const t = nodeClass(node);
  if (drivenB.has(node)) return t === REMOTE_MODEL_TYPE ? t : "sampler";
  return isH3NodeType(t) ? t : null;
}

/** The graph nodes an execution id names (`12`, or `57:12` inside a subgraph): the last part is the node's own id. */
function nodesByExecId(id) {
  const parts = String(id ?? "").split(":");
  const own = parts[parts.length - 1];
  return allNodes().filter((n) => String(n?.id) === own && (parts.length > 1) === (n?.graph && n.graph !== app.rootGraph));
}

/**
 * A core sampler that drove B, and H3RemoteModel, get their readout when their first record comes (the templates
 * and ComfyUI's own graphs were laid out without one; the node grows by what its text needs).
 */
function attachDriven(payload) {
  if ((payload?.node_type !== "sampler" && payload?.node_type !== REMOTE_MODEL_TYPE) || !payload.node) return;
  for (const node of nodesByExecId(payload.node)) {
    if (drivenB.has(node)) continue;
    drivenB.add(node);
    attach(node);
    // made after the node was laid out: fitted once the canvas (or the Vue node) has laid the readout out
    for (const ms of [120, 600, 1500]) {
      setTimeout(safe(() => {
        const el = readouts.get(node);
        if (el) renderNode(node, el);
        roomBelow(node);
      }), ms);
    }
  }
}

function attach(node) {
  syncWorkflow(); // a node made by loading another workflow shows that workflow's state
  if (state.bModels && nodeClass(node) === B_MODEL_NODE_TYPE) safe(setModelChoices)(node, state.bModels);
  if (!node || readouts.has(node) || !readoutType(node)) return;
  if (typeof node.addDOMWidget !== "function") return;
  if (node.widgets?.some?.((w) => w?.name === WIDGET_NAME)) return;
  const el = createReadoutElement(document);
  reserve(el, Math.max(readoutHeight(readoutType(node)), wrappedHeight(node)));
  // The classic canvas draws a DOM widget `margin` below its slot's top and that much above its bottom (10 units in
  // 1.49 and 1.58): the slot holds the readout and both margins, or the readout's last line runs under the widget
  // below it (the denoise's preview). Vue nodes lay the element out by its own height and ignore the slot.
  let widget;
  const margin = () => (Number.isFinite(widget?.margin) ? widget.margin : 0);
  const height = () => (reserved.get(el) ?? readoutHeight(readoutType(node))) + 2 * margin();
  widget = node.addDOMWidget(WIDGET_NAME, "h3_readout", el, {
    serialize: false, hideOnZoom: false, getMinHeight: height, getMaxHeight: height,
  });
  if (widget && typeof widget === "object") widget.serialize = false; // keep it out of widgets_values
  readouts.set(node, el);
  // The classic canvas grows a node while drawing it (H3SaveVideo round its video, 1.49.6) and drew it at its old
  // size: the video hung below the node until something else redrew the canvas. A resize asks for one more frame.
  const onResize = node.onResize;
  node.onResize = function h3OnResize(...args) {
    const out = onResize?.apply(this, args);
    requestAnimationFrame(() => app.canvas?.setDirty?.(true, true));
    return out;
  };
  const onRemoved = node.onRemoved;
  node.onRemoved = function h3OnRemoved(...args) {
    readouts.delete(node);
    return onRemoved?.apply(this, args);
  };
  renderNode(node, el);
  try {
    if (Array.isArray(node.size) && typeof node.computeSize === "function" && typeof node.setSize === "function") {
      const want = node.computeSize();
      node.setSize([Math.max(node.size[0], want[0]), Math.max(node.size[1], want[1])]);
    }
  } catch {
    /* sizing is cosmetic */
  }
}

function graphNodes() {
  const g = app.graph;
  const list = g?.nodes ?? g?._nodes ?? [];
  return Array.isArray(list) ? list : [];
}

/** Every node of the workflow: the root graph, the graph on screen and the subgraphs inside them. */
function allNodes() {
  const out = new Set();
  const seen = new Set();
  const walk = (g) => {
    if (!g || seen.has(g)) return;
    seen.add(g);
    const list = g.nodes ?? g._nodes ?? [];
    if (!Array.isArray(list)) return;
    for (const n of list) {
      out.add(n);
      if (n?.subgraph) walk(n.subgraph);
    }
  };
  walk(app.rootGraph);
  walk(app.graph);
  return [...out];
}

// ------------------------------------------------------------------------------------------------ model pickers

/**
 * Sets the choices of a node's `model_path` combo; its value stays as it is (even when not among them). The list is
 * changed in place: a Vue node's select keeps the array it was given and re-reads it each time it opens.
 */
function setModelChoices(node, models) {
  const widget = node?.widgets?.find?.((w) => w?.name === MODEL_WIDGET);
  if (!widget || widget.type !== "combo" || !widget.options || typeof widget.options !== "object") return false;
  const values = widget.options.values;
  if (sameChoices(values, models)) return false;
  if (Array.isArray(values) && !Object.isFrozen(values)) values.splice(0, values.length, ...models);
  else widget.options.values = [...models];
  return true;
}

/** B's model list became known (an h3.timing of H3RemoteDiT, or /h3/status): offer it on every H3RemoteDiT. */
function updateBModels(payload) {
  const models = bModelsFrom(payload);
  if (!models) return;
  state.bModels = models;
  let changedAny = false;
  for (const node of allNodes()) {
    if (nodeClass(node) !== B_MODEL_NODE_TYPE) continue;
    try {
      changedAny = setModelChoices(node, models) || changedAny;
    } catch (e) {
      warn(e);
    }
  }
  if (changedAny) app.canvas?.setDirty?.(true, true);
}
const offerBModels = safe(updateBModels); // never stops the handler it is called from

// ------------------------------------------------------------------------------------------------ panels

let panelTimer = null;
function schedulePanels() {
  if (panelTimer !== null) return;
  panelTimer = setTimeout(safe(() => {
    panelTimer = null;
    renderPanels();
  }), 60);
}

function renderPanels() {
  const share = warnShare();
  const model = statusModel(state.status, { fetchError: state.statusError });
  for (const p of panels) {
    // drawn even while detached: the frontend attaches the tab's element only after render(el) returns
    try {
      p.setStatus(model);
      p.setRequests(store, { warnShare: share });
      if (state.reconnecting) p.setMessage("websocket reconnecting…");
      else if (p.message.textContent === "websocket reconnecting…") p.setMessage("");
    } catch (e) {
      warn(e);
    }
  }
}

function changed() {
  renderNodes();
  schedulePanels();
}

function newPanel() {
  const panel = new TimelinePanel(document, {
    refresh: () => Promise.all([refreshStatus(true), refreshTimings(true, true)]),
    exportJSON: () => exportTimings("json"),
    exportCSV: () => exportTimings("csv"),
    releaseB: () => releaseB(panel),
  });
  panels.add(panel);
  return panel;
}

/** Redraws when the panel's width changes (first layout after the frontend attaches it, sidebar resize). */
function watchWidth(panel) {
  const RO = globalThis.ResizeObserver;
  if (typeof RO !== "function") return;
  let last = -1;
  new RO(safe((entries) => {
    const w = entries[entries.length - 1]?.contentRect?.width ?? 0;
    if (w > 0 && Math.abs(w - last) > 16) {
      last = w;
      schedulePanels(); // a timer, never a redraw inside the observer callback
    }
  })).observe(panel.el);
}

/** The sidebar tab's render(el): moves the one panel into `el` (attached or not) and fills it. */
function mountSidebar(container) {
  if (!container || typeof container.replaceChildren !== "function") return;
  if (!sidebarPanel) {
    sidebarPanel = newPanel();
    watchWidth(sidebarPanel);
  }
  const reopened = container !== sidebarContainer;
  sidebarContainer = container;
  if (sidebarPanel.el.parentNode !== container || container.childNodes.length !== 1) {
    container.replaceChildren(sidebarPanel.el);
  }
  renderPanels(); // draws now, attached or not
  schedulePanels(); // and again once the frontend has put `el` in the page (real width)
  refreshStatus(reopened);
  refreshTimings(reopened, reopened);
}

// ------------------------------------------------------------------------------------------------ routes

/** "Release B's model": POST /h3/release_b, then the panel says what each worker released, and the status shows it. */
async function releaseB(panel) {
  panel.setMessage("asking B's workers to release their model…");
  const r = await api.fetchApi("/h3/release_b", { method: "POST", body: "{}", cache: "no-store",
                                                   headers: { "Content-Type": "application/json" } });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(data?.error ?? `/h3/release_b: HTTP ${r.status}`);
  const done = (data.released ?? []).map((w) => {
    const mib = Object.values(w.bytes ?? {}).reduce((s, v) => s + (Number(v) || 0), 0) / 2 ** 20;
    return `${w.name} ${w.already ? "was already released" : `released ${mib.toFixed(1)} MiB`}`;
  });
  const missing = Object.entries(data.missing ?? {}).map(([n, why]) => `${n}: ${why}`);
  panel.setMessage([...done, ...missing].join("; ") + " · the next run reloads on B");
  await refreshStatus(true);
}

async function getJSON(route) {
  const r = await api.fetchApi(route, { cache: "no-store" });
  if (!r.ok) throw new Error(`${route}: HTTP ${r.status}`);
  return r.json();
}

let statusInflight = null;
let statusLast = 0;
let statusTimer = null;
function refreshStatus(force = false) {
  if (statusInflight) return statusInflight;
  const wait = STATUS_MIN_INTERVAL_MS - (Date.now() - statusLast);
  if (!force && wait > 0) {
    if (statusTimer === null) {
      statusTimer = setTimeout(safe(() => {
        statusTimer = null;
        refreshStatus(true);
      }), wait);
    }
    return Promise.resolve();
  }
  statusLast = Date.now();
  statusInflight = getJSON("/h3/status")
    .then((data) => {
      state.status = data;
      state.statusError = null;
      offerBModels(data);
    })
    .catch((e) => {
      state.status = null;
      state.statusError = e?.message ?? String(e);
    })
    .finally(() => {
      statusInflight = null;
      schedulePanels();
    });
  return statusInflight;
}

let timingsInflight = null;
let timingsLast = 0;
function refreshTimings(force = false, withHistory = false) {
  if (timingsInflight) return timingsInflight;
  if (!force && Date.now() - timingsLast < TIMINGS_MIN_INTERVAL_MS) return Promise.resolve();
  timingsLast = Date.now();
  // ComfyUI's history first (the prompts that carried each record), then the pack's own list of records
  const history = withHistory ? getJSON(`/history?max_items=${HISTORY_ITEMS}`).catch(() => null) : Promise.resolve(null);
  timingsInflight = history
    .then((h) => {
      if (h && store.ingestHistory(h)) changed();
      return getJSON("/h3/timings");
    })
    .then((data) => {
      if (store.ingestRecords(data)) changed();
    })
    .catch(() => {
      /* the route answers once the pack is loaded; the live events still fill the view */
    })
    .finally(() => {
      timingsInflight = null;
    });
  return timingsInflight;
}

async function exportTimings(format) {
  const csv = format === "csv";
  const r = await api.fetchApi(csv ? "/h3/timings?format=csv" : "/h3/timings", { cache: "no-store" });
  if (!r.ok) throw new Error(`HTTP ${r.status}`);
  let text = await r.text();
  if (!csv) {
    try {
      text = JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      /* keep the server's text */
    }
  }
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  downloadText(document, `h3_timings_${stamp}.${csv ? "csv" : "json"}`, text, csv ? "text/csv" : "application/json");
}

// ------------------------------------------------------------------------------------------------ events

/** The store follows the workflow on screen (checked before each event: the frontend switches tabs on its own). */
function syncWorkflow() {
  return store.setActiveWorkflow(activeWorkflowName());
}

function listen() {
  const on = (type, fn) => api.addEventListener(type, safe((e) => {
    if (syncWorkflow()) renderNodes();
    return fn(e);
  }));
  on("h3.timing", (e) => {
    offerBModels(e.detail);
    const fresh = store.ingestTiming(e.detail);
    attachDriven(e.detail);
    if (fresh) changed();
  });
  on("h3.progress", (e) => {
    if (store.ingestProgress(e.detail)) changed();
  });
  on("executed", (e) => {
    if (store.ingestExecuted(e.detail)) changed();
  });
  on("execution_start", (e) => {
    store.executionStart(e.detail);
    changed();
  });
  on("execution_cached", (e) => {
    store.executionCached(e.detail);
    changed();
  });
  on("executing", (e) => {
    store.executing(e.detail);
    changed();
  });
  for (const kind of ["execution_success", "execution_error", "execution_interrupted"]) {
    on(kind, (e) => {
      store.executionEnd(kind, e.detail);
      // H3RemoteModel refused before any record of it came: its sentence on the node, as the pack's nodes show theirs
      if (kind === "execution_error" && e.detail?.node_type === REMOTE_MODEL_TYPE) {
        attachDriven({ node_type: REMOTE_MODEL_TYPE, node: e.detail.node_id });
      }
      changed();
      refreshTimings(true);
      refreshStatus(false);
    });
  }
  on("status", () => {
    refreshStatus(false);
  });
  on("reconnecting", () => {
    state.reconnecting = true;
    schedulePanels();
  });
  on("reconnected", () => {
    state.reconnecting = false;
    refreshStatus(true);
    refreshTimings(true, true);
    schedulePanels();
  });
}

// ------------------------------------------------------------------------------------------------ workflow names

/** The name of the workflow on screen (its tab's name, e.g. `h3_t2va_turbo.json`), or null. */
function activeWorkflowName() {
  try {
    const wf = app.extensionManager?.workflow?.activeWorkflow ?? null;
    const name = wf?.key ?? (wf?.filename ? `${wf.filename}.json` : null) ?? wf?.path?.split("/").pop() ?? null;
    return typeof name === "string" && name ? name : null;
  } catch {
    return null;
  }
}

/**
 * Names each prompt after the workflow it was queued from: both frontends queue through api.queuePrompt, whose
 * answer holds the prompt id. The name is read when the prompt is queued (the user may switch tabs before it runs).
 */
function nameQueuedPrompts() {
  const original = api.queuePrompt;
  if (typeof original !== "function" || original.__h3Named) return;
  const named = async function h3QueuePrompt(...args) {
    const name = activeWorkflowName();
    const res = await original.apply(this, args);
    try {
      if (name && res && typeof res === "object" && res.prompt_id && store.setPromptName(res.prompt_id, name)) {
        schedulePanels();
      }
    } catch (e) {
      warn(e);
    }
    return res;
  };
  named.__h3Named = true;
  api.queuePrompt = named;
}

// ------------------------------------------------------------------------------------------------ run on machine B

/** The menu entry's swap: the UNETLoader `node` becomes an H3RemoteModel in its own graph, as one undo step. */
export function runOnMachineB(node) {
  const canvas = app.canvas;
  canvas?.emitBeforeChange?.(); // the frontend's change tracker: one undo step for the whole swap
  let made;
  try {
    made = swapToRemoteModel(node, { createNode: (type) => globalThis.LiteGraph?.createNode?.(type) ?? null,
                                     rootNodes: allNodes() });
  } catch (e) {
    canvas?.emitAfterChange?.();
    throw e;
  }
  canvas?.setDirty?.(true, true);
  // once laid out (a Vue node's element can be taller than its size said), the nodes below make room for what is
  // drawn; the step ends then, so one undo still gives the UNETLoader back with every node where it was
  let ended = false;
  const settle = safe((last) => {
    if (ended) return;
    const el = document.querySelector(`[data-node-id="${made.id}"]`);
    const ds = canvas?.ds;
    let bottom = made.pos[1] + made.size[1];
    const r = el?.getBoundingClientRect?.();
    const c = canvas?.canvas?.getBoundingClientRect?.();
    if (r && c && ds && r.height > 0) bottom = Math.max(bottom, (r.bottom - c.top) / ds.scale - ds.offset[1]);
    if (clearBelow(made.graph ?? canvas?.graph, made, bottom, globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30)) {
      canvas?.setDirty?.(true, true);
    }
    if (last) {
      ended = true;
      canvas?.emitAfterChange?.();
    }
  });
  requestAnimationFrame(() => requestAnimationFrame(() => settle(false)));
  setTimeout(() => settle(true), 350);
  return made;
}

function swapMenuItems(node) {
  if (!isSwappable(node)) return [];
  return [{ content: SWAP_MENU_LABEL, callback: safe(() => runOnMachineB(node)) }];
}

/** Frontends without the extensions' node-menu hook: the entry comes from the node type's getExtraMenuOptions. */
function addLegacyMenu(nodeType) {
  const proto = nodeType?.prototype;
  if (!proto || typeof app.collectNodeMenuItems === "function") return; // the hook is there: one entry, not two
  const original = proto.getExtraMenuOptions;
  proto.getExtraMenuOptions = function h3ExtraMenuOptions(canvas, options) {
    const r = original?.apply(this, [canvas, options]);
    try {
      if (Array.isArray(options)) options.push(...swapMenuItems(this));
    } catch (e) {
      warn(e);
    }
    return r;
  };
}

// ------------------------------------------------------------------------------------------------ registration

app.registerExtension({
  name: EXTENSION,
  settings: [
    {
      id: SETTING_WARN_PERCENT,
      category: ["comfy-h3", "Timings", "Transfer highlight"],
      name: "Highlight a transfer that takes more than this share of its request (%)",
      type: "number",
      defaultValue: DEFAULT_WARN_PERCENT,
      attrs: { min: 0, max: 100, step: 1 },
      onChange: safe(() => changed()),
    },
  ],
  getNodeMenuItems: safe((node) => swapMenuItems(node)),
  beforeRegisterNodeDef: safe((nodeType, nodeData) => {
    if (nodeData?.name === SWAP_FROM_TYPE) addLegacyMenu(nodeType);
  }),
  setup: safe(function setup() {
    globalThis.comfyH3 = Object.assign(globalThis.comfyH3 ?? {}, { runOnMachineB });
    ensureStyles(document);
    listen();
    nameQueuedPrompts();
    const em = app.extensionManager;
    if (em && typeof em.registerSidebarTab === "function") {
      em.registerSidebarTab({
        id: SIDEBAR_ID,
        icon: "pi pi-chart-bar",
        title: "H3",
        tooltip: "H3 timings and cluster status",
        type: "custom",
        render: safe((el) => mountSidebar(el)),
        destroy: safe(() => {
          sidebarContainer = null; // the tab closed: the next render(el) is a reopening
        }),
      });
    } else {
      const panel = newPanel();
      panel.floating = true;
      const { box } = createFloatingPanel(document, panel.el);
      box.addEventListener("h3-open", safe(() => {
        renderPanels();
        refreshStatus(true);
        refreshTimings(true, true);
      }));
    }
    syncWorkflow();
    for (const node of graphNodes()) attach(node);
    refreshStatus(true);
    refreshTimings(true, true);
    schedulePanels();
  }),
  // another workflow on screen (a tab, an opened file): its readouts show its own nodes' states
  // (the frontend names the new active workflow once the graph is configured: checked again right after)
  afterConfigureGraph: safe(() => {
    const check = safe(() => {
      if (syncWorkflow()) changed();
    });
    check();
    setTimeout(check, 0);
    setTimeout(check, 120);
  }),
  nodeCreated: safe((node) => attach(node)),
  loadedGraphNode: safe((node) => attach(node)),
});
