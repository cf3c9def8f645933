// comfy-h3 web extension: geometry of one request's waterfall (a lane for A, a lane for B, and one lane per rank of
// a DiT group when a request's denoise ran on several machines at once).
//
// Pure ES module: no ComfyUI import, no DOM access, no side effects at load time (ComfyUI also loads it as an
// extension script on its own). h3_dom.js turns the geometry into SVG; tests/web/ checks the numbers.

import {
  cachedRecords, defaultMachine, fmtPercent, fmtSeconds, normalizeRecord, progressSteps, recordSeconds, recordTitle,
  runRecords, stageLabel, stageRank, stepStats, TRANSFER_STAGES, transferFigures,
} from "./h3_view.js";

export const LANES = Object.freeze(["A", "B"]);

export const DEFAULT_LAYOUT = Object.freeze({
  width: 640, // total SVG width in px
  labelWidth: 24, // lane labels on the left
  padRight: 8,
  padTop: 4,
  laneHeight: 18,
  laneGap: 6,
  axisHeight: 16,
  minBarWidth: 2, // a bar never gets thinner than this, so that a short transfer stays visible (numbers stay exact)
  minGapShare: 0.002, // idle stretches shorter than this share of the request are not drawn
  minGapSeconds: 0.0005,
  targetTicks: 6,
  charWidth: 5.6, // estimated width of one character of a 10 px label (bars, gaps)
  // one character of a 9 px axis label, wide enough for DejaVu Sans (system-ui on Debian's Chromium), where "500 ms"
  // measures 33.5 px: 0.9 of charWidth (30.2 px) let such a label at the right edge be cut in the real frontend
  axisCharWidth: 6.2,
  minLabelGap: 6, // px between two axis labels
});

/**
 * What the colours and patterns of the waterfall mean, in drawing order: `{key, cls, label, kind}` (kind `bar`: a
 * stage's fill, `seg`: a part of a transfer bar, `mark`: a pattern or an outline).
 */
export const LEGEND = Object.freeze([
  { key: "encode", cls: "h3-stage-encode", label: "encode (A)", kind: "bar" },
  { key: "a_to_b", cls: "h3-stage-a_to_b", label: "A->B / B->A transfer", kind: "bar" },
  { key: "denoise", cls: "h3-stage-denoise", label: "denoise (B)", kind: "bar" },
  { key: "decode", cls: "h3-stage-decode", label: "decode", kind: "bar" },
  { key: "save", cls: "h3-stage-save", label: "save", kind: "bar" },
  { key: "context", cls: "h3-ctx", label: "connect / load / LoRA check (no request)", kind: "bar" },
  { key: "wait", cls: "h3-seg-wait", label: "waiting for the sender", kind: "seg" },
  { key: "fetch", cls: "h3-seg-fetch", label: "fetch", kind: "seg" },
  { key: "materialize", cls: "h3-seg-materialize", label: "materialise", kind: "seg" },
  { key: "gap", cls: "h3-gap", label: "hatched: the request waits (machine idle, or on other requests)", kind: "mark" },
  { key: "live", cls: "h3-live", label: "dashed: still running", kind: "mark" },
  { key: "slow", cls: "h3-slow", label: "red outline: slow transfer", kind: "mark" },
  { key: "tick", cls: "h3-tick", label: "white ticks: one per forward", kind: "mark" },
]);

/** What a record without a request (load, connect, LoRA check) that falls inside a request's run is called. */
export function contextLabel(rec) {
  const wall = recordSeconds(rec) ?? 0;
  if (rec.stage === "connect") return wall > CONNECT_START_S ? "Ray/B start (connect)" : "connect to B";
  if (rec.stage === "lora") return "LoRA check on B";
  if (rec.stage === "load") return "load encoders";
  return stageLabel(rec.stage);
}
/** A connect longer than this started something: the Ray cluster, B's DiT actor or its model load. */
const CONNECT_START_S = 2;

/** 1, 2 or 5 times a power of ten, so that `span` holds about `target` ticks. */
export function niceStep(span, target = 6) {
  if (!(span > 0) || !(target > 0)) return 1;
  const raw = span / target;
  const pow = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) {
    if (raw <= m * pow) return m * pow;
  }
  return 10 * pow;
}

/** The lane of a record: its machine, or for a DiT group's denoise its rank ("A r0", "B r1", ...). */
export function laneOf(rec) {
  if (rec.stage === "denoise" && rec.rank !== null && rec.rank !== undefined) return `${rec.machine} r${rec.rank}`;
  return LANES.includes(rec.machine) ? rec.machine : defaultMachine(rec.stage);
}

function laneIds(records) {
  const ranks = [...new Set(records.map(laneOf).filter((id) => !LANES.includes(id)))];
  ranks.sort((a, b) => Number(a.split(" r")[1]) - Number(b.split(" r")[1]));
  return [...LANES, ...ranks];
}

function mergeIntervals(list) {
  const sorted = list.filter((iv) => iv[1] > iv[0]).sort((a, b) => a[0] - b[0]);
  const out = [];
  for (const iv of sorted) {
    const last = out[out.length - 1];
    if (last && iv[0] <= last[1]) last[1] = Math.max(last[1], iv[1]);
    else out.push([iv[0], iv[1]]);
  }
  return out;
}

const WAITING_FOR = { A: "B", B: "A" };

/** The share of [a, b] that merged intervals cover. */
function busyShare(ivs, a, b) {
  let covered = 0;
  for (const [s, e] of ivs) covered += Math.max(0, Math.min(e, b) - Math.max(s, a));
  return b > a ? covered / (b - a) : 0;
}

/**
 * The waterfall of one request.
 *
 * `req`: `{request_id, records: [StageRecord...], progress?: {total, steps: Map|object step->seconds}}` (a request
 * aggregate of H3Store, or any object of that shape). Records need `start`/`end` (wall seconds); the others are
 * listed in `untimed`. Records of an earlier prompt (a cached encode, see runRecords) are left out and listed in
 * `cached`. `context`: records without a request (load, connect, LoRA check); those inside the request's run are
 * drawn on their machine's lane and named, so the gap they explain is labelled.
 *
 * Returns `{request_id, t0, t1, total_s, width, height, plot: {x0, x1, w}, axisY, lanes: [{id, y, h}], bars: [...],
 * context: [...], gaps: [...], axis: [{x, t, label, anchor}], untimed: [...], cached: [...]}` where a bar is `{key,
 * stage, label, text, lane, x, y, w, h, start, end, dur_s, cls, live, title, segments: [{kind, x, w, seconds}],
 * ticks: [{x, t, step, seconds}], record}`, a context bar `{stage, label, text, lane, x, y, w, h, start, end, dur_s,
 * title}` and a gap `{lane, x, y, w, h, start, end, dur_s, title, text, elsewhere}` (a stretch where that machine
 * ran nothing of the request; `text` is its label when it fits and no context bar explains it; `elsewhere` when the
 * machine worked on `others`, the records of other requests, for most of it: in a batch the request waits its turn).
 */
export function waterfall(req, layout = {}, { context = [], others = [] } = {}) {
  const L = { ...DEFAULT_LAYOUT, ...layout };
  const own = runRecords(req);
  const records = own.map(normalizeRecord).filter(Boolean);
  const timed = records.filter((r) => r.start !== null && r.end !== null && r.end >= r.start);
  const untimed = records.filter((r) => !timed.includes(r));
  const ids = laneIds(timed);
  const lanes = ids.map((id, i) => ({ id, y: L.padTop + i * (L.laneHeight + L.laneGap), h: L.laneHeight }));
  const height = L.padTop + ids.length * L.laneHeight + (ids.length - 1) * L.laneGap + L.axisHeight;
  const x0 = ids.length > LANES.length ? Math.max(L.labelWidth, 36) : L.labelWidth; // room for "B r1"
  const x1 = Math.max(x0 + 1, L.width - L.padRight);
  const plot = { x0, x1, w: x1 - x0 };
  const axisY = height - L.axisHeight + 2;
  const geom = { request_id: req?.request_id ?? null, t0: null, t1: null, total_s: 0, width: L.width, height, plot,
                 axisY, minBarWidth: L.minBarWidth, lanes, bars: [], context: [], gaps: [], axis: [], untimed,
                 cached: req && Array.isArray(req.records) ? cachedRecords(req).map(normalizeRecord).filter(Boolean) : [] };

  // a denoise still running: a provisional bar from the progress events, after what is known of the request
  const steps = progressSteps(req?.progress);
  const hasDenoise = timed.some((r) => r.stage === "denoise");
  let live = null;
  if (!hasDenoise && steps.length) {
    const before = timed.filter((r) => r.stage === "a_to_b" || r.stage === "encode");
    const anchor = before.length ? Math.max(...before.map((r) => r.end)) : timed.length ? Math.min(...timed.map((r) => r.start)) : 0;
    const dur = steps.reduce((a, e) => a + e.seconds, 0);
    const total = req.progress.total;
    live = { stage: "denoise", machine: "B", node: "", start: anchor, end: anchor + dur, steps: steps.map((e) => e.seconds),
             compute_s: dur, load_s: 0, total_bytes: 0, producer_wait_s: 0, fetch_s: 0, materialize_s: 0, validate_s: 0,
             serialize_s: 0, note: `running: forward ${steps[steps.length - 1].step} of ${total ?? "?"}`,
             request_id: req.request_id ?? null, bytes: {}, receive_s: 0 };
  }
  const all = live ? [...timed, live] : timed;
  if (!all.length) return geom;

  const t0 = Math.min(...all.map((r) => r.start));
  const t1 = Math.max(...all.map((r) => r.end));
  const span = Math.max(t1 - t0, 1e-9);
  geom.t0 = t0;
  geom.t1 = t1;
  geom.total_s = t1 - t0;
  const sx = (t) => x0 + ((t - t0) / span) * plot.w;
  const laneY = Object.fromEntries(lanes.map((l) => [l.id, l.y]));
  const fit = (texts, w) => texts.find((t) => t && t.length * L.charWidth + 6 <= w) ?? "";

  const ordered = [...all].sort((a, b) => a.start - b.start || stageRank(a.stage) - stageRank(b.stage));
  ordered.forEach((r, i) => {
    const lane = laneOf(r);
    const x = sx(r.start);
    const w = Math.max(L.minBarWidth, sx(r.end) - x);
    const dur = r.end - r.start;
    const isLive = r === live;
    const bar = { key: `${r.stage}-${i}`, stage: r.stage, label: stageLabel(r.stage), lane, x, y: laneY[lane],
                  w, h: L.laneHeight, start: r.start, end: r.end, dur_s: dur, live: isLive,
                  cls: `h3-bar h3-stage-${r.stage}${isLive ? " h3-live" : ""}`, segments: [], ticks: [], record: r,
                  title: "", text: "" };
    bar.text = fit([`${bar.label} ${fmtSeconds(dur)}`, fmtSeconds(dur)], w);
    if (TRANSFER_STAGES.includes(r.stage)) {
      // wall time of a hand-off: producer wait, then fetch, then materialisation (then validation)
      let cx = x;
      for (const [kind, secs] of [["wait", r.producer_wait_s], ["fetch", r.fetch_s], ["materialize", r.materialize_s],
                                  ["validate", r.validate_s]]) {
        if (!(secs > 0)) continue;
        const sw = Math.min((secs / span) * plot.w, x + w - cx);
        if (sw <= 0) break;
        bar.segments.push({ kind, x: cx, w: sw, seconds: secs });
        cx += sw;
      }
    }
    if (r.steps && r.steps.length) {
      // per-step seconds start after a partition swap (load_s) when it fits
      const sum = r.steps.reduce((a, b) => a + b, 0);
      const offset = Math.min(r.load_s || 0, Math.max(0, dur - sum));
      let t = r.start + offset;
      r.steps.forEach((secs, k) => {
        t += secs;
        const tt = Math.min(t, r.end);
        bar.ticks.push({ x: sx(tt), t: tt, step: k + 1, seconds: secs });
      });
    }
    const share = geom.total_s > 0 ? dur / geom.total_s : null;
    bar.title = `${recordTitle(r)}${share !== null ? `\n  ${fmtPercent(share)} of the request's ${fmtSeconds(geom.total_s)}` : ""}` +
      (isLive ? `\n  ${r.note}` : "");
    if (TRANSFER_STAGES.includes(r.stage) && geom.total_s > 0) bar.receive_share = r.receive_s / geom.total_s;
    geom.bars.push(bar);
  });

  // records without a request inside the run (B's start on the first connect, a LoRA check): drawn and named
  for (const raw of Array.isArray(context) ? context : []) {
    const r = normalizeRecord(raw);
    if (!r || r.request_id !== null || r.start === null || r.end === null) continue;
    const a = Math.max(r.start, t0);
    const b = Math.min(r.end, t1);
    if (!(b > a) || !LANES.includes(r.machine)) continue;
    const x = sx(a);
    const w = Math.max(L.minBarWidth, sx(b) - x);
    const label = contextLabel(r);
    geom.context.push({ stage: r.stage, label, lane: r.machine, x, y: laneY[r.machine], w, h: L.laneHeight,
                        start: a, end: b, dur_s: b - a, record: r,
                        text: fit([`${label} ${fmtSeconds(r.end - r.start)}`, label, fmtSeconds(r.end - r.start)], w),
                        title: `${label} (no request: ${r.stage} on ${r.machine})\n${recordTitle(r)}` +
                          (r.stage === "connect" && recordSeconds(r) > CONNECT_START_S ?
                            "\n  a connect this long started the Ray cluster and/or B's DiT (first run, or B restarted)" : "") });
  }

  // idle stretches per lane within [t0, t1]; what the machine did for other requests meanwhile
  const otherBusy = {};
  for (const raw of Array.isArray(others) ? others : []) {
    const r = normalizeRecord(raw);
    if (!r || r.start === null || r.end === null || r.request_id === geom.request_id) continue;
    const lane = LANES.includes(r.machine) ? r.machine : defaultMachine(r.stage);
    (otherBusy[lane] ??= []).push([r.start, r.end]);
  }
  for (const k of Object.keys(otherBusy)) otherBusy[k] = mergeIntervals(otherBusy[k]);
  const minGap = Math.max(L.minGapSeconds, L.minGapShare * geom.total_s);
  for (const lane of lanes) {
    const busy = mergeIntervals(all.filter((r) => laneOf(r) === lane.id).map((r) => [r.start, r.end]));
    let cursor = t0;
    const holes = [];
    for (const [a, b] of busy) {
      if (a > cursor) holes.push([cursor, a]);
      cursor = Math.max(cursor, b);
    }
    if (t1 > cursor) holes.push([cursor, t1]);
    for (const [a, b] of holes) {
      if (b - a < minGap) continue;
      if (!LANES.includes(lane.id)) continue; // a rank's lane holds only its denoise
      const w = sx(b) - sx(a);
      const explained = geom.context.filter((c) => c.lane === lane.id && c.start < b && c.end > a)
        .reduce((acc, c) => acc + Math.min(c.end, b) - Math.max(c.start, a), 0) > 0.5 * (b - a);
      const other = WAITING_FOR[lane.id];
      const elsewhere = busyShare(otherBusy[lane.id] ?? [], a, b) > 0.5;
      const d = fmtSeconds(b - a);
      const texts = elsewhere ? [`${lane.id} on other requests ${d}`, `other requests ${d}`, `busy ${d}`] :
        [`${lane.id} idle ${d}: waits for ${other}`, `${lane.id} idle ${d}`, `idle ${d}`];
      const text = explained ? "" : fit(texts, w);
      geom.gaps.push({ lane: lane.id, x: sx(a), y: lane.y, w, h: lane.h, start: a, end: b, dur_s: b - a, text,
                       elsewhere,
                       title: elsewhere ? `${lane.id} worked on other requests for ${d} while this one waited its turn` :
                         `${lane.id} waited ${d} (for ${other})` });
    }
  }

  geom.axis = axisTicks(geom.total_s, sx, t0, L);
  return geom;
}

/**
 * Axis ticks at 1-2-5 steps from zero. Each label stays inside the chart (the last one ends at the right edge
 * instead of past it); the first and the last are always drawn, one between them only where it touches neither.
 */
function axisTicks(total, sx, t0, L) {
  const step = niceStep(total, L.targetTicks);
  const out = [];
  const cw = L.axisCharWidth;
  for (let k = 0; k * step <= total * (1 + 1e-9) && k < 1000; k += 1) {
    const t = k * step;
    const x = sx(t0 + t);
    const label = k === 0 ? "0" : fmtSeconds(t);
    const w = label.length * cw;
    let anchor = k === 0 ? "start" : "middle";
    let left = anchor === "start" ? x : x - w / 2;
    if (left + w > L.width) {
      anchor = "end";
      left = x - w;
    }
    out.push({ x, t, label, anchor, left: Math.max(0, left), right: Math.max(0, left) + w });
  }
  if (out.length > 1) {
    const end = out[out.length - 1];
    let prevRight = out[0].right;
    for (const a of out.slice(1, -1)) {
      if (a.left >= prevRight + L.minLabelGap && a.right + L.minLabelGap <= end.left) prevRight = a.right;
      else a.label = "";
    }
    if (end.left < out[0].right + L.minLabelGap) end.label = ""; // a chart too narrow for two labels keeps "0"
  }
  return out;
}

// ------------------------------------------------------------------------------------------------ request totals

/**
 * Wall-clock time of a request's run split so that the parts add up to its total: each instant of [t0, t1] is
 * counted once, under the stage running then (the later stage when two overlap, e.g. B's and A's halves of a split
 * decode are one "decode"), else under a record without a request running then (connect...), else as waiting
 * (its machines idle, or in a batch busy with the other requests). Returns `[{stage, seconds, label, context}]` in
 * pipeline order, waiting last.
 */
export function wallBreakdown(records, t0, t1, context = []) {
  const own = records.filter((r) => r.start !== null && r.end !== null && r.end > r.start && !r.rank);
  const ctx = context.map(normalizeRecord).filter((r) => r && r.request_id === null && r.start !== null && r.end !== null);
  if (!(t1 > t0)) return [];
  const cuts = new Set([t0, t1]);
  for (const r of [...own, ...ctx]) {
    if (r.start > t0 && r.start < t1) cuts.add(r.start);
    if (r.end > t0 && r.end < t1) cuts.add(r.end);
  }
  const points = [...cuts].sort((a, b) => a - b);
  const sums = new Map();
  for (let i = 0; i + 1 < points.length; i += 1) {
    const [a, b] = [points[i], points[i + 1]];
    const mid = (a + b) / 2;
    const running = own.filter((r) => r.start <= mid && r.end >= mid);
    let key;
    if (running.length) {
      key = running.reduce((best, r) => (stageRank(r.stage) > stageRank(best.stage) ? r : best)).stage;
    } else {
      const c = ctx.find((r) => r.start <= mid && r.end >= mid);
      key = c ? `ctx:${contextLabel(c)}` : "waiting";
    }
    sums.set(key, (sums.get(key) ?? 0) + (b - a));
  }
  const out = [...sums.entries()].map(([key, seconds]) => ({
    stage: key.startsWith("ctx:") ? "context" : key, seconds, context: key.startsWith("ctx:"),
    label: key.startsWith("ctx:") ? key.slice(4) : key === "waiting" ? "waiting" : stageLabel(key),
  }));
  const rank = (p) => (p.stage === "waiting" ? 1e9 : p.context ? stageRank("a_to_b") - 0.5 : stageRank(p.stage));
  return out.sort((a, b) => rank(a) - rank(b));
}

/**
 * Per-request figures for the timeline header: the run's wall total and its breakdown that adds up to it
 * (wallBreakdown), wall seconds per stage with overlaps counted once, transfers with their share, the forwards,
 * and what was cached from an earlier prompt.
 */
export function requestSummary(req, { context = [] } = {}) {
  const out = { request_id: req?.request_id ?? null, total_s: null, t0: null, t1: null, stages: {}, breakdown: [],
                transfers: {}, steps: null, cached: [], state: req?.state ?? "running" };
  if (!req) return out;
  const records = runRecords(req).map(normalizeRecord).filter(Boolean);
  const timed = records.filter((r) => r.start !== null && r.end !== null);
  if (timed.length) {
    out.t0 = Math.min(...timed.map((r) => r.start));
    out.t1 = Math.max(...timed.map((r) => r.end));
    out.total_s = out.t1 - out.t0;
  }
  const byStage = new Map();
  for (const r of timed) {
    if (r.rank) continue; // a DiT group's other ranks: the request's denoise is rank 0's, counted once
    if (!byStage.has(r.stage)) byStage.set(r.stage, []);
    byStage.get(r.stage).push([r.start, r.end]);
  }
  for (const [stage, ivs] of byStage) out.stages[stage] = mergeIntervals(ivs).reduce((a, [s, e]) => a + e - s, 0);
  for (const r of records) {
    if (r.rank) continue;
    if (TRANSFER_STAGES.includes(r.stage)) {
      const t = transferFigures(r);
      t.share = out.total_s ? t.receive_s / out.total_s : null;
      out.transfers[r.stage] = t;
    }
    if (r.stage === "denoise" && r.steps.length) out.steps = stepStats(r.steps);
  }
  if (out.total_s !== null) out.breakdown = wallBreakdown(records, out.t0, out.t1, context);
  if (!out.steps && req.progress) {
    const ps = progressSteps(req.progress);
    out.steps = { ...stepStats(ps.map((e) => e.seconds)), done: ps.length ? ps[ps.length - 1].step : 0,
                  total: req.progress.total };
  }
  out.cached = cachedRecords(req).map(normalizeRecord).filter(Boolean)
    .map((r) => ({ stage: r.stage, seconds: recordSeconds(r) ?? r.compute_s, record: r }));
  return out;
}

/** Wall seconds of a record, re-exported for callers that only import the timeline module. */
export { recordSeconds };
