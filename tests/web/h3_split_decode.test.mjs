// Split decode in the waterfall: B's decode record (on B's clock) draws on lane B beside A's decode, on A's time axis.
// Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import { waterfall } from "../../web/h3_timeline.js";

const RID = "split1";
const near = (a, b, eps = 1e-6) => assert.ok(Math.abs(a - b) <= eps, `${a} != ${b} (±${eps})`);

test("B's decode share sits on lane B, beside A's decode, shifted onto A's clock", () => {
  const req = {
    request_id: RID,
    records: [
      { request_id: RID, stage: "encode", machine: "A", start: 100, end: 102, compute_s: 2 },
      { request_id: RID, stage: "denoise", machine: "B", start: 102, end: 140, compute_s: 38 },
      { request_id: RID, stage: "b_to_a", machine: "A", start: 140, end: 140.5, fetch_s: 0.4, materialize_s: 0.1 },
      { request_id: RID, stage: "decode", machine: "A", start: 140.5, end: 150, compute_s: 9, fetch_s: 0.4,
        materialize_s: 0.01, bytes: { frames: 1000, audio: 10, b_frames: 600 },
        note: "split decode: A clips 0-3, B clips 4-6 of 7" },
      // measured on B, whose clock runs 5 s ahead of A's
      { request_id: RID, stage: "decode", machine: "B", start: 145, end: 153.5, compute_s: 8.4, clock_offset_s: 5,
        bytes: { frames: 600 }, note: "split decode: B clips 4-6 of 7" },
    ],
  };
  const g = waterfall(req, { width: 524, labelWidth: 24, padRight: 0 });
  const dec = g.bars.filter((b) => b.stage === "decode");
  assert.deepEqual(dec.map((b) => b.lane).sort(), ["A", "B"]);
  const a = dec.find((b) => b.lane === "A");
  const b = dec.find((b) => b.lane === "B");
  near(b.start, 140);
  near(b.end, 148.5);
  assert.ok(b.start < a.end && a.start < b.end, "the two decode bars overlap in time");
  assert.notEqual(a.y, b.y);
  assert.match(a.title, /fetch .* \+ materialise/);
  assert.match(b.title, /B clips 4-6 of 7/);
  // B is not idle during the decode: no gap on lane B over B's share
  assert.ok(!g.gaps.some((gap) => gap.lane === "B" && gap.start < 148 && gap.end > 141));
});
