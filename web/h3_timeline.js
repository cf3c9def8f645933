// comfy-h3 web extension: geometry of one request's waterfall (a lane for A, a lane for B, and one lane per rank of
// a DiT group when a request's denoise ran on several machines at once).
//
// Pure ES module: no ComfyUI import, no DOM access, no side effects at load time (ComfyUI also loads it as an
// extension script on its own). h3_dom.js turns the geometry into SVG; tests/web/ checks the numbers.

import {
  defaultMachine, fmtPercent, fmtSeconds, normalizeRecord, progressSteps, recordSeconds, recordTitle, stageLabel,
  stageRank, TRANSFER_STAGES,
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
});

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

/**
 * The waterfall of one request.
 *
 * `req`: `{request_id, records: [StageRecord...], progress?: {total, steps: Map|object step->seconds}}` (a request
 * aggregate of H3Store, or any object of that shape). Records need `start`/`end` (wall seconds); the others are
 * listed in `untimed`.
 *
 * Returns `{request_id, t0, t1, total_s, width, height, plot: {x0, x1, w}, axisY, lanes: [{id, y, h}], bars: [...],
 * gaps: [...], axis: [{x, t, label}], untimed: [...]}` where a bar is `{key, stage, label, lane, x, y, w, h, start,
 * end, dur_s, cls, live, title, segments: [{kind, x, w, seconds}], ticks: [{x, t, step, seconds}], record}` and a
 * gap is `{lane, x, y, w, h, start, end, dur_s, title}` (a stretch where that machine ran nothing of the request).
 */
export function waterfall(req, layout = {}) {
  const L = { ...DEFAULT_LAYOUT, ...layout };
  const records = (req && Array.isArray(req.records) ? req.records : []).map(normalizeRecord).filter(Boolean);
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
                 axisY, minBarWidth: L.minBarWidth, lanes, bars: [], gaps: [], axis: [], untimed };

  // a denoise still running: a provisional bar from the progress events, after what is known of the request
  const steps = progressSteps(req?.progress);
  const hasDenoise = timed.some((r) => r.stage === "denoise");
  let live = null;
  if (!hasDenoise && steps.length) {
    const before = timed.filter((r) => r.stage === "a_to_b" || r.stage === "encode");
    const anchor = before.length ? Math.max(...before.map((r) => r.end)) : timed.length ? Math.min(...timed.map((r) => r.start)) : 0;
    const dur = steps.reduce((a, e) => a + e.seconds, 0);
    live = { stage: "denoise", machine: "B", node: "", start: anchor, end: anchor + dur, steps: steps.map((e) => e.seconds),
             compute_s: dur, load_s: 0, total_bytes: 0, producer_wait_s: 0, fetch_s: 0, materialize_s: 0, validate_s: 0,
             serialize_s: 0, note: `running: step ${steps[steps.length - 1].step}/${req.progress.total ?? "?"}`,
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
                  title: "" };
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

  // idle stretches per lane within [t0, t1]
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
      geom.gaps.push({ lane: lane.id, x: sx(a), y: lane.y, w: sx(b) - sx(a), h: lane.h, start: a, end: b, dur_s: b - a,
                       title: `${lane.id} waited ${fmtSeconds(b - a)} (for ${WAITING_FOR[lane.id]})` });
    }
  }

  const step = niceStep(geom.total_s, L.targetTicks);
  for (let k = 0; k * step <= geom.total_s * (1 + 1e-9) && k < 1000; k += 1) {
    geom.axis.push({ x: sx(t0 + k * step), t: k * step, label: k === 0 ? "0" : fmtSeconds(k * step) });
  }
  return geom;
}

/** Wall seconds of a record, re-exported for callers that only import the timeline module. */
export { recordSeconds };
