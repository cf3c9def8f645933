// comfy-h3 web extension: what the status section of the timeline panel shows, from `GET /h3/status`.
//
// Pure ES module: no ComfyUI import, no DOM access, no side effects at load time (ComfyUI also loads it as an
// extension script on its own). Data contract: docs/events.md (`GET /h3/status`).

import { fmtBytes, fmtSeconds, num, shortId } from "./h3_view.js";

function healthRole(role, h, topo, inProcess = null) {
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
    healthy: h ? h.ok !== false : inProcess ? true : null,
    // A without a health entry of its own: the encoders run inside ComfyUI's process (no actor to ask)
    in_process: !h && !!inProcess,
    pid: h?.pid ?? inProcess?.pid ?? null,
    device: h?.device ?? null,
    dtype: h?.dtype ?? null,
    attention_backend: h?.attention_backend ?? null,
    partition: h?.partition ?? null,
    busy: h?.busy ?? null,
    uptime_s: num(h?.uptime_s),
    memory: memParts.join(", "),
    versions,
    hostname: h?.hostname ?? inProcess?.hostname ?? null,
    encoders: inProcess?.encoders ?? [],
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
      // A's DiT rank (parallel denoise) is listed with the workers: its machine and process say which it is
      machine: w.machine === "A" ? "A" : "B", pid: num(w.pid), error: typeof w.error === "string" ? w.error : null,
      held: heldParts(w.resident_bytes),
      released: w.released && typeof w.released === "object" ? w.released : null,
    };
  });
}

/** `{part: bytes}` (a worker's or A's own count of what it holds) as `[[part, bytes], ...]`, numbers only. */
export function heldParts(bytes) {
  if (!bytes || typeof bytes !== "object") return [];
  return Object.entries(bytes).filter(([, v]) => num(v) !== null).map(([k, v]) => [String(k), num(v)]);
}

/** `transformer 12.0 MiB + vae decoder 3.1 MiB (15.1 MiB)`, or `weights released (why)`, or "". */
export function heldText(held, released) {
  if (released) return `weights released${released.cause ? ` (${released.cause})` : ""}: the next run reloads them`;
  if (!held.length) return "";
  const total = held.reduce((s, [, v]) => s + v, 0);
  return `holds ${held.map(([k, v]) => `${k} ${fmtBytes(v)}`).join(" + ")}${held.length > 1 ? ` (${fmtBytes(total)})` : ""}`;
}

/** One line per worker: `h3_dit_b2 @ 10.0.0.3 · transformer · running ab12cd 3/8 for host:pid · 2 queued (16 steps)`. */
export function workerText(w) {
  const bits = [`${w.name}${w.node ? ` @ ${w.node}` : ""}` +
    (w.machine === "A" ? ` (A's DiT rank${w.pid !== null && w.pid !== undefined ? `, pid ${w.pid}` : ""})` : "")];
  if (w.error) return [...bits, w.error].join(" · ");
  if (w.partitions.length) bits.push(w.partitions.join(" + "));
  bits.push(w.current ? `running ${shortId(w.current)}${w.total ? ` ${w.step ?? 0}/${w.total}` : ""}` +
    `${w.client ? ` for ${w.client}` : ""}` : "idle");
  if (w.queued) bits.push(`${w.queued} queued (${w.queuedSteps} steps)`);
  const held = heldText(w.held ?? [], w.released ?? null);
  if (held) bits.push(held);
  return bits.join(" · ");
}

/**
 * What the status section shows, from `GET /h3/status` (or null when it could not be fetched):
 * `{ok, warning, detail, cluster, roles: [{role, ip, ...}], nodes, actors, encoders, mismatches, workers}`.
 */
export function statusModel(status, { fetchError = null } = {}) {
  const m = { ok: false, warning: null, detail: null, cluster: "", roles: [], nodes: [], actors: [], encoders: [],
              mismatches: [], workers: [], time: null, aRank: null };
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
    // one line per worker spec: this process's connections to it (one per model / partition) are one actor line
    const same = m.actors.find((x) => x.name === (a.name ?? "?") && x.namespace === (a.namespace ?? null));
    if (same) {
      if (a.partition && !String(same.partition ?? "").split(", ").includes(a.partition)) {
        same.partition = same.partition ? `${same.partition}, ${a.partition}` : a.partition;
      }
      if (a.error && !same.error) Object.assign(same, { error: a.error, healthy: false });
    } else {
      m.actors.push({ name: a.name ?? "?", namespace: a.namespace ?? null, partition: a.partition ?? null,
                      error: a.error ?? null, healthy: !a.error });
    }
    for (const role of ["A", "B"]) if (!health[role] && h[role]) health[role] = h[role];
  }
  m.encoders = Array.isArray(status.encoders) ? status.encoders.filter((e) => e && typeof e === "object") : [];
  const aProcess = status.a_process && typeof status.a_process === "object" ? status.a_process : null;
  for (const role of ["A", "B"]) {
    const inProcess = role === "A" && !health.A && (aProcess?.in_process || (connected && topo.A)) ?
      { ...(aProcess ?? {}), encoders: m.encoders } : null;
    if (health[role] || topo[role] || inProcess) m.roles.push(healthRole(role, health[role], topo[role], inProcess));
  }
  m.workers = workerRows(status.workers);
  m.queue = Array.isArray(status.queue) ? status.queue.filter((q) => q && typeof q === "object") : [];
  const rank = status.a_rank && typeof status.a_rank === "object" ? status.a_rank : null;
  if (rank) m.aRank = { ...workerRows([{ ...rank, partitions: rank.partitions }])[0], error: rank.error ?? null };
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


/**
 * What waits for B, from `GET /h3/status`'s `queue` (ComfyUI's queue: the prompts holding a node that reaches B,
 * running first, then pending in the order ComfyUI runs them): "" when none.
 */
export function queueText(queue) {
  if (!Array.isArray(queue) || !queue.length) return "";
  const running = queue.filter((q) => q.state === "running");
  const pending = queue.filter((q) => q.state !== "running");
  const name = (q) => `#${q.number}${q.client_id ? ` (client ${String(q.client_id).slice(0, 6)})` : ""}`;
  const bits = [];
  if (running.length) bits.push(`running ${running.map(name).join(", ")}`);
  if (pending.length) bits.push(`${pending.length} pending: ${pending.slice(0, 5).map(name).join(", ")}` +
                                (pending.length > 5 ? `, … ${pending.length - 5} more` : ""));
  return `waiting for B: ${queue.length} prompt${queue.length === 1 ? "" : "s"} · ${bits.join(" · ")}`;
}

/** One role's status line: `{state, cls, text, title}`; `state` is the word after the role (ok, unhealthy, ...). */
export function roleText(r) {
  const bits = [];
  if (r.in_process) bits.push(`in ComfyUI's process${r.hostname ? ` on ${r.hostname}` : ""}${r.pid ? ` (pid ${r.pid})` : ""}`);
  bits.push(r.ip ?? "address unknown");
  if (r.node_id) bits.push(`node ${shortId(r.node_id, 8)}`);
  if (r.device) bits.push([r.device, r.dtype, r.attention_backend].filter(Boolean).join(" "));
  if (r.role === "B" && r.partition) bits.push(`partition ${r.partition}`);
  if (r.busy !== null && r.busy !== undefined) bits.push(r.busy ? "busy" : "idle");
  if (r.uptime_s !== null) bits.push(`up ${fmtSeconds(r.uptime_s)}`);
  if (r.memory) bits.push(r.memory);
  for (const e of r.encoders ?? []) {
    const rel = e.released && typeof e.released === "object" ? Object.keys(e.released) : [];
    const held = heldText(heldParts(e.resident_bytes), null);
    bits.push(`encoders ${[e.model_path, e.dtype].filter(Boolean).join(" ")}` + (held ? ` ${held}` : "") +
              (rel.length ? ` · released ${rel.join(", ")} (${Object.values(e.released)[0]}): the next run reloads` : ""));
  }
  const state = r.healthy === null ? "no health answer yet" : r.healthy ? "ok" : "unhealthy";
  const title = [`${r.role}: ${state}`, ...bits, r.hostname && !r.in_process ? `host ${r.hostname}` : null,
                 ...Object.entries(r.versions || {}).map(([k, v]) => `${k} ${v}`)].filter(Boolean).join("\n");
  return { state, cls: r.healthy ? "h3-ok" : r.healthy === null ? "h3-muted" : "h3-mismatch", text: bits.join(" · "), title };
}
