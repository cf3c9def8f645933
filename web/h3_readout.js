// comfy-h3 web extension: what the readout widget on each H3 node shows, and how much room it takes.
//
// Pure ES module: no ComfyUI import, no DOM access, no side effects at load time (ComfyUI also loads it as an
// extension script on its own); node's test runner imports it (tests/web/).
//
// Every readout is a list of lines, each a list of parts; a part wraps inside the node (never cut). Each node type
// reserves its readout's height from the node's creation (READOUT_LINES), so that a run fills the readout without
// growing the node over its neighbour. Data contract: docs/events.md (`h3.timing` summaries, `h3.progress`).

import {
  DEFAULT_WARN_SHARE, fmtBytes, fmtPercent, fmtSeconds, groupMachines, groupStartText, H3_NODES, NODE_VERB, num,
  progressSteps, ranksLine, recordTitle, shortId, stageLabel, stepStats, TRANSFER_STAGES, transferFigures,
} from "./h3_view.js";

/** Height of one readout line and the readout's vertical padding, in CSS pixels (canvas units at zoom 1). */
export const READOUT_LINE_PX = 14;
export const READOUT_PAD_PX = 6;
/**
 * Lines each node type's readout reserves from the node's creation: the longest its run fills (measured in the real
 * frontend at the templates' node width; tests/test_web_frontend.py checks that a run's text fits).
 */
export const READOUT_LINES = Object.freeze({
  H3LoadEncoders: 6, H3RemoteDiT: 9, H3LoRA: 4, H3Keyframes: 2, H3References: 2, H3PromptList: 3, H3TextEncode: 3,
  H3RemoteDenoise: 8, H3Decode: 5, H3SaveVideo: 3,
  // ComfyUI's own graph with the DiT on B: H3RemoteModel, and the core sampler that drove B ("sampler" records)
  H3RemoteModel: 5, sampler: 6,
});
/** The readouts on ComfyUI's own nodes: what their records call the work, on B. */
const CORE_VERB = { sampler: "sampling", H3RemoteModel: "connect" };
const CORE_MACHINE = { sampler: "B", H3RemoteModel: "B" };

/** The readout's height in CSS pixels for a node type (or for `lines` lines). */
export function readoutHeight(nodeType, lines = null) {
  const n = lines ?? READOUT_LINES[nodeType] ?? 2;
  return n * READOUT_LINE_PX + READOUT_PAD_PX;
}

const NODE_MACHINE = Object.fromEntries(Object.entries(H3_NODES).map(([k, v]) => [k, v.machine]));

// ------------------------------------------------------------------------------------------------ wording

/**
 * B's count of a denoise, in the words the node's `steps` input uses: `steps` is the schedule's sigma points, B
 * evaluates the model once per interval between two of them (a "forward"), so 50 sigma points are 49 forwards.
 * `done` and `forwards` count forwards (what h3.progress reports).
 */
export function forwardsText(done, forwards) {
  const d = num(done);
  const t = num(forwards);
  if (t === null) return `forward ${d ?? "?"}`;
  return `forward ${d ?? 0} of ${t} (${t + 1} sigma points)`;
}

/** A finished denoise's count: all forwards run, or where it stopped. */
export function forwardsDoneText(done, forwards) {
  const d = num(done);
  const t = num(forwards);
  if (d !== null && t !== null && d < t) return `stopped after ${forwardsText(d, t)}`;
  const n = t ?? d;
  return n === null ? "" : `${n} forwards (${n + 1} sigma points)`;
}

/** What the previews of a finished denoise were (`summary.preview`), or why there were none; led by the method that
 * ran and why (`fallback`) when it is not the one ComfyUI's preview method asked for. */
export function previewText(p) {
  if (!p || typeof p !== "object") return null;
  const count = num(p.count);
  const fallback = typeof p.fallback === "string" && p.fallback ? p.fallback : null;
  if (count !== null && count > 0) {
    const size = Array.isArray(p.size) && p.size.length === 2 ? `${p.size[0]}x${p.size[1]} ` : "";
    const bits = [`${fallback ? `${fallback}: ` : "previews: "}${count} × ${size}JPEG`];
    if (num(p.bytes) !== null) bits.push(`${fmtBytes(p.bytes)} each`);
    if (num(p.share_of_step) !== null) bits.push(`${fmtPercent(p.share_of_step)} of a forward on B`);
    else if (num(p.cost_s) !== null) bits.push(`${fmtSeconds(p.cost_s)} on B in all`);
    if (num(p.every) !== null && p.every > 1) bits.push(`every ${p.every} forwards`);
    return bits.join(", ");
  }
  return typeof p.note === "string" && p.note ? p.note : null;
}

/** The newest live preview of a running denoise (`preview` of h3.progress). */
export function livePreviewText(p) {
  if (!p) return null;
  return `preview ${p.width}x${p.height}${p.bytes !== null ? `, ${fmtBytes(p.bytes)}` : ""}` +
    (p.step !== null ? ` (forward ${p.step})` : "");
}

/** `[k, N]` as words: `request 2 of 4`. */
export function batchText(batch) {
  return Array.isArray(batch) && batch.length === 2 ? `request ${batch[0]} of ${batch[1]}` : null;
}

/**
 * The clips B decoded of a split decode (its decode record: machine B, `info.clips` = [start, stop), `info.of`),
 * as `{text, start, stop, of}`, or null when A decoded alone.
 */
export function decodeShare(records) {
  for (const r of records ?? []) {
    const clips = r?.info?.clips;
    if (r?.stage !== "decode" || r.machine !== "B" || !Array.isArray(clips) || clips.length !== 2) continue;
    const [start, stop] = clips.map(num);
    const of = num(r.info.of);
    if (start === null || stop === null || stop <= start) continue;
    const n = stop - start;
    const which = n === 1 ? `clip ${start + 1}` : `clips ${start + 1}-${stop}`;
    return { start, stop, of, text: `B decoded ${n} of ${of ?? "?"} clips (${which}), A the rest` };
  }
  return null;
}

/** The LoRA adapters of an H3LoRA's summary: `tiny-random × 1, style.safetensors × 0.6`. */
export function adaptersText(summary) {
  const list = Array.isArray(summary?.adapters) ? summary.adapters : [];
  const parts = list.filter((a) => Array.isArray(a) && a.length >= 2)
    .map(([path, w]) => `${String(path).split("/").pop()} × ${num(w) ?? w}`);
  return parts.length ? `adapters: ${parts.join(", ")}` : null;
}

/** Splits a sentence of `a · b · c` parts into its parts (the server joins a status line's items that way). */
export function sentenceParts(text) {
  return typeof text === "string" && text ? text.split(" · ").map((x) => x.trim()).filter(Boolean) : [];
}

// ------------------------------------------------------------------------------------------------ the model

function transferTitle(label, f, share) {
  const lines = [`${label}: ${fmtSeconds(f.receive_s)} = fetch ${fmtSeconds(f.fetch_s)} + materialise ${fmtSeconds(f.materialize_s)}`];
  if (f.producer_wait_s) lines.push(`  producer wait ${fmtSeconds(f.producer_wait_s)}`);
  if (f.serialize_s) lines.push(`  serialise ${fmtSeconds(f.serialize_s)}`);
  if (f.validate_s) lines.push(`  validate ${fmtSeconds(f.validate_s)}`);
  if (f.bytes) lines.push(`  ${fmtBytes(f.bytes)}`);
  if (share !== null && share !== undefined) lines.push(`  ${fmtPercent(share)} of the request`);
  return lines.join("\n");
}

const detail = (text, key, cls = "") => ({ text, cls: `h3-detail${cls ? ` ${cls}` : ""}`, key });

/** The lines below the figure line of a finished node, by node type. */
function bodyLines(type, timing, summary) {
  const s = summary ?? {};
  const rec = timing.stages[0] ?? null;
  const lines = [];
  const note = rec?.note ?? "";
  if (type === "H3RemoteDiT") {
    const status = sentenceParts(s.status ?? note);
    for (const [i, part] of status.entries()) lines.push([detail(part, `status${i}`, "h3-status-line")]);
    if (typeof s.memory_plan === "string" && s.memory_plan && !status.includes(s.memory_plan)) {
      lines.push([detail(s.memory_plan, "memory_plan")]);
    }
  } else if (type === "H3LoRA") {
    const adapters = adaptersText(s) ?? (note ? `adapters: ${note}` : null);
    if (adapters) lines.push([detail(adapters, "adapters")]);
    if (typeof s.resolved === "string" && s.resolved) lines.push([detail(`file on B: ${s.resolved}`, "resolved")]);
  } else if (type === "H3PromptList") {
    const n = num(s.prompts);
    const seeds = Array.isArray(s.seeds) ? s.seeds : null;
    if (n !== null && seeds) {
      lines.push([detail(`${n} prompts`, "prompts"),
                  detail(`seeds ${seeds.slice(0, 4).join(", ")}${seeds.length > 4 ? ", …" : ""}`, "seeds")]);
    } else if (note) lines.push([detail(note, "note")]);
  } else if (type === "H3TextEncode") {
    const what = [s.workflow, s.canvas, num(s.num_frames) !== null ? `${s.num_frames} frames` : null].filter(Boolean);
    const line = [];
    if (what.length) line.push(detail(what.join(" "), "what"));
    const batch = batchText(s.batch);
    if (batch) line.push(detail(batch, "batch"));
    if (timing.request_id) line.push(detail(`request ${shortId(timing.request_id)}`, "request"));
    const bytes = timing.stages.reduce((a, r) => a + (r.total_bytes || 0), 0);
    if (bytes) line.push(detail(fmtBytes(bytes), "bytes"));
    if (line.length) lines.push(line);
  } else if (type === "H3Decode") {
    const share = decodeShare(timing.stages);
    const line = [];
    if (timing.request_id) line.push(detail(`request ${shortId(timing.request_id)}`, "request"));
    const batch = batchText(s.batch);
    if (batch) line.push(detail(batch, "batch"));
    if (num(s.frames) !== null) line.push(detail(`${s.frames} frames`, "frames"));
    if (line.length) lines.push(line);
    if (share) lines.push([detail(share.text, "b_share", "h3-b-share")]);
    if (typeof s.decode_on === "string" && s.decode_on) {
      // the plan's reason; its own "B decodes clips a-b of n" (counted from 0) is the share line above
      const why = share ? s.decode_on.replace(/^B decodes clips \d+-\d+ of \d+(: )?/, "") : s.decode_on;
      if (why) lines.push([detail(share ? `why: ${why}` : `A decoded alone: ${why}`, "decode_on")]);
    }
  } else if (type === "H3SaveVideo") {
    const file = note ? note.split("/").pop() : "";
    const bytes = timing.stages.reduce((a, r) => a + (r.total_bytes || 0), 0);
    const line = [];
    if (file) line.push(detail(file, "file"));
    if (bytes) line.push(detail(fmtBytes(bytes), "bytes"));
    if (line.length) lines.push(line);
  } else if (type === "sampler" || type === "H3RemoteModel") {
    // forwards, B's compute, the hand-offs and the LoRAs of a core sampler; the connection of H3RemoteModel
    const text = typeof s.status === "string" && s.status ? s.status : note;
    for (const [i, part] of text.split("; ").filter(Boolean).entries()) lines.push([detail(part, `note${i}`)]);
  } else if (note) {
    for (const [i, part] of sentenceParts(note).entries()) lines.push([detail(part, `note${i}`)]);
  }
  return lines;
}

/**
 * What the readout widget of one node shows: `{state, classes, title, lines: [[{text, cls, title, key}], ...],
 * slow}`. Line 0 is the figure line (the node's own compute, and a denoise's transfers); the lines below say what
 * ran, by node type.
 */
export function readoutModel(store, nodeId, { warnShare = DEFAULT_WARN_SHARE, nodeType = null } = {}) {
  const ns = store ? store.findNode(nodeId) : null;
  const type = ns?.node_type ?? nodeType ?? null;
  const verb = NODE_VERB[type] ?? CORE_VERB[type] ?? "compute";
  const state = ns?.state ?? "idle";
  const model = { state, classes: ["h3-readout", `h3-state-${state}`], title: "", lines: [], slow: [] };
  const timing = ns?.timing ?? null;
  const summary = timing?.summary ?? null;
  const ownMachine = (summary && (summary.machine === "A" || summary.machine === "B") ? summary.machine : null) ??
    NODE_MACHINE[type] ?? CORE_MACHINE[type] ?? "A";
  const live = ns?.progress && !ns.progress.final && (!timing || timing.request_id !== ns.progress.request_id);

  if (state === "error") {
    model.lines.push([{ text: `${ownMachine} ${verb} failed`, cls: "h3-error", key: "error" }]);
    if (ns.error) model.lines.push([detail(ns.error, "error_text", "h3-error")]);
    model.title = ns.error ?? "failed";
    model.classes.push("h3-has-error");
    return model;
  }
  if (live) return liveModel(model, ns, ownMachine, verb);
  if (!timing || state === "running") {
    if (state === "running") {
      model.lines.push([{ text: `${ownMachine} ${verb} running…`, cls: "h3-running", key: "running" }]);
      model.title = "running";
    } else {
      model.lines.push([{ text: `${ownMachine} ${verb} –`, cls: "h3-muted", key: "idle" }]);
      model.title = "no H3 timing yet";
    }
    return model;
  }

  // a split decode ran on both machines (its records list B's share first)
  const decodedBy = type === "H3Decode" && decodeShare(timing.stages) ? "A+B" : null;
  // a DiT group's denoise: its machines, and compute_s is the group's wall time (each rank's is on its own line)
  const grouped = type === "H3RemoteDenoise" ? groupMachines(summary) : null;
  const machine = decodedBy ?? grouped ?? ownMachine;
  const rid = timing.request_id;
  const span = rid ? store.requestSpan(rid) : null;
  const total = span && span.total_s > 0 ? span.total_s : null;
  const line0 = [{ text: `${machine} ${verb} ${fmtSeconds(summary?.compute_s)}`, cls: "h3-compute", key: "compute" }];
  const titles = [`${type ?? "node"} ${ns.id}${rid ? ` · request ${rid}` : ""}`,
                  `${machine} ${verb}: ${fmtSeconds(summary?.compute_s)}`];
  const lines = [line0];
  if (type === "H3RemoteDenoise") denoiseLines(model, lines, timing, summary, total, warnShare, titles);
  else lines.push(...bodyLines(type, timing, summary));
  for (const r of timing.stages) titles.push(recordTitle(r));
  if (total) titles.push(`request total ${fmtSeconds(total)} (so far)`);
  if (state === "cached") titles.push("(cached: figures of the run that produced this output)");
  model.lines = lines;
  model.title = titles.join("\n");
  if (model.slow.length) model.classes.push("h3-has-slow");
  return model;
}

function denoiseLines(model, lines, timing, summary, total, warnShare, titles) {
  const s = summary ?? {};
  const den = timing.stages.find((r) => r.stage === "denoise" && !r.rank) ?? null;
  const line0 = lines[0];
  const done = num(s.steps_done);
  const forwards = num(s.steps_total);
  const steps = den?.steps?.length ? stepStats(den.steps) : null;
  if (steps?.mean_s !== null && steps?.mean_s !== undefined) {
    line0.push({ text: `${fmtSeconds(steps.mean_s)} per forward`, cls: "h3-steps", key: "per_forward" });
  }
  if (done !== null && forwards !== null && done < forwards) {
    line0.push({ text: forwardsDoneText(done, forwards), cls: "h3-steps", key: "steps" });
  }
  const split = [];
  for (const dir of TRANSFER_STAGES) {
    const f = transferFigures(s[dir]);
    if (!f) continue;
    const label = stageLabel(dir);
    const share = total ? f.receive_s / total : null;
    const slow = share !== null && share > warnShare;
    const title = transferTitle(label, f, share);
    line0.push({ text: `${label} ${fmtSeconds(f.receive_s)}`, cls: slow ? "h3-xfer h3-slow" : "h3-xfer", key: dir, title });
    split.push({ text: `${label} fetch ${fmtSeconds(f.fetch_s)} + mat ${fmtSeconds(f.materialize_s)}`,
                 cls: slow ? "h3-detail h3-slow" : "h3-detail", key: `${dir}_split`, title });
    titles.push(title);
    if (slow) model.slow.push(dir);
  }
  if (split.length) lines.push(split);
  const batch = batchText(s.batch);
  if (typeof s.schedule === "string" && s.schedule) {
    // the schedule B ran, in the server's words: sigma points and forwards, partition, shifts, LoRA adapters
    lines.push([detail(s.schedule, "schedule", "h3-schedule"), ...(batch ? [detail(batch, "batch")] : [])]);
    titles.push(`schedule: ${s.schedule}`);
  } else {
    const text = forwardsDoneText(done, forwards);
    if (text || batch) lines.push([...(text ? [detail(text, "forwards")] : []), ...(batch ? [detail(batch, "batch")] : [])]);
  }
  const ranks = ranksLine(s);
  if (ranks) {
    lines.push([detail(ranks, "ranks", "h3-ranks")]);
    titles.push(ranks);
    const start = groupStartText(s);
    const auto = typeof s.ran?.auto_view === "string" && s.ran.auto_view ? s.ran.auto_view : null;
    for (const [text, key] of [[start, "group_start"], [auto, "auto_view"]]) {
      if (!text) continue;
      lines.push([detail(text, key)]);
      titles.push(text);
    }
  }
  const preview = previewText(s.preview);
  if (preview) {
    lines.push([detail(preview, "preview", "h3-preview")]);
    if (s.preview?.note && !preview.includes(s.preview.note)) titles.push(s.preview.note);
  }
}

function liveModel(model, ns, machine, verb) {
  const ps = progressSteps(ns.progress);
  const st = stepStats(ps.map((e) => e.seconds));
  const done = ps.length ? ps[ps.length - 1].step : 0;
  const total = ns.progress.total;
  model.lines.push([
    { text: `${machine} ${verb} ${fmtSeconds(st.total_s)}`, cls: "h3-compute", key: "compute" },
    { text: forwardsText(done, total), cls: "h3-steps", key: "steps" },
  ]);
  // a DiT rank was lost mid-denoise: the request runs again on the ranks left, counted from its first forward
  if (ns.progress.restart) model.lines.push([detail(ns.progress.restart, "restart", "h3-error")]);
  const more = [];
  if (ps.length) more.push(detail(`last forward ${fmtSeconds(ps[ps.length - 1].seconds)}`, "last"));
  if (total !== null && total > done && st.mean_s !== null) more.push(detail(`~${fmtSeconds(st.mean_s * (total - done))} left`, "eta"));
  const batch = batchText(ns.progress.batch);
  if (batch) more.push(detail(batch, "batch"));
  if (more.length) model.lines.push(more);
  const preview = livePreviewText(ns.progress.preview);
  if (preview) model.lines.push([detail(preview, "preview", "h3-preview")]);
  model.title = `request ${ns.progress.request_id ?? "–"}\n` +
    ps.map((e) => `forward ${e.step}: ${fmtSeconds(e.seconds)}`).join("\n");
  model.classes.push("h3-live");
  return model;
}

/** The compact text of a readout model (lines joined with " · ", one per line). */
export function readoutText(model) {
  return model.lines.map((line) => line.map((p) => p.text).join(" · ")).join("\n");
}
