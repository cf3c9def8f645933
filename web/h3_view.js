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
  H3LoRA: { verb: "lora", machine: "B" },
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
export const MAX_LOADS = 40;
/** The stages that make a request's run: the prompt whose events carried them is the run's prompt. */
const RUN_STAGES = ["a_to_b", "denoise", "b_to_a"];

export const STAGE_ORDER = Object.freeze(["load", "connect", "lora", "prompts", "keyframes", "references", "encode",
                                          "a_to_b", "denoise", "sampling", "b_to_a", "decode", "save"]);
export const TRANSFER_STAGES = Object.freeze(["a_to_b", "b_to_a"]);
// "sampling": a ComfyUI sampler (KSampler, SamplerCustomAdvanced) whose model's forwards ran on B (H3RemoteModel)
const STAGE_LABEL = { a_to_b: "A->B", b_to_a: "B->A", sampling: "sampler (forwards on B)" };
const STAGE_MACHINE = { load: "A", connect: "B", lora: "B", prompts: "A", keyframes: "A", references: "A", encode: "A",
                        a_to_b: "B", denoise: "B", sampling: "B", b_to_a: "A", decode: "A", save: "A" };

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
  if (NORMALIZED.has(r)) return r; // already on A's clock: shifting it again would move it twice

  const fetch_s = num(r.fetch_s) ?? 0;
  const materialize_s = num(r.materialize_s) ?? 0;
  const bytes = parseBytes(r.bytes) ?? {};
  const rid = r.request_id;
  const out = {
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
    info: r.info && typeof r.info === "object" ? r.info : null,
  };
  NORMALIZED.add(out);
  return out;
}
const NORMALIZED = new WeakSet();

/** The parallel-denoise line of a readout: each rank's machine and time per forward, the communication share, the
 * method (`summary.ran.ranks` of a DiT group's denoise), or null for a one-worker denoise. */
export function ranksLine(summary) {
  const ranks = Array.isArray(summary?.ran?.ranks) ? summary.ran.ranks : null;
  if (!ranks || ranks.length < 2) return null;
  const shares = ranks.map((r) => num(r.comm_share)).filter((x) => x !== null);
  const comm = shares.length ? shares.reduce((a, b) => a + b, 0) / shares.length : null;
  // each rank's own time (they ran at once: the denoise's wall time leads the readout, not their sum)
  const parts = ranks.map((r) => {
    const m = r.machine === "A" || r.machine === "B" ? r.machine : "?";
    const per = `${fmtSeconds(r.step_s)}/forward`;
    return num(r.compute_s) !== null ? `${m} ${fmtSeconds(r.compute_s)} (${per})` : `${m} ${per}`;
  });
  return `${ranks.length} ranks (${summary.ran.method ?? "ulysses"}): ${parts.join(", ")}` +
    (comm !== null ? ` · comm ${fmtPercent(comm)}` : "");
}

/** The machines of a DiT group's denoise (`A+B`), or null for one worker. */
export function groupMachines(summary) {
  const ranks = Array.isArray(summary?.ran?.ranks) ? summary.ran.ranks : null;
  if (!ranks || ranks.length < 2) return null;
  return [...new Set(ranks.map((r) => (r.machine === "A" || r.machine === "B" ? r.machine : "?")))].join("+");
}

/** What of a DiT group's wall time was its start (A's rank starting and loading, the group forming), or null. */
export function groupStartText(summary) {
  const st = summary?.ran?.start_s;
  const a = num(st?.a_rank) ?? 0;
  const g = num(st?.group) ?? 0;
  const parts = [];
  if (a > 0) parts.push(`A's DiT rank starting ${fmtSeconds(a)}`);
  if (g > 0) parts.push(`the group forming ${fmtSeconds(g)}`);
  return parts.length ? `includes the group's start: ${parts.join(", ")}` : null;
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

/** A batch position `[k, N]` (1 <= k <= N), else null. */
export function batchOf(b) {
  if (!Array.isArray(b) || b.length !== 2) return null;
  const [k, n] = b.map(num);
  return k !== null && n !== null && Number.isInteger(k) && Number.isInteger(n) && k >= 1 && k <= n ? [k, n] : null;
}

/** The `preview` of an h3.progress event: `{step, width, height, bytes}`, else null. */
export function previewOf(p) {
  if (!p || typeof p !== "object") return null;
  const width = num(p.width);
  const height = num(p.height);
  if (width === null || height === null) return null;
  return { step: num(p.step), width, height, bytes: num(p.bytes) };
}

/**
 * The records of a request's own run: without those that arrived with another prompt's events than the one that
 * ran its denoise (ComfyUI re-sends a cached node's output with the earlier prompt's payload: a cached encode ran
 * in an earlier prompt and must not stretch this run's row).
 */
export function runRecords(req) {
  if (!req || !Array.isArray(req.records)) return [];
  if (!req.run_prompt || !req.record_prompts?.size) return req.records;
  return req.records.filter((r) => {
    const pid = req.record_prompts.get(recordKey(r));
    return !pid || pid === req.run_prompt;
  });
}

/** The records of a request that ran in an earlier prompt (a cached encode), see runRecords(). */
export function cachedRecords(req) {
  const own = new Set(runRecords(req));
  return (req?.records ?? []).filter((r) => !own.has(r));
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
    this.nodes = new Map(); // node id (string) -> node state, of the workflow on screen
    this.activeWorkflow = null; // its name (the frontend's tab), when known
    this._workflowNodes = new Map(); // name -> node states of a workflow not on screen
    this.requests = new Map(); // request id -> request aggregate
    this.loads = []; // records without a request id (load, connect)
    this._loadKeys = new Set();
    this.promptId = null;
    this.promptNames = new Map(); // prompt id -> the workflow's name when the page queued it
    this.version = 0;
    this._seq = 0;
  }

  /** The name of the workflow a prompt was queued from (the frontend knows it when it queues). */
  setPromptName(promptId, name) {
    if (!promptId || typeof name !== "string" || !name.trim()) return false;
    const key = String(promptId);
    if (this.promptNames.get(key) === name) return false;
    this.promptNames.set(key, name.trim());
    while (this.promptNames.size > 4 * this.maxRequests) this.promptNames.delete(this.promptNames.keys().next().value);
    for (const req of this.requests.values()) if (req.run_prompt === key || req.prompt_id === key) req.version += 1;
    this._bump();
    return true;
  }

  _bump() {
    this.version += 1;
    this._seq += 1;
    return this._seq;
  }

  /**
   * The workflow on screen changed (another tab, another file opened): node ids are per workflow, so the readouts
   * show that workflow's own node states (kept while it was not on screen), not another graph's with the same ids.
   */
  setActiveWorkflow(name) {
    const next = typeof name === "string" && name ? name : null;
    if (next === this.activeWorkflow) return false;
    if (this.activeWorkflow !== null) this._workflowNodes.set(this.activeWorkflow, this.nodes);
    this.nodes = (next !== null && this._workflowNodes.get(next)) || new Map();
    if (next !== null) this._workflowNodes.delete(next);
    while (this._workflowNodes.size > 16) this._workflowNodes.delete(this._workflowNodes.keys().next().value);
    this.activeWorkflow = next;
    this._bump();
    return true;
  }

  /** The node states an event of `promptId` updates: those of the workflow it was queued from. */
  _nodesFor(promptId) {
    const name = promptId ? this.promptNames.get(String(promptId)) : undefined;
    if (!name || this.activeWorkflow === null || name === this.activeWorkflow) return this.nodes;
    let map = this._workflowNodes.get(name);
    if (!map) {
      map = new Map();
      this._workflowNodes.set(name, map);
    }
    return map;
  }

  /** The state of a node, created on first use. */
  node(id, map = this.nodes) {
    const key = nodeKey(id);
    let ns = map.get(key);
    if (!ns) {
      ns = { id: key, node_type: null, state: "idle", prompt_id: null, request_id: null, timing: null,
             progress: null, error: null, seq: 0 };
      map.set(key, ns);
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
      // run_prompt: the prompt that ran the request's denoise; record_prompts: record key -> the prompt whose event
      // carried it (a cached encode arrives again with the earlier prompt's id: it is not part of this run)
      req = { request_id: key, prompt_id: null, run_prompt: null, record_prompts: new Map(), workflow: null,
              batch: null, records: [], keys: new Set(), nodes: new Map(), progress: null, state: "running",
              error: null, seq: this._bump(), version: 0 };
      this.requests.set(key, req);
      this._trim();
    }
    return req ?? null;
  }

  _addRecords(req, records, promptId = null) {
    let added = 0;
    const pid = promptId === null || promptId === undefined || promptId === "" ? null : String(promptId);
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
      if (pid !== null && !target.record_prompts.has(k)) {
        target.record_prompts.set(k, pid);
        if (RUN_STAGES.includes(rec.stage) && target.run_prompt !== pid) {
          target.run_prompt = pid;
          target.version += 1;
        }
      }
      if (target.keys.has(k)) continue;
      target.keys.add(k);
      target.records.push(rec);
      target.records.sort((a, b) => (a.start ?? Infinity) - (b.start ?? Infinity) || stageRank(a.stage) - stageRank(b.stage));
      target.version += 1;
      // a request ends with its decode or save; a core sampler's sampling is one record sent when it ended
      if (target.records.some((r) => r.stage === "decode" || r.stage === "save" || r.stage === "sampling")) {
        target.state = "done";
      }
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
    const timed = runRecords(req).filter((r) => r.start !== null && r.end !== null);
    if (!timed.length) return null;
    const t0 = Math.min(...timed.map((r) => r.start));
    const t1 = Math.max(...timed.map((r) => r.end));
    return { t0, t1, total_s: Math.max(0, t1 - t0) };
  }

  // ---- ComfyUI execution events
  executionStart(data) {
    const pid = data && typeof data === "object" ? data.prompt_id ?? null : null;
    this.promptId = pid;
    for (const ns of this._nodesFor(pid).values()) {
      if (ns.state !== "idle") ns.state = "stale";
    }
    this._bump();
  }

  executionCached(data) {
    const ids = data && Array.isArray(data.nodes) ? data.nodes : [];
    const map = this._nodesFor(data?.prompt_id ?? this.promptId);
    for (const id of ids) {
      const ns = map.get(nodeKey(id));
      if (ns && (ns.timing || ns.progress)) ns.state = "cached";
    }
    if (ids.length) this._bump();
  }

  /** `executing`: the frontend passes the node id (or null when the prompt is done); objects are accepted too. */
  executing(detail) {
    let id = detail;
    if (detail && typeof detail === "object") id = detail.display_node ?? detail.node ?? null;
    const key = nodeKey(id);
    const map = this._nodesFor((detail && typeof detail === "object" ? detail.prompt_id : null) ?? this.promptId);
    for (const ns of map.values()) {
      if (ns.state === "running" && ns.id !== key) ns.state = ns.timing ? "done" : "stale";
    }
    if (key !== null) {
      const ns = this.node(key, map);
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
    const map = this._nodesFor(data?.prompt_id ?? this.promptId);
    for (const ns of map.values()) {
      if (ns.state === "running" && ns.id !== failedId) {
        ns.state = kind === "execution_interrupted" ? "interrupted" : ns.timing ? "done" : "stale";
      }
    }
    if (failedId !== null) {
      const ns = this.node(failedId, map);
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
      const added = this._addRecords(req, Array.isArray(p.stages) ? p.stages : [], p.prompt_id);
      if (added) this._bump();
      return added > 0;
    }
    const ns = this.node(p.node, this._nodesFor(p.prompt_id));
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
    let added = this._addRecords(req, stages, p.prompt_id);
    if (req) {
      if (p.prompt_id) req.prompt_id = p.prompt_id;
      const summary = ns.timing.summary ?? {};
      if (typeof summary.workflow === "string" && summary.workflow && req.workflow !== summary.workflow) {
        req.workflow = summary.workflow;
        added += 1;
      }
      const batch = batchOf(summary.batch);
      if (batch && String(batch) !== String(req.batch)) {
        req.batch = batch;
        added += 1;
      }
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
    // a DiT rank was lost: the request runs again from its first step; the count starts over and the reason stays
    const restart = typeof p.restart === "string" && p.restart ? p.restart : null;
    if (p.node !== null && p.node !== undefined) {
      const ns = this.node(p.node, this._nodesFor(p.prompt_id));
      if (!ns.node_type) ns.node_type = "H3RemoteDenoise";
      if (!ns.progress || ns.progress.request_id !== rid || restart) {
        const kept = ns.progress && ns.progress.request_id === rid ? ns.progress : null;
        ns.progress = { request_id: rid, total: null, steps: new Map(), final: false,
                        restart: restart ?? kept?.restart ?? null, batch: kept?.batch };
      }
      if (!restart) ns.progress.steps.set(step, seconds);
      if (total !== null) ns.progress.total = total;
      const preview = previewOf(p.preview);
      if (preview) ns.progress.preview = preview;
      const batch = batchOf(p.batch);
      if (batch) ns.progress.batch = batch;
      ns.request_id = rid;
      if (p.prompt_id) ns.prompt_id = p.prompt_id;
      if (!ns.progress.final) ns.state = "running";
      ns.seq = this._bump();
    }
    const req = this.request(rid);
    if (req) {
      if (!req.progress || restart) req.progress = { total: null, steps: new Map(), restart };
      if (!restart) req.progress.steps.set(step, seconds);
      if (total !== null) req.progress.total = total;
      if (p.prompt_id) {
        req.prompt_id = p.prompt_id;
        req.run_prompt = String(p.prompt_id);
      }
      const batch = batchOf(p.batch);
      if (batch) req.batch = batch;
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

  /**
   * ComfyUI's `GET /history` (`{prompt_id: {outputs: {node: {h3_timing: [payload...]}}}}`): the records of earlier
   * prompts with the prompt that carried them (so a cached encode stays out of a later run's row after a reload)
   * and each request's workflow and batch place. Node readouts are left alone: those prompts may be of another graph.
   */
  ingestHistory(history) {
    if (!history || typeof history !== "object" || Array.isArray(history)) return 0;
    let added = 0;
    for (const [pid, entry] of Object.entries(history)) {
      const outputs = entry && typeof entry === "object" && entry.outputs && typeof entry.outputs === "object" ? entry.outputs : {};
      for (const out of Object.values(outputs)) {
        const list = out && Array.isArray(out.h3_timing) ? out.h3_timing : [];
        for (const p of list) {
          if (!p || typeof p !== "object") continue;
          const rid = p.request_id === null || p.request_id === undefined || p.request_id === "" ? null : String(p.request_id);
          const req = rid ? this.request(rid) : null;
          added += this._addRecords(req, Array.isArray(p.stages) ? p.stages : [], p.prompt_id ?? pid);
          if (req) {
            const summary = p.summary && typeof p.summary === "object" ? p.summary : {};
            if (!req.workflow && typeof summary.workflow === "string") req.workflow = summary.workflow;
            if (!req.batch) req.batch = batchOf(summary.batch);
            if (typeof p.node_type === "string" && p.node !== undefined && p.node !== null) req.nodes.set(String(p.node), p.node_type);
          }
        }
      }
    }
    if (added) {
      this._trim();
      this._bump();
    }
    return added;
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

// ------------------------------------------------------------------------------------------------ record titles

/** The figures of one record, one per line (a bar's tooltip and the timeline's details line). */
export function recordTitle(r) {
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
    parts.push(`  ${st.count} forwards (${st.count + 1} sigma points), ${fmtSeconds(st.mean_s)} each ` +
               `(${fmtSeconds(st.min_s)}..${fmtSeconds(st.max_s)})`);
  }
  if (r.note) parts.push(`  ${r.note}`);
  return parts.join("\n");
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
