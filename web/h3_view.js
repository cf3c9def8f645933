// comfy-h3 web extension: view logic (formatting, aggregation of timing events, readout and status models).
//
// Pure ES module: no ComfyUI import, no DOM access, no side effects at load time. ComfyUI imports every .js under
// the pack's web/ folder as an extension script, so this file must stay harmless when loaded on its own; it is also
// imported by node's test runner (tests/web/).
//
// Data contract: docs/events.md (`h3.timing`, `h3.progress`, `GET /h3/status`, `GET /h3/timings`).

/**
 * The pack's nodes, in one table: the readout's word for each node's own work, and the machine it runs on when its
 * record does not say. It lists exactly the Python package's NODE_CLASS_MAPPINGS (tests/test_web_view_nodes.py
 * checks that), so a node added there without a readout fails a test instead of showing nothing.
 */
export const H3_NODES = Object.freeze({
  H3LoadEncoders: { verb: "load", machine: "A" },
  H3RemoteDiT: { verb: "connect", machine: "B" },
  H3LoRA: { verb: "lora", machine: "A" },
  H3Keyframes: { verb: "keyframes", machine: "A" },
  H3References: { verb: "references", machine: "A" },
  H3PromptList: { verb: "prompts", machine: "A" },
  H3TextEncode: { verb: "encode", machine: "A" },
  H3RemoteDenoise: { verb: "denoise", machine: "B" },
  H3Decode: { verb: "decode", machine: "A" },
  H3SaveVideo: { verb: "save", machine: "A" },
});
export const H3_NODE_TYPES = Object.freeze(Object.keys(H3_NODES));
const H3_TYPE_SET = new Set(H3_NODE_TYPES);

/** Default share of a request's total time above which a transfer is highlighted, in percent. */
export const DEFAULT_WARN_PERCENT = 10;
export const DEFAULT_WARN_SHARE = DEFAULT_WARN_PERCENT / 100;
/** How many requests the timeline keeps. */
export const MAX_REQUESTS = 20;
/** How many records without a request id (load, connect) are kept. */
export const MAX_LOADS = 20;

export const STAGE_ORDER = Object.freeze(["load", "connect", "encode", "a_to_b", "denoise", "b_to_a", "decode", "save"]);
export const TRANSFER_STAGES = Object.freeze(["a_to_b", "b_to_a"]);
const STAGE_LABEL = { a_to_b: "A->B", b_to_a: "B->A" };
const STAGE_MACHINE = { load: "A", connect: "B", encode: "A", a_to_b: "B", denoise: "B", b_to_a: "A", decode: "A", save: "A" };

/** What each node type's own compute is called in its readout. */
export const NODE_VERB = Object.freeze(Object.fromEntries(Object.entries(H3_NODES).map(([k, v]) => [k, v.verb])));
const NODE_MACHINE = Object.fromEntries(Object.entries(H3_NODES).map(([k, v]) => [k, v.machine]));

export function isH3NodeType(t) {
  return typeof t === "string" && H3_TYPE_SET.has(t);
}

export function stageLabel(stage) {
  return STAGE_LABEL[stage] ?? String(stage ?? "?");
}

/** The machine a stage runs on when a record does not say (receiver of a transfer). */
export function defaultMachine(stage) {
  return STAGE_MACHINE[stage] ?? "A";
}

export function stageRank(stage) {
  const i = STAGE_ORDER.indexOf(stage);
  return i < 0 ? STAGE_ORDER.length : i;
}

// ---------------------------------------------------------------------------------------------------- formatting

/** A finite number from a number or numeric string, else null. */
export function num(x) {
  if (typeof x === "number") return Number.isFinite(x) ? x : null;
  if (typeof x === "string" && x.trim() !== "") {
    const v = Number(x);
    return Number.isFinite(v) ? v : null;
  }
  return null;
}

/** Seconds for people: `0.4 ms`, `68 ms`, `41.2 s`, `2 m 05 s`, `1 h 02 m`; `–` when unknown. */
export function fmtSeconds(s) {
  const v = num(s);
  if (v === null) return "–";
  if (v < 0) return `-${fmtSeconds(-v)}`;
  const ms = v * 1000;
  if (ms < 9.95) return `${ms.toFixed(1)} ms`;
  if (ms < 999.5) return `${Math.round(ms)} ms`;
  if (v < 59.95) return `${v.toFixed(1)} s`;
  const whole = Math.round(v);
  if (whole < 3600) return `${Math.floor(whole / 60)} m ${String(whole % 60).padStart(2, "0")} s`;
  const minutes = Math.round(v / 60);
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} m`;
}

/** Bytes for people: `512 B`, `2.5 MiB`. */
export function fmtBytes(b) {
  const v = num(b);
  if (v === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let x = Math.abs(v);
  let i = 0;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i += 1;
  }
  const sign = v < 0 ? "-" : "";
  return i === 0 ? `${sign}${Math.round(x)} B` : `${sign}${x.toFixed(1)} ${units[i]}`;
}

/** A share (0..1) as a percentage: `0.1 %`, `12 %`. */
export function fmtPercent(share) {
  const v = num(share);
  if (v === null) return "–";
  const p = v * 100;
  if (p > 0 && p < 0.1) return "<0.1 %";
  return `${p.toFixed(p < 10 ? 1 : 0)} %`;
}

/**
 * The first `n` characters of an id; a request id's re-run suffix (`<id>.2`: the same encoded conditioning
 * denoised again) is kept, so such requests stay apart in the timeline.
 */
export function shortId(id, n = 6) {
  if (id === null || id === undefined || id === "") return "–";
  const s = String(id);
  const m = /^(.+?)(\.\d+)$/.exec(s);
  const [base, suffix] = m ? [m[1], m[2]] : [s, ""];
  return (base.length > n ? base.slice(0, n) : base) + suffix;
}

/** Sum of a `bytes` field: a number, or a {field: bytes} object, or the CSV form `a=1;b=2`. */
export function totalBytes(bytes) {
  const direct = num(bytes);
  if (direct !== null) return direct;
  const obj = parseBytes(bytes);
  if (!obj) return null;
  const vals = Object.values(obj);
  return vals.length ? vals.reduce((a, b) => a + b, 0) : null;
}

function parseBytes(bytes) {
  if (bytes && typeof bytes === "object" && !Array.isArray(bytes)) {
    const out = {};
    for (const [k, v] of Object.entries(bytes)) {
      const n = num(v);
      if (n !== null) out[k] = n;
    }
    return out;
  }
  if (typeof bytes === "string" && bytes.includes("=")) {
    const out = {};
    for (const part of bytes.split(";")) {
      const i = part.lastIndexOf("=");
      const n = i > 0 ? num(part.slice(i + 1)) : null;
      if (n !== null) out[part.slice(0, i)] = n;
    }
    return out;
  }
  return null;
}

function parseSteps(steps) {
  let list = [];
  if (Array.isArray(steps)) list = steps;
  else if (typeof steps === "string" && steps.trim() !== "") list = steps.split(";");
  return list.map(num).filter((v) => v !== null);
}

// ------------------------------------------------------------------------------------------------ records

/** A StageRecord (event payload, JSON route or CSV row) with numbers as numbers; null when it is not one. */
export function normalizeRecord(r) {
  if (!r || typeof r !== "object" || typeof r.stage !== "string" || r.stage === "") return null;
  const fetch_s = num(r.fetch_s) ?? 0;
  const materialize_s = num(r.materialize_s) ?? 0;
  const bytes = parseBytes(r.bytes) ?? {};
  const rid = r.request_id;
  return {
    request_id: rid === null || rid === undefined || rid === "" ? null : String(rid),
    stage: r.stage,
    machine: r.machine === "A" || r.machine === "B" ? r.machine : defaultMachine(r.stage),
    node: r.node === null || r.node === undefined ? "" : String(r.node),
    // times on A's clock: a B record carries its clock's estimated offset from A's (clock_offset_s = B - A)
    start: shiftClock(num(r.start), r.clock_offset_s),
    end: shiftClock(num(r.end), r.clock_offset_s),
    clock_offset_s: num(r.clock_offset_s) ?? 0,
    producer_wait_s: num(r.producer_wait_s) ?? 0,
    fetch_s,
    materialize_s,
    validate_s: num(r.validate_s) ?? 0,
    serialize_s: num(r.serialize_s) ?? 0,
    compute_s: num(r.compute_s) ?? 0,
    bytes,
    total_bytes: num(r.total_bytes) ?? totalBytes(bytes) ?? 0,
    steps: parseSteps(r.steps),
    load_s: num(r.load_s) ?? 0,
    note: r.note === null || r.note === undefined ? "" : String(r.note),
    receive_s: fetch_s + materialize_s,
    // a DiT group's denoise: every rank sends its own record (rank 0's is the request's)
    rank: Number.isInteger(r.info?.rank) && num(r.info?.world) >= 2 ? r.info.rank : null,
    world: Number.isInteger(r.info?.rank) && num(r.info?.world) >= 2 ? r.info.world : null,
    comm_s: num(r.info?.comm_s),
  };
}

/** The parallel-denoise line of a readout: each rank's machine and step time, the communication share, the
 * method (`summary.ran.ranks` of a DiT group's denoise), or null for a one-worker denoise. */
export function ranksLine(summary) {
  const ranks = Array.isArray(summary?.ran?.ranks) ? summary.ran.ranks : null;
  if (!ranks || ranks.length < 2) return null;
  const shares = ranks.map((r) => num(r.comm_share)).filter((x) => x !== null);
  const comm = shares.length ? shares.reduce((a, b) => a + b, 0) / shares.length : null;
  const parts = ranks.map((r) => `${r.machine === "A" || r.machine === "B" ? r.machine : "?"} ${fmtSeconds(r.step_s)}/step`);
  return `${ranks.length} ranks (${summary.ran.method ?? "ulysses"}): ${parts.join(", ")}` +
    (comm !== null ? ` · comm ${fmtPercent(comm)}` : "");
}

function shiftClock(t, offset) {
  const o = num(offset);
  return t === null || o === null ? t : t - o;
}

export function recordKey(r) {
  return `${r.request_id}|${r.stage}|${r.machine}|${r.start ?? ""}|${r.end ?? ""}`;
}

/** Wall seconds of a record (end - start) when both are known, else null. */
export function recordSeconds(r) {
  return r && r.start !== null && r.end !== null && r.end >= r.start ? r.end - r.start : null;
}

/** The figures of one transfer (a summary's `a_to_b`/`b_to_a`, or a transfer record). */
export function transferFigures(t) {
  if (!t || typeof t !== "object") return null;
  const fetch_s = num(t.fetch_s) ?? 0;
  const materialize_s = num(t.materialize_s) ?? 0;
  return {
    fetch_s,
    materialize_s,
    receive_s: fetch_s + materialize_s,
    producer_wait_s: num(t.producer_wait_s) ?? 0,
    serialize_s: num(t.serialize_s),
    validate_s: num(t.validate_s),
    bytes: num(t.total_bytes) ?? totalBytes(t.bytes),
  };
}

/** count, total, mean, min, max of per-step seconds. */
export function stepStats(steps) {
  const list = (Array.isArray(steps) ? steps : []).map(num).filter((v) => v !== null);
  if (!list.length) return { count: 0, total_s: 0, mean_s: null, min_s: null, max_s: null };
  const total = list.reduce((a, b) => a + b, 0);
  return { count: list.length, total_s: total, mean_s: total / list.length, min_s: Math.min(...list),
           max_s: Math.max(...list) };
}

/** Progress steps of a request/node as a sorted list of {step, seconds}. */
export function progressSteps(progress) {
  if (!progress || !progress.steps) return [];
  const entries = progress.steps instanceof Map ? [...progress.steps.entries()] : Object.entries(progress.steps);
  return entries
    .map(([k, v]) => ({ step: Number(k), seconds: num(v) ?? 0 }))
    .filter((e) => Number.isFinite(e.step))
    .sort((a, b) => a.step - b.step);
}

// ------------------------------------------------------------------------------------------------ the store

function nodeKey(id) {
  return id === null || id === undefined ? null : String(id);
}

/**
 * Everything the UI shows, built from websocket events and `/h3/timings` rows. Every `ingest*` method accepts
 * anything (malformed payloads are ignored), is idempotent for repeated payloads and bumps `version` on a change.
 */
export class H3Store {
  constructor({ maxRequests = MAX_REQUESTS, maxLoads = MAX_LOADS } = {}) {
    this.maxRequests = maxRequests;
    this.maxLoads = maxLoads;
    this.nodes = new Map(); // node id (string) -> node state
    this.requests = new Map(); // request id -> request aggregate
    this.loads = []; // records without a request id (load, connect)
    this._loadKeys = new Set();
    this.promptId = null;
    this.version = 0;
    this._seq = 0;
  }

  _bump() {
    this.version += 1;
    this._seq += 1;
    return this._seq;
  }

  /** The state of a node, created on first use. */
  node(id) {
    const key = nodeKey(id);
    let ns = this.nodes.get(key);
    if (!ns) {
      ns = { id: key, node_type: null, state: "idle", prompt_id: null, request_id: null, timing: null,
             progress: null, error: null, seq: 0 };
      this.nodes.set(key, ns);
    }
    return ns;
  }

  /** The state for a graph node id: exact id, else an id of a node inside a subgraph (`"12:5"` for `5`). */
  findNode(id) {
    const key = nodeKey(id);
    if (key === null) return null;
    const exact = this.nodes.get(key);
    if (exact) return exact;
    let best = null;
    for (const ns of this.nodes.values()) {
      if (ns.id.endsWith(`:${key}`) && (!best || ns.seq > best.seq)) best = ns;
    }
    return best;
  }

  /** The aggregate of one request, created on first use (null for a null id). */
  request(rid, { create = true } = {}) {
    if (rid === null || rid === undefined || rid === "") return null;
    const key = String(rid);
    let req = this.requests.get(key);
    if (!req && create) {
      req = { request_id: key, prompt_id: null, records: [], keys: new Set(), nodes: new Map(), progress: null,
              state: "running", error: null, seq: this._bump(), version: 0 };
      this.requests.set(key, req);
      this._trim();
    }
    return req ?? null;
  }

  _addRecords(req, records) {
    let added = 0;
    for (const raw of records) {
      const rec = normalizeRecord(raw);
      if (!rec) continue;
      if (rec.request_id === null) {
        const k = recordKey(rec);
        if (this._loadKeys.has(k)) continue;
        this._loadKeys.add(k);
        this.loads.push(rec);
        while (this.loads.length > this.maxLoads) this._loadKeys.delete(recordKey(this.loads.shift()));
        added += 1;
        continue;
      }
      const target = req && rec.request_id === req.request_id ? req : this.request(rec.request_id);
      if (!target) continue;
      const k = recordKey(rec);
      if (target.keys.has(k)) continue;
      target.keys.add(k);
      target.records.push(rec);
      target.records.sort((a, b) => (a.start ?? Infinity) - (b.start ?? Infinity) || stageRank(a.stage) - stageRank(b.stage));
      target.version += 1;
      if (target.records.some((r) => r.stage === "decode" || r.stage === "save")) target.state = "done";
      added += 1;
    }
    return added;
  }

  _trim() {
    if (this.requests.size <= this.maxRequests) return;
    const ordered = this.requestList();
    for (const req of ordered.slice(this.maxRequests)) this.requests.delete(req.request_id);
  }

  /** Requests, newest first (by first record start, then by arrival). */
  requestList() {
    const list = [...this.requests.values()];
    const key = (r) => {
      const starts = r.records.map((x) => x.start).filter((x) => x !== null);
      return starts.length ? Math.min(...starts) : Infinity;
    };
    return list.sort((a, b) => {
      const ka = key(a);
      const kb = key(b);
      if (ka !== kb) return kb - ka;
      return b.seq - a.seq;
    });
  }

  /** {t0, t1, total_s} of a request's records (wall clock), or null when none has times. */
  requestSpan(rid) {
    const req = typeof rid === "object" && rid !== null ? rid : this.request(rid, { create: false });
    if (!req) return null;
    const timed = req.records.filter((r) => r.start !== null && r.end !== null);
    if (!timed.length) return null;
    const t0 = Math.min(...timed.map((r) => r.start));
    const t1 = Math.max(...timed.map((r) => r.end));
    return { t0, t1, total_s: Math.max(0, t1 - t0) };
  }

  // ---- ComfyUI execution events
  executionStart(data) {
    const pid = data && typeof data === "object" ? data.prompt_id ?? null : null;
    this.promptId = pid;
    for (const ns of this.nodes.values()) {
      if (ns.state !== "idle") ns.state = "stale";
    }
    this._bump();
  }

  executionCached(data) {
    const ids = data && Array.isArray(data.nodes) ? data.nodes : [];
    for (const id of ids) {
      const ns = this.nodes.get(nodeKey(id));
      if (ns && (ns.timing || ns.progress)) ns.state = "cached";
    }
    if (ids.length) this._bump();
  }

  /** `executing`: the frontend passes the node id (or null when the prompt is done); objects are accepted too. */
  executing(detail) {
    let id = detail;
    if (detail && typeof detail === "object") id = detail.display_node ?? detail.node ?? null;
    const key = nodeKey(id);
    for (const ns of this.nodes.values()) {
      if (ns.state === "running" && ns.id !== key) ns.state = ns.timing ? "done" : "stale";
    }
    if (key !== null) {
      const ns = this.node(key);
      ns.state = "running";
      ns.error = null;
      ns.seq = this._bump();
    } else {
      this._bump();
    }
  }

  /** `execution_success` | `execution_error` | `execution_interrupted`. */
  executionEnd(kind, data) {
    const failed = kind === "execution_error";
    const failedId = failed && data && typeof data === "object" ? nodeKey(data.node_id) : null;
    for (const ns of this.nodes.values()) {
      if (ns.state === "running" && ns.id !== failedId) {
        ns.state = kind === "execution_interrupted" ? "interrupted" : ns.timing ? "done" : "stale";
      }
    }
    if (failedId !== null) {
      const ns = this.node(failedId);
      ns.state = "error";
      ns.error = String(data.exception_message ?? data.exception_type ?? "failed");
      const rid = ns.progress?.request_id ?? null;
      const req = rid ? this.request(rid, { create: false }) : null;
      if (req && req.state === "running") {
        req.state = "error";
        req.error = ns.error;
        req.version += 1;
      }
    }
    if (kind === "execution_interrupted") {
      for (const req of this.requests.values()) {
        if (req.state === "running" && req.progress) {
          req.state = "interrupted";
          req.version += 1;
        }
      }
    }
    this._bump();
  }

  // ---- H3 events
  /** `h3.timing` payload (also the items of an `executed` output's `h3_timing`). Returns true on a change. */
  ingestTiming(p) {
    if (!p || typeof p !== "object" || Array.isArray(p)) return false;
    if (p.node === null || p.node === undefined) {
      // no graph node (a headless run): the records still belong in the timeline
      const rid = p.request_id === null || p.request_id === undefined || p.request_id === "" ? null : String(p.request_id);
      const req = this.request(rid);
      const added = this._addRecords(req, Array.isArray(p.stages) ? p.stages : []);
      if (added) this._bump();
      return added > 0;
    }
    const ns = this.node(p.node);
    if (typeof p.node_type === "string") ns.node_type = p.node_type;
    const rid = p.request_id === null || p.request_id === undefined || p.request_id === "" ? null : String(p.request_id);
    const stages = Array.isArray(p.stages) ? p.stages : [];
    const same = ns.timing && ns.timing.request_id === rid && ns.timing.prompt_id === (p.prompt_id ?? null) &&
      JSON.stringify(ns.timing.summary) === JSON.stringify(p.summary ?? null) && ns.timing.stages.length === stages.length;
    ns.timing = { prompt_id: p.prompt_id ?? null, node_type: ns.node_type, request_id: rid,
                  summary: p.summary && typeof p.summary === "object" ? p.summary : null,
                  stages: stages.map(normalizeRecord).filter(Boolean) };
    ns.request_id = rid;
    ns.prompt_id = p.prompt_id ?? ns.prompt_id;
    if (ns.state !== "error") ns.state = "done";
    if (ns.progress && ns.progress.request_id === rid) ns.progress.final = true;
    const req = this.request(rid);
    let added = this._addRecords(req, stages);
    if (req) {
      if (p.prompt_id) req.prompt_id = p.prompt_id;
      const known = req.nodes.get(ns.id);
      if (known !== ns.node_type) {
        req.nodes.set(ns.id, ns.node_type);
        req.version += 1;
        added += 1;
      }
    }
    ns.seq = this._bump();
    return !same || added > 0;
  }

  /** `h3.progress`: {prompt_id, node, request_id, step (from 1), total, seconds (that step's)}. */
  ingestProgress(p) {
    if (!p || typeof p !== "object") return false;
    const step = num(p.step);
    if (step === null) return false;
    const total = num(p.total);
    const seconds = num(p.seconds) ?? 0;
    const rid = p.request_id === null || p.request_id === undefined || p.request_id === "" ? null : String(p.request_id);
    if (p.node !== null && p.node !== undefined) {
      const ns = this.node(p.node);
      if (!ns.node_type) ns.node_type = "H3RemoteDenoise";
      if (!ns.progress || ns.progress.request_id !== rid) {
        ns.progress = { request_id: rid, total: null, steps: new Map(), final: false };
      }
      ns.progress.steps.set(step, seconds);
      if (total !== null) ns.progress.total = total;
      ns.request_id = rid;
      if (p.prompt_id) ns.prompt_id = p.prompt_id;
      if (!ns.progress.final) ns.state = "running";
      ns.seq = this._bump();
    }
    const req = this.request(rid);
    if (req) {
      if (!req.progress) req.progress = { total: null, steps: new Map() };
      req.progress.steps.set(step, seconds);
      if (total !== null) req.progress.total = total;
      if (p.prompt_id) req.prompt_id = p.prompt_id;
      if (p.node !== null && p.node !== undefined && !req.nodes.has(String(p.node))) {
        req.nodes.set(String(p.node), "H3RemoteDenoise");
      }
      req.version += 1;
      this._bump();
    }
    return true;
  }

  /** `executed`: picks up `output.h3_timing` (the same payloads as `h3.timing`). */
  ingestExecuted(data) {
    if (!data || typeof data !== "object") return false;
    const list = data.output && Array.isArray(data.output.h3_timing) ? data.output.h3_timing : [];
    let changed = false;
    for (const item of list) {
      if (!item || typeof item !== "object") continue;
      const payload = item.node === undefined || item.node === null ? { ...item, node: data.node } : item;
      if (payload.prompt_id === undefined && data.prompt_id) payload.prompt_id = data.prompt_id;
      changed = this.ingestTiming(payload) || changed;
    }
    return changed;
  }

  /** Rows of `GET /h3/timings` (`{"records": [...]}` or the list itself). */
  ingestRecords(records) {
    const list = Array.isArray(records) ? records : records && Array.isArray(records.records) ? records.records : [];
    const added = this._addRecords(null, list);
    if (added) {
      this._trim();
      this._bump();
    }
    return added;
  }
}

// ------------------------------------------------------------------------------------------------ request summary

/** Per-request figures for the timeline header: total, seconds per stage, transfers with their share. */
export function requestSummary(req) {
  const out = { request_id: req?.request_id ?? null, total_s: null, stages: {}, transfers: {}, steps: null,
                state: req?.state ?? "running" };
  if (!req) return out;
  const timed = req.records.filter((r) => r.start !== null && r.end !== null);
  if (timed.length) {
    out.total_s = Math.max(...timed.map((r) => r.end)) - Math.min(...timed.map((r) => r.start));
  }
  for (const r of req.records) {
    if (r.rank) continue; // a DiT group's other ranks: the request's denoise is rank 0's, counted once
    const s = TRANSFER_STAGES.includes(r.stage) ? r.receive_s : r.compute_s || recordSeconds(r) || 0;
    out.stages[r.stage] = (out.stages[r.stage] ?? 0) + s;
    if (TRANSFER_STAGES.includes(r.stage)) {
      const t = transferFigures(r);
      t.share = out.total_s ? t.receive_s / out.total_s : null;
      out.transfers[r.stage] = t;
    }
    if (r.stage === "denoise" && r.steps.length) out.steps = stepStats(r.steps);
  }
  if (!out.steps && req.progress) {
    const ps = progressSteps(req.progress);
    out.steps = { ...stepStats(ps.map((e) => e.seconds)), done: ps.length ? ps[ps.length - 1].step : 0,
                  total: req.progress.total };
  }
  return out;
}

// ------------------------------------------------------------------------------------------------ node readout

function transferTitle(label, f, share) {
  const lines = [`${label}: ${fmtSeconds(f.receive_s)} = fetch ${fmtSeconds(f.fetch_s)} + materialise ${fmtSeconds(f.materialize_s)}`];
  if (f.producer_wait_s) lines.push(`  producer wait ${fmtSeconds(f.producer_wait_s)}`);
  if (f.serialize_s) lines.push(`  serialise ${fmtSeconds(f.serialize_s)}`);
  if (f.validate_s) lines.push(`  validate ${fmtSeconds(f.validate_s)}`);
  if (f.bytes) lines.push(`  ${fmtBytes(f.bytes)}`);
  if (share !== null && share !== undefined) lines.push(`  ${fmtPercent(share)} of the request`);
  return lines.join("\n");
}

function recordTitle(r) {
  const parts = [`${stageLabel(r.stage)} on ${r.machine}${r.node ? ` (${r.node})` : ""}`];
  const wall = recordSeconds(r);
  if (wall !== null) parts.push(`  wall ${fmtSeconds(wall)}`);
  if (r.compute_s) parts.push(`  compute ${fmtSeconds(r.compute_s)}`);
  if (r.load_s) parts.push(`  load ${fmtSeconds(r.load_s)}`);
  if (r.producer_wait_s) parts.push(`  producer wait ${fmtSeconds(r.producer_wait_s)}`);
  if (r.fetch_s || r.materialize_s) parts.push(`  fetch ${fmtSeconds(r.fetch_s)} + materialise ${fmtSeconds(r.materialize_s)}`);
  if (r.validate_s) parts.push(`  validate ${fmtSeconds(r.validate_s)}`);
  if (r.serialize_s) parts.push(`  serialise ${fmtSeconds(r.serialize_s)}`);
  if (r.total_bytes) parts.push(`  ${fmtBytes(r.total_bytes)}`);
  if (r.steps.length) {
    const st = stepStats(r.steps);
    parts.push(`  ${st.count} steps, ${fmtSeconds(st.mean_s)}/step (${fmtSeconds(st.min_s)}..${fmtSeconds(st.max_s)})`);
  }
  if (r.note) parts.push(`  ${r.note}`);
  return parts.join("\n");
}

/**
 * What the readout widget of one node shows:
 * `{state, classes, title, lines: [[{text, cls, title, key}], ...]}`. `line 0` is the compact figure line,
 * `line 1` the detail line (transfer split into fetch and materialisation).
 */
export function readoutModel(store, nodeId, { warnShare = DEFAULT_WARN_SHARE, nodeType = null } = {}) {
  const ns = store ? store.findNode(nodeId) : null;
  const type = ns?.node_type ?? nodeType ?? null;
  const verb = NODE_VERB[type] ?? "compute";
  const state = ns?.state ?? "idle";
  const model = { state, classes: ["h3-readout", `h3-state-${state}`], title: "", lines: [], slow: [] };
  const timing = ns?.timing ?? null;
  const summary = timing?.summary ?? null;
  const machine = (summary && (summary.machine === "A" || summary.machine === "B") ? summary.machine : null) ??
    NODE_MACHINE[type] ?? "A";
  const live = ns?.progress && !ns.progress.final && (!timing || timing.request_id !== ns.progress.request_id);

  if (state === "error") {
    model.lines.push([{ text: `${machine} ${verb} failed`, cls: "h3-error", key: "error" }]);
    model.title = ns.error ?? "failed";
    model.classes.push("h3-has-error");
    return model;
  }
  if (live) {
    const ps = progressSteps(ns.progress);
    const st = stepStats(ps.map((e) => e.seconds));
    const done = ps.length ? ps[ps.length - 1].step : 0;
    const total = ns.progress.total;
    model.lines.push([
      { text: `${machine} ${verb} ${fmtSeconds(st.total_s)}`, cls: "h3-compute", key: "compute" },
      { text: `step ${done}/${total ?? "?"}`, cls: "h3-steps", key: "steps" },
    ]);
    const detail = [];
    if (ps.length) detail.push({ text: `last step ${fmtSeconds(ps[ps.length - 1].seconds)}`, cls: "h3-detail", key: "last" });
    if (total !== null && total > done && st.mean_s !== null) {
      detail.push({ text: `~${fmtSeconds(st.mean_s * (total - done))} left`, cls: "h3-detail", key: "eta" });
    }
    if (detail.length) model.lines.push(detail);
    model.title = `request ${ns.progress.request_id ?? "–"}\n` +
      ps.map((e) => `step ${e.step}: ${fmtSeconds(e.seconds)}`).join("\n");
    model.classes.push("h3-live");
    return model;
  }
  if (!timing || state === "running") {
    if (state === "running") {
      model.lines.push([{ text: `${machine} ${verb} running…`, cls: "h3-running", key: "running" }]);
      model.title = "running";
    } else {
      model.lines.push([{ text: `${machine} ${verb} –`, cls: "h3-muted", key: "idle" }]);
      model.title = "no H3 timing yet";
    }
    return model;
  }

  const rid = timing.request_id;
  const span = rid ? store.requestSpan(rid) : null;
  const total = span && span.total_s > 0 ? span.total_s : null;
  const line0 = [{ text: `${machine} ${verb} ${fmtSeconds(summary?.compute_s)}`, cls: "h3-compute", key: "compute" }];
  const line1 = [];
  const titles = [`${type ?? "node"} ${ns.id}${rid ? ` · request ${rid}` : ""}`,
                  `${machine} ${verb}: ${fmtSeconds(summary?.compute_s)}`];
  const stepsDone = num(summary?.steps_done);
  const stepsTotal = num(summary?.steps_total);
  if (stepsDone !== null || stepsTotal !== null) {
    line0.push({ text: `step ${stepsDone ?? "?"}/${stepsTotal ?? "?"}`, cls: "h3-steps", key: "steps" });
  }
  for (const dir of TRANSFER_STAGES) {
    const f = transferFigures(summary?.[dir]);
    if (!f) continue;
    const label = stageLabel(dir);
    const share = total ? f.receive_s / total : null;
    const slow = share !== null && share > warnShare;
    const title = transferTitle(label, f, share);
    line0.push({ text: `${label} ${fmtSeconds(f.receive_s)}`, cls: slow ? "h3-xfer h3-slow" : "h3-xfer", key: dir, title });
    line1.push({ text: `${label} fetch ${fmtSeconds(f.fetch_s)} + mat ${fmtSeconds(f.materialize_s)}`,
                 cls: slow ? "h3-detail h3-slow" : "h3-detail", key: `${dir}_split`, title });
    titles.push(title);
    if (slow) model.slow.push(dir);
  }
  if (!line1.length) {
    if (rid) line1.push({ text: `req ${shortId(rid)}`, cls: "h3-detail", key: "request" });
    const nodes = [...new Set(timing.stages.map((r) => r.node).filter(Boolean))];
    if (nodes.length) line1.push({ text: nodes.join(", "), cls: "h3-detail", key: "where" });
    const bytes = timing.stages.reduce((a, r) => a + (r.total_bytes || 0), 0);
    if (bytes) line1.push({ text: fmtBytes(bytes), cls: "h3-detail", key: "bytes" });
  }
  for (const r of timing.stages) titles.push(recordTitle(r));
  if (total) titles.push(`request total ${fmtSeconds(total)} (so far)`);
  if (state === "cached") titles.push("(cached: figures of the run that produced this output)");
  model.lines.push(line0);
  if (line1.length) model.lines.push(line1);
  const ranks = ranksLine(summary);
  if (ranks) {
    model.lines.push([{ text: ranks, cls: "h3-detail h3-ranks", key: "ranks" }]);
    titles.push(ranks);
  }
  if (typeof summary?.schedule === "string" && summary.schedule) {
    // the effective schedule B ran (steps, sigma shifts, LoRA adapters and their switch time)
    model.lines.push([{ text: summary.schedule, cls: "h3-detail h3-schedule", key: "schedule" }]);
    titles.push(`schedule: ${summary.schedule}`);
  }
  model.title = titles.join("\n");
  if (model.slow.length) model.classes.push("h3-has-slow");
  return model;
}

/** The compact text of a readout model (lines joined with " · ", one per line). */
export function readoutText(model) {
  return model.lines.map((line) => line.map((p) => p.text).join(" · ")).join("\n");
}

export { recordTitle };

// ------------------------------------------------------------------------------------------------ status

function healthRole(role, h, topo) {
  const versions = h && typeof h.versions === "object" && h.versions ? h.versions : {};
  const mem = h && typeof h.memory === "object" && h.memory ? h.memory : {};
  const memParts = [];
  if (num(mem.cuda_allocated_mb) !== null) {
    memParts.push(`GPU ${fmtBytes(mem.cuda_allocated_mb * 2 ** 20)}${num(mem.cuda_total_mb) !== null ? ` / ${fmtBytes(mem.cuda_total_mb * 2 ** 20)}` : ""}`);
  }
  if (num(mem.rss_mb) !== null) memParts.push(`RSS ${fmtBytes(mem.rss_mb * 2 ** 20)}`);
  return {
    role,
    ip: h?.node_ip ?? topo?.ip ?? null,
    node_id: h?.node_id ?? topo?.node_id ?? null,
    healthy: h ? h.ok !== false : null,
    device: h?.device ?? null,
    dtype: h?.dtype ?? null,
    attention_backend: h?.attention_backend ?? null,
    partition: h?.partition ?? null,
    busy: h?.busy ?? null,
    uptime_s: num(h?.uptime_s),
    memory: memParts.join(", "),
    versions,
    hostname: h?.hostname ?? null,
  };
}

/**
 * The DiT workers of a pool, from `GET /h3/status`'s `workers`: one row each with its node, resident partitions,
 * queue (requests and queued steps), the request it runs now and the client it serves.
 */
export function workerRows(workers) {
  if (!Array.isArray(workers)) return [];
  return workers.filter((w) => w && typeof w === "object").map((w) => {
    const queue = Array.isArray(w.queue) ? w.queue.filter((q) => q && typeof q === "object") : [];
    return {
      name: String(w.name ?? "?"), node: w.node ?? null,
      partitions: Array.isArray(w.partitions) ? w.partitions.map(String) : [],
      queued: queue.filter((q) => q.state !== "running").length, queuedSteps: num(w.queued_steps) ?? 0,
      current: w.current_request ?? null, client: w.client ?? null,
      step: w.current && typeof w.current === "object" ? num(w.current.step) : null,
      total: w.current && typeof w.current === "object" ? num(w.current.total) : null,
      clients: [...new Set(queue.map((q) => q.client).filter(Boolean).map(String))],
    };
  });
}

/** One line per worker: `h3_dit_b2 @ 10.0.0.3 · transformer · running ab12cd 3/8 for host:pid · 2 queued (16 steps)`. */
export function workerText(w) {
  const bits = [`${w.name}${w.node ? ` @ ${w.node}` : ""}`];
  if (w.partitions.length) bits.push(w.partitions.join(" + "));
  bits.push(w.current ? `running ${shortId(w.current)}${w.total ? ` ${w.step ?? 0}/${w.total}` : ""}` +
    `${w.client ? ` for ${w.client}` : ""}` : "idle");
  if (w.queued) bits.push(`${w.queued} queued (${w.queuedSteps} steps)`);
  return bits.join(" · ");
}

/**
 * What the status section shows, from `GET /h3/status` (or null when it could not be fetched):
 * `{ok, warning, detail, cluster, roles: [{role, ip, ...}], nodes, actors, encoders, mismatches, workers}`.
 */
export function statusModel(status, { fetchError = null } = {}) {
  const m = { ok: false, warning: null, detail: null, cluster: "", roles: [], nodes: [], actors: [], encoders: [],
              mismatches: [], workers: [], time: null };
  if (!status || typeof status !== "object") {
    m.warning = "H3 status unavailable";
    m.detail = fetchError ? String(fetchError) : "no answer from /h3/status";
    return m;
  }
  const connected = status.connected === true;
  const error = typeof status.error === "string" && status.error !== "" ? status.error : null;
  const cl = status.cluster && typeof status.cluster === "object" ? status.cluster : {};
  m.cluster = [cl.mode, cl.address].filter(Boolean).join(" ") || (connected ? "connected" : "not connected");
  m.nodes = Array.isArray(status.nodes) ? status.nodes.map(String) : [];
  m.time = num(status.time);
  const topo = status.topology && typeof status.topology === "object" ? status.topology : {};
  const actors = Array.isArray(status.actors) ? status.actors.filter((a) => a && typeof a === "object") : [];
  const health = { A: null, B: null };
  for (const a of actors) {
    const h = a.health && typeof a.health === "object" ? a.health : {};
    m.actors.push({ name: a.name ?? "?", namespace: a.namespace ?? null, partition: a.partition ?? null,
                    error: a.error ?? null, healthy: !a.error });
    for (const role of ["A", "B"]) if (!health[role] && h[role]) health[role] = h[role];
  }
  for (const role of ["A", "B"]) {
    if (health[role] || topo[role]) m.roles.push(healthRole(role, health[role], topo[role]));
  }
  m.encoders = Array.isArray(status.encoders) ? status.encoders.filter((e) => e && typeof e === "object") : [];
  m.workers = workerRows(status.workers);
  const a = health.A?.versions;
  const b = health.B?.versions;
  if (a && b && typeof a === "object" && typeof b === "object") {
    for (const k of Object.keys(a)) {
      if (k in b && String(a[k]) !== String(b[k])) m.mismatches.push({ name: k, A: String(a[k]), B: String(b[k]) });
    }
  }
  const actorError = m.actors.find((x) => x.error)?.error ?? null;
  if (!connected || error || actorError) {
    m.warning = "B unreachable";
    m.detail = error ?? actorError ?? "not connected to the Ray cluster";
  } else {
    m.ok = true;
  }
  return m;
}

// ------------------------------------------------------------------------------------------------ model pickers

/** The node type whose `model_path` picker lists what machine B has. */
export const B_MODEL_NODE_TYPE = "H3RemoteDiT";
export const MODEL_WIDGET = "model_path";

function modelList(list) {
  if (!Array.isArray(list)) return null;
  const out = [];
  for (const m of list) {
    if (typeof m === "string" && m.trim() !== "" && !out.includes(m)) out.push(m);
  }
  return out.length ? out : null;
}

/**
 * B's model choices from a payload, or null when it carries none: an `h3.timing` of H3RemoteDiT
 * (`summary.b_models`), or a `GET /h3/status` answer (`models.B`).
 */
export function bModelsFrom(payload) {
  if (!payload || typeof payload !== "object") return null;
  if ("node_type" in payload || "summary" in payload) {
    if (payload.node_type !== B_MODEL_NODE_TYPE) return null;
    return modelList(payload.summary?.b_models);
  }
  const models = payload.models;
  return models && typeof models === "object" ? modelList(models.B) : null;
}

/** Whether two choice lists are the same, in order. */
export function sameChoices(a, b) {
  return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => x === b[i]);
}
