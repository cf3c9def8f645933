// Replays tests/web/fixtures/runner_events.jsonl (a run's websocket events, {"type","data"} per line) through the
// view logic. Expected values come from the file itself, so a recorded stream can replace it.
// Run: node --test tests/web/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { forwardsDoneText, readoutModel, readoutText } from "../../web/h3_readout.js";
import { fmtSeconds, H3Store, isH3NodeType, transferFigures } from "../../web/h3_view.js";
import { waterfall } from "../../web/h3_timeline.js";

const FIXTURE = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "runner_events.jsonl");
const events = readFileSync(FIXTURE, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l))
  .filter((e) => typeof e.type === "string");
const timings = events.filter((e) => e.type === "h3.timing").map((e) => e.data);
const progress = events.filter((e) => e.type === "h3.progress").map((e) => e.data);

/** What the frontend's api does before our listeners see an event. */
function dispatch(store, { type, data }) {
  switch (type) {
    case "h3.timing": return store.ingestTiming(data);
    case "h3.progress": return store.ingestProgress(data);
    case "executed": return store.ingestExecuted(data);
    case "execution_start": return store.executionStart(data);
    case "execution_cached": return store.executionCached(data);
    case "executing": return store.executing(data?.display_node ?? data?.node ?? null);
    case "execution_success": case "execution_error": case "execution_interrupted":
      return store.executionEnd(type, data);
    default: return undefined;
  }
}

test("the fixture is a run with H3 timings and denoise progress", () => {
  assert.ok(timings.length >= 1, "no h3.timing event");
  assert.ok(timings.every((t) => isH3NodeType(t.node_type)), "unknown node_type");
  assert.ok(timings.some((t) => t.node_type === "H3RemoteDenoise"), "no H3RemoteDenoise timing");
  assert.ok(progress.length >= 1, "no h3.progress event");
});

test("replay: every H3 node's readout shows its compute time; denoise its steps and transfers", () => {
  const store = new H3Store();
  for (const e of events) dispatch(store, e);
  for (const t of timings) {
    const m = readoutModel(store, t.node);
    const first = m.lines[0].map((p) => p.text).join(" · ");
    assert.ok(first.includes(fmtSeconds(t.summary.compute_s)), `${t.node_type}: ${first}`);
    if (t.node_type === "H3RemoteDenoise") {
      // the count once, in the words of the node's `steps` input: forwards and sigma points (= forwards + 1)
      const all = readoutText(m);
      const count = t.summary.schedule ?? forwardsDoneText(t.summary.steps_done, t.summary.steps_total);
      assert.ok(all.includes(count), all);
      assert.ok(!/\bstep \d+\/\d+/.test(all), all);
      for (const [dir, label] of [["a_to_b", "A->B"], ["b_to_a", "B->A"]]) {
        const f = transferFigures(t.summary[dir]);
        if (!f) continue;
        assert.ok(first.includes(`${label} ${fmtSeconds(f.receive_s)}`), first);
        assert.ok(m.lines[1].some((p) => p.text === `${label} fetch ${fmtSeconds(f.fetch_s)} + mat ${fmtSeconds(f.materialize_s)}`));
      }
    }
  }
});

test("replay: mid-denoise the readout sums the steps so far", () => {
  const store = new H3Store();
  const lastProgress = events.map((e) => e.type).lastIndexOf("h3.progress");
  const seen = [];
  for (const e of events.slice(0, lastProgress)) {
    dispatch(store, e);
    if (e.type === "h3.progress") seen.push(e.data);
  }
  if (!seen.length) return;
  const last = seen[seen.length - 1];
  const mine = seen.filter((p) => p.request_id === last.request_id && p.node === last.node);
  const sum = [...new Map(mine.map((p) => [p.step, p.seconds])).values()].reduce((a, b) => a + b, 0);
  const m = readoutModel(store, last.node);
  const text = m.lines[0].map((p) => p.text).join(" · ");
  assert.ok(text.includes(`denoise ${fmtSeconds(sum)}`), text);
  assert.ok(text.includes(`forward ${last.step} of ${last.total} (${last.total + 1} sigma points)`), text);
});

test("replay: one waterfall per request with every stage record of that request", () => {
  const store = new H3Store();
  for (const e of events) dispatch(store, e);
  const expected = new Map();
  for (const t of timings) {
    for (const r of t.stages ?? []) {
      if (!r.request_id) continue; // load/connect records belong to no request ("")
      if (!expected.has(r.request_id)) expected.set(r.request_id, []);
      expected.get(r.request_id).push(r);
    }
  }
  assert.deepEqual(store.requestList().map((r) => r.request_id).sort(), [...expected.keys()].sort());
  for (const [rid, recs] of expected) {
    const g = waterfall(store.request(rid, { create: false }), { width: 800 });
    assert.equal(g.bars.length, recs.length);
    const t0 = Math.min(...recs.map((r) => r.start));
    const t1 = Math.max(...recs.map((r) => r.end));
    assert.ok(Math.abs(g.total_s - (t1 - t0)) < 1e-6);
    for (const r of recs) {
      const bar = g.bars.find((b) => b.stage === r.stage && b.start === r.start);
      assert.ok(bar, `${rid} ${r.stage}`);
      assert.equal(bar.lane, r.machine);
      const w = Math.max(g.minBarWidth, ((r.end - r.start) / (t1 - t0)) * g.plot.w);
      assert.ok(Math.abs(bar.w - w) < 1e-6);
      assert.equal(bar.ticks.length, (r.steps ?? []).length);
    }
  }
});
