// The timeline reads without pointing: totals that add up (overlaps counted once), the gaps named (B's start on a
// first connect, a batch's turn), labels inside the chart, a cached encode kept out of a later run's row, rows
// named by workflow and batch place, A inside ComfyUI's process named so. Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import { requestName } from "../../web/h3_dom.js";
import { roleText, statusModel } from "../../web/h3_status.js";
import { DEFAULT_LAYOUT, LEGEND, requestSummary, wallBreakdown, waterfall } from "../../web/h3_timeline.js";
import { cachedRecords, H3Store, normalizeRecord, runRecords } from "../../web/h3_view.js";

const near = (a, b, eps = 1e-6) => assert.ok(Math.abs(a - b) <= eps, `${a} != ${b} (±${eps})`);
const R = (rid, stage, machine, start, end, extra = {}) => ({ request_id: rid, stage, machine, start, end,
                                                            compute_s: end - start, ...extra });

function splitDecodeRequest() {
  // 0-2 encode A, 2-2.5 A->B, 2.5-12.5 denoise B, 12.5-13 B->A, 13-18 decode A, 13-16 decode B (B's clips, overlap)
  return { request_id: "s", records: [
    R("s", "encode", "A", 100, 102), R("s", "a_to_b", "B", 102, 102.5, { fetch_s: 0.4, materialize_s: 0.1 }),
    R("s", "denoise", "B", 102.5, 112.5, { steps: [5, 5] }), R("s", "b_to_a", "A", 112.5, 113, { fetch_s: 0.5 }),
    R("s", "decode", "A", 113, 118), R("s", "decode", "B", 113, 116, { info: { clips: [4, 7], of: 7 } }),
  ].map(normalizeRecord) };
}

test("the header's parts add up to the total: A's and B's halves of a split decode count once", () => {
  const s = requestSummary(splitDecodeRequest());
  near(s.total_s, 18);
  near(s.stages.decode, 5); // the old header said A 5 s + B 3 s = 8 s of an 18 s request's decode
  const sum = s.breakdown.reduce((a, p) => a + p.seconds, 0);
  near(sum, s.total_s);
  assert.deepEqual(s.breakdown.map((p) => p.label), ["encode", "A->B", "denoise", "B->A", "decode"]);
  assert.ok(Object.values(s.stages).every((v) => v <= s.total_s + 1e-9));
});

test("idle stretches are a part of their own; parts still add up", () => {
  const recs = [R("g", "encode", "A", 0, 1), R("g", "denoise", "B", 3, 7), R("g", "decode", "A", 8, 10)].map(normalizeRecord);
  const parts = wallBreakdown(recs, 0, 10);
  assert.deepEqual(parts.map((p) => [p.label, p.seconds]), [["encode", 1], ["denoise", 4], ["decode", 2], ["waiting", 3]]);
});

test("a first run's connect (Ray and B starting) is drawn inside the row and named, and counted in the total", () => {
  const req = { request_id: "f", records: [
    R("f", "encode", "A", 100, 100.2), R("f", "a_to_b", "B", 129, 129.1), R("f", "denoise", "B", 129.1, 139, { steps: [3, 3, 3] }),
    R("f", "b_to_a", "A", 139, 139.2), R("f", "decode", "A", 139.2, 150)].map(normalizeRecord) };
  const context = [R("", "connect", "B", 100.3, 128.9), R("", "lora", "B", 128.9, 129), R("", "load", "A", 90, 99)];
  const g = waterfall(req, { width: 640 }, { context });
  const names = g.context.map((c) => [c.stage, c.label]);
  assert.deepEqual(names, [["connect", "Ray/B start (connect)"], ["lora", "LoRA check on B"]]); // the load is before
  const connect = g.context[0];
  assert.equal(connect.text, "Ray/B start (connect) 28.6 s");
  assert.match(connect.title, /started the Ray cluster/);
  // B's gap is explained by the connect bar: no second label over it; A's wait is labelled
  const bGap = g.gaps.find((x) => x.lane === "B" && x.start < 101);
  assert.equal(bGap.text, "");
  const aGap = g.gaps.find((x) => x.lane === "A" && x.dur_s > 20);
  assert.match(aGap.text, /^A idle 38\.8 s: waits for B$/);
  const s = requestSummary(req, { context });
  near(s.breakdown.reduce((a, p) => a + p.seconds, 0), s.total_s);
  const ray = s.breakdown.find((p) => p.context && p.label === "Ray/B start (connect)");
  near(ray.seconds, 28.6, 1e-6);
  // a short connect is just a connect
  const quick = waterfall(req, {}, { context: [R("", "connect", "B", 110, 110.05)] });
  assert.equal(quick.context[0].label, "connect to B");
});

test("in a batch a request's wait is the machine working on the other requests, and says so", () => {
  const mine = { request_id: "b2", records: [R("b2", "encode", "A", 1, 2), R("b2", "denoise", "B", 12, 20),
                                               R("b2", "decode", "A", 20, 24)].map(normalizeRecord) };
  const others = [R("b1", "denoise", "B", 2, 12), R("b1", "decode", "A", 12, 16), R("b3", "encode", "A", 2, 3)];
  const g = waterfall(mine, { width: 800 }, { others });
  const b = g.gaps.find((x) => x.lane === "B");
  assert.ok(b.elsewhere);
  assert.match(b.text, /^B on other requests 11\.0 s$/);
  assert.match(b.title, /while this one waited its turn/);
  const a = g.gaps.find((x) => x.lane === "A");
  assert.ok(!a.elsewhere); // 2-20: A worked 3 of 18 s on others
  assert.match(a.text, /waits for B/);
});

test("axis labels stay inside the chart and apart; the last one ends at the edge instead of past it", () => {
  for (const total of [7, 59, 100, 333, 3700]) {
    for (const width of [280, 312, 480]) {
      const g = waterfall({ request_id: "a", records: [R("a", "encode", "A", 0, total)] }, { width });
      const shown = g.axis.filter((a) => a.label);
      assert.ok(shown.length >= 2, `${total} s at ${width} px: ${shown.length} labels`);
      for (const a of shown) assert.ok(a.left >= 0 && a.right <= width, `${a.label} [${a.left}, ${a.right}] of ${width}`);
      for (let i = 1; i < shown.length; i += 1) assert.ok(shown[i].left >= shown[i - 1].right + DEFAULT_LAYOUT.minLabelGap);
    }
  }
  const g = waterfall({ request_id: "a", records: [R("a", "encode", "A", 0, 100)] }, { width: 312 });
  const last = g.axis.filter((a) => a.label).pop();
  assert.equal(last.label, "1 m 40 s"); // once clipped to "1 m 40"
  assert.equal(last.anchor, "end");
});

test("bar labels are only drawn when they fit their bar", () => {
  const g = waterfall(splitDecodeRequest(), { width: 400 });
  for (const b of g.bars) {
    if (b.text) assert.ok(b.text.length * DEFAULT_LAYOUT.charWidth + 6 <= b.w, `${b.text} in ${b.w} px`);
  }
  assert.equal(g.bars.find((b) => b.stage === "denoise").text, "denoise 10.0 s");
});

test("a cached encode of an earlier prompt does not stretch the row of the run that used it", () => {
  const store = new H3Store();
  const rid = "c1";
  // prompt p1 encoded and then failed on B; prompt p2 (encode cached) ran the denoise 20 s later
  store.ingestTiming({ prompt_id: "p1", node: "3", node_type: "H3TextEncode", request_id: rid,
                       stages: [R(rid, "encode", "A", 100, 100.2)], summary: { compute_s: 0.2, workflow: "t2va" } });
  store.ingestTiming({ prompt_id: "p2", node: "5", node_type: "H3RemoteDenoise", request_id: rid,
                       stages: [R(rid, "a_to_b", "B", 120, 120.1), R(rid, "denoise", "B", 120.1, 129, { steps: [3, 3, 3] }),
                                R(rid, "b_to_a", "A", 129, 129.2)], summary: { compute_s: 8.9, machine: "B" } });
  store.ingestTiming({ prompt_id: "p2", node: "6", node_type: "H3Decode", request_id: rid,
                       stages: [R(rid, "decode", "A", 129.2, 130.4)], summary: { compute_s: 1.2 } });
  const req = store.request(rid, { create: false });
  assert.deepEqual(runRecords(req).map((r) => r.stage), ["a_to_b", "denoise", "b_to_a", "decode"]);
  assert.deepEqual(cachedRecords(req).map((r) => r.stage), ["encode"]);
  const s = requestSummary(req);
  near(s.total_s, 10.4); // not 30.4
  assert.deepEqual(s.cached.map((c) => c.stage), ["encode"]);
  near(waterfall(req).total_s, 10.4);
  near(store.requestSpan(rid).total_s, 10.4);
  assert.equal(requestName(req), "t2va");
});

test("ComfyUI's history gives earlier prompts' records their prompt (a reload keeps a cached encode out)", () => {
  const store = new H3Store();
  const rid = "h1";
  const payload = (pid, stages, extra = {}) => ({ prompt_id: pid, node: "3", node_type: "H3TextEncode", request_id: rid,
                                                  stages, summary: extra });
  store.ingestHistory({
    p1: { outputs: { 3: { h3_timing: [payload("p1", [R(rid, "encode", "A", 100, 100.2)], { workflow: "fl2va", batch: [2, 3] })] } } },
    p2: { outputs: { 5: { h3_timing: [payload("p2", [R(rid, "denoise", "B", 120, 125)])] } } },
  });
  const req = store.request(rid, { create: false });
  assert.equal(req.run_prompt, "p2");
  assert.deepEqual(runRecords(req).map((r) => r.stage), ["denoise"]);
  assert.equal(req.workflow, "fl2va");
  assert.deepEqual(req.batch, [2, 3]);
  assert.equal(store.findNode("3"), null); // history fills the timeline, not the readouts of the graph on screen
  assert.equal(store.ingestHistory(null), 0);
});

test("a row is named after the workflow it was queued from, its kind, and a re-run after its first run", () => {
  const store = new H3Store();
  store.ingestTiming({ prompt_id: "p1", node: "3", node_type: "H3TextEncode", request_id: "abc",
                       stages: [R("abc", "encode", "A", 1, 2)], summary: { workflow: "fl2va", batch: [3, 4] } });
  const req = store.request("abc", { create: false });
  assert.deepEqual(req.batch, [3, 4]);
  assert.equal(requestName(req), "fl2va");
  assert.ok(store.setPromptName("p1", "h3_fl2va.json"));
  assert.equal(requestName(req, store.promptNames.get("p1")), "h3_fl2va.json (fl2va)");
  const rerun = store.request("abc.2");
  assert.equal(requestName(rerun, "", store), "fl2va");
});

test("readouts follow the workflow on screen: another graph's node with the same id shows its own state", () => {
  const store = new H3Store();
  store.setActiveWorkflow("a.json");
  store.setPromptName("pa", "a.json");
  store.ingestTiming({ prompt_id: "pa", node: "5", node_type: "H3RemoteDenoise", request_id: null, stages: [],
                       summary: { compute_s: 1 } });
  assert.ok(store.findNode("5")?.timing);
  store.setActiveWorkflow("b.json");
  assert.equal(store.findNode("5"), null);
  // a prompt queued from a.json keeps updating a.json's nodes while b.json is on screen
  store.ingestProgress({ prompt_id: "pa", node: "5", request_id: "r", step: 1, total: 3, seconds: 1 });
  assert.equal(store.findNode("5"), null);
  store.setActiveWorkflow("a.json");
  assert.equal(store.findNode("5").progress.steps.size, 1);
});

test("A inside ComfyUI's process is named so, healthy, with a readable tooltip (no raw JSON, no amber ?)", () => {
  const status = { connected: true, cluster: { mode: "local", address: "127.0.0.2:6379" },
                   topology: { A: { ip: "127.0.0.2", node_id: "aa" }, B: { ip: "127.0.0.3", node_id: "bb" } },
                   actors: [{ name: "h3_dit", health: { B: { ok: true, node_ip: "127.0.0.3", device: "cpu" } } }],
                   encoders: [{ model_path: "tiny-random", dtype: "bfloat16" }],
                   a_process: { in_process: true, hostname: "spark-a", pid: 4242 } };
  const m = statusModel(status);
  const a = m.roles.find((r) => r.role === "A");
  assert.equal(a.healthy, true);
  assert.ok(a.in_process);
  const t = roleText(a);
  assert.equal(t.state, "ok");
  assert.match(t.text, /^in ComfyUI's process on spark-a \(pid 4242\) · 127\.0\.0\.2 · node aa · encoders tiny-random bfloat16$/);
  assert.doesNotMatch(t.title, /[{}]|null/);
  // an older server without `a_process`: connected with A in the topology is still A in this process
  delete status.a_process;
  assert.equal(roleText(statusModel(status).roles.find((r) => r.role === "A")).state, "ok");
  // not connected: no answer yet, said in words
  const off = statusModel({ connected: false, topology: { A: { ip: "127.0.0.2" } }, actors: [] });
  assert.equal(roleText(off.roles.find((r) => r.role === "A")).state, "no health answer yet");
});

test("the legend names every colour, segment and mark the waterfall draws", () => {
  const keys = LEGEND.map((x) => x.key);
  for (const k of ["encode", "a_to_b", "denoise", "decode", "save", "context", "wait", "fetch", "materialize", "gap",
                   "live", "slow", "tick"]) {
    assert.ok(keys.includes(k), k);
  }
  assert.ok(LEGEND.every((x) => x.label && x.cls));
});
