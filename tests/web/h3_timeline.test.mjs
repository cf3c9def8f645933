// Geometry of the waterfall: lanes, bar positions and widths, transfer segments, step ticks, idle gaps, axis.
// Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import { DEFAULT_LAYOUT, niceStep, requestSummary, waterfall } from "../../web/h3_timeline.js";
import { normalizeRecord, ranksLine } from "../../web/h3_view.js";

const RID = "r1";
const near = (a, b, eps = 1e-6) => assert.ok(Math.abs(a - b) <= eps, `${a} != ${b} (±${eps})`);

function request() {
  // t = 100 .. 150 (50 s): encode 0-2 on A, A->B 2-2.5 on B (wait .2, fetch .25, mat .05), denoise 2.5-42.5 on B
  // (1 s swap then 4 steps of 9.75 s), B->A 42.5-43 on A, decode 43-50 on A
  return {
    request_id: RID,
    records: [
      { request_id: RID, stage: "decode", machine: "A", start: 143, end: 150, compute_s: 7 },
      { request_id: RID, stage: "encode", machine: "A", start: 100, end: 102, compute_s: 1.99, serialize_s: 0.01 },
      { request_id: RID, stage: "a_to_b", machine: "B", start: 102, end: 102.5, producer_wait_s: 0.2, fetch_s: 0.25,
        materialize_s: 0.05 },
      { request_id: RID, stage: "denoise", machine: "B", start: 102.5, end: 142.5, compute_s: 40, load_s: 1,
        steps: [9.75, 9.75, 9.75, 9.75] },
      { request_id: RID, stage: "b_to_a", machine: "A", start: 142.5, end: 143, fetch_s: 0.3, materialize_s: 0.1 },
    ],
  };
}

test("niceStep gives 1-2-5 steps", () => {
  assert.equal(niceStep(50, 6), 10);
  assert.equal(niceStep(12, 6), 2);
  assert.equal(niceStep(0.3, 6), 0.05);
  assert.equal(niceStep(0, 6), 1);
});

test("bars sit on their machine's lane, in time order, scaled to the plot", () => {
  const L = { width: 524, labelWidth: 24, padRight: 0 }; // plot of 500 px for 50 s: 10 px per second
  const g = waterfall(request(), L);
  assert.equal(g.t0, 100);
  assert.equal(g.t1, 150);
  near(g.total_s, 50);
  assert.deepEqual(g.plot, { x0: 24, x1: 524, w: 500 });
  assert.deepEqual(g.bars.map((b) => [b.stage, b.lane]),
                   [["encode", "A"], ["a_to_b", "B"], ["denoise", "B"], ["b_to_a", "A"], ["decode", "A"]]);
  const laneY = Object.fromEntries(g.lanes.map((l) => [l.id, l.y]));
  assert.ok(laneY.B > laneY.A);
  for (const b of g.bars) {
    near(b.x, 24 + (b.start - 100) * 10);
    near(b.w, Math.max(DEFAULT_LAYOUT.minBarWidth, (b.end - b.start) * 10));
    assert.equal(b.y, laneY[b.lane]);
    assert.match(b.cls, new RegExp(`h3-stage-${b.stage}`));
  }
  const den = g.bars.find((b) => b.stage === "denoise");
  near(den.w, 400);
  assert.match(den.title, /4 forwards \(5 sigma points\), 9\.8 s each/);
  assert.match(den.title, /80 % of the request's 50\.0 s/);
  assert.equal(g.height, DEFAULT_LAYOUT.padTop + 2 * DEFAULT_LAYOUT.laneHeight + DEFAULT_LAYOUT.laneGap + DEFAULT_LAYOUT.axisHeight);
});

test("a ComfyUI sampler whose forwards ran on B is a row of its own, on B's lane", () => {
  // H3RemoteModel: the sampler node's record (stage "sampling", one per sampling, its forwards as steps)
  const req = { request_id: "s1", records: [
    { request_id: "s1", stage: "sampling", machine: "B", node: "h3_dit", start: 10, end: 12, compute_s: 1.2,
      fetch_s: 0.3, steps: [0.4, 0.4, 0.4], note: "3 forwards on B (h3_dit): ..." }] };
  const g = waterfall(req, { width: 224, labelWidth: 24, padRight: 0 });
  assert.deepEqual(g.bars.map((b) => [b.stage, b.lane, b.label]), [["sampling", "B", "sampler (forwards on B)"]]);
  assert.match(g.bars[0].cls, /h3-stage-sampling/);
  near(g.bars[0].w, 200);
});

test("denoise step ticks follow the per-step seconds after the partition swap", () => {
  const g = waterfall(request(), { width: 524, labelWidth: 24, padRight: 0 });
  const den = g.bars.find((b) => b.stage === "denoise");
  assert.equal(den.ticks.length, 4);
  assert.deepEqual(den.ticks.map((t) => t.step), [1, 2, 3, 4]);
  // start 102.5 + 1 s swap + k * 9.75
  den.ticks.forEach((t, k) => near(t.t, 103.5 + (k + 1) * 9.75));
  den.ticks.forEach((t) => near(t.x, 24 + (t.t - 100) * 10));
});

test("a transfer bar is split into producer wait, fetch and materialisation", () => {
  const g = waterfall(request(), { width: 524, labelWidth: 24, padRight: 0 });
  const a2b = g.bars.find((b) => b.stage === "a_to_b");
  assert.deepEqual(a2b.segments.map((s) => s.kind), ["wait", "fetch", "materialize"]);
  near(a2b.segments[0].x, a2b.x);
  near(a2b.segments[0].w, 2);
  near(a2b.segments[1].x, a2b.x + 2);
  near(a2b.segments[1].w, 2.5);
  near(a2b.segments[2].w, 0.5);
  near(a2b.receive_share, 0.3 / 50);
  const b2a = g.bars.find((b) => b.stage === "b_to_a");
  assert.deepEqual(b2a.segments.map((s) => s.kind), ["fetch", "materialize"]);
  // segments never leave their bar
  for (const b of g.bars) for (const s of b.segments) assert.ok(s.x + s.w <= b.x + b.w + 1e-9);
});

test("gaps are where a machine waited", () => {
  const g = waterfall(request(), { width: 524, labelWidth: 24, padRight: 0 });
  const gaps = g.gaps.map((x) => [x.lane, x.start, x.end]);
  // A is idle while B receives and denoises; B is idle while A encodes and after it handed back
  assert.deepEqual(gaps, [["A", 102, 142.5], ["B", 100, 102], ["B", 142.5, 150]]);
  const a = g.gaps[0];
  near(a.x, 24 + 20);
  near(a.w, 405);
  assert.match(a.title, /A waited 40\.5 s \(for B\)/);
});

test("the axis has nice ticks from zero", () => {
  const g = waterfall(request(), { width: 524, labelWidth: 24, padRight: 0 });
  assert.deepEqual(g.axis.map((a) => a.label), ["0", "10.0 s", "20.0 s", "30.0 s", "40.0 s", "50.0 s"]);
  near(g.axis[1].x, 124);
});

test("a running denoise is drawn from the progress events", () => {
  const req = request();
  req.records = req.records.filter((r) => ["encode", "a_to_b"].includes(r.stage));
  req.progress = { total: 5, steps: new Map([[1, 9], [2, 10]]) };
  const g = waterfall(req, { width: 524, labelWidth: 24, padRight: 0 });
  const live = g.bars.find((b) => b.live);
  assert.equal(live.stage, "denoise");
  assert.equal(live.lane, "B");
  near(live.start, 102.5);
  near(live.end, 121.5);
  assert.equal(live.ticks.length, 2);
  assert.match(live.cls, /h3-live/);
  assert.match(live.title, /running: forward 2 of 5/);
  near(g.total_s, 21.5);
});

test("tiny bars keep a visible width; requests without times give an empty chart", () => {
  const g = waterfall({ request_id: "x", records: [
    { request_id: "x", stage: "encode", machine: "A", start: 0, end: 100 },
    { request_id: "x", stage: "a_to_b", machine: "B", start: 100, end: 100.0001, fetch_s: 0.0001 },
  ] }, { width: 124, labelWidth: 24, padRight: 0 });
  const a2b = g.bars.find((b) => b.stage === "a_to_b");
  assert.equal(a2b.w, DEFAULT_LAYOUT.minBarWidth);
  near(a2b.dur_s, 0.0001, 1e-9);
  const empty = waterfall({ request_id: "y", records: [{ request_id: "y", stage: "encode" }] });
  assert.equal(empty.bars.length, 0);
  assert.equal(empty.untimed.length, 1);
  assert.equal(waterfall(null).bars.length, 0);
});

test("a DiT group's denoise: one lane per rank, the request's denoise counted once", () => {
  const rec = (stage, machine, start, end, info) => ({ stage, machine, start, end, compute_s: end - start,
                                                       request_id: "g1", info, steps: [0.1, 0.1] });
  const req = { request_id: "g1", records: [
    rec("encode", "A", 0, 0.5), rec("a_to_b", "B", 0.5, 0.6),
    rec("denoise", "A", 0.6, 1.6, { rank: 0, world: 3, comm_s: 0.05 }),
    rec("denoise", "B", 0.6, 1.6, { rank: 1, world: 3, comm_s: 0.04 }),
    rec("denoise", "B", 0.61, 1.6, { rank: 2, world: 3, comm_s: 0.06 }),
    rec("b_to_a", "A", 1.6, 1.62), rec("decode", "A", 1.62, 2.0)] };
  const g = waterfall(req);
  assert.deepEqual(g.lanes.map((l) => l.id), ["A", "B", "A r0", "B r1", "B r2"]);
  const den = g.bars.filter((b) => b.stage === "denoise");
  assert.deepEqual(den.map((b) => b.lane), ["A r0", "B r1", "B r2"]);
  assert.ok(g.plot.x0 >= 36);
  assert.ok(!g.gaps.some((x) => x.lane.includes(" r")));
  const s = requestSummary({ ...req, records: req.records.map(normalizeRecord) });
  assert.ok(Math.abs(s.stages.denoise - 1.0) < 1e-9);
});

test("the denoise readout of a DiT group names its ranks", () => {
  const line = ranksLine({ ran: { method: "ulysses", ranks: [
    { machine: "A", step_s: 0.52, comm_share: 0.07 }, { machine: "B", step_s: 0.51, comm_share: 0.05 }] } });
  assert.equal(line, "2 ranks (ulysses): A 520 ms/forward, B 510 ms/forward · comm 6.0 %");
  assert.equal(ranksLine({ ran: { partition: "transformer" } }), null);
});
