// View logic of the web extension: formatting, records, aggregation across steps and across nodes, readout, status.
// Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import { readoutModel, readoutText } from "../../web/h3_readout.js";
import { statusModel } from "../../web/h3_status.js";
import { requestSummary } from "../../web/h3_timeline.js";
import {
  DEFAULT_WARN_SHARE, fmtBytes, fmtPercent, fmtSeconds, H3Store, H3_NODE_TYPES, isH3NodeType, MAX_REQUESTS,
  normalizeRecord, progressSteps, stepStats, totalBytes, transferFigures,
} from "../../web/h3_view.js";

const RID = "a1b2c3d4e5f6";

function rec(stage, machine, start, end, extra = {}) {
  return { request_id: RID, stage, machine, node: machine === "A" ? "127.0.0.2" : "127.0.0.3", start, end, ...extra };
}

function denoiseTiming({ rid = RID, aToB = 0.0612, bToA = 0.0401, compute = 41.2, node = "4" } = {}) {
  return {
    prompt_id: "p1", node, node_type: "H3RemoteDenoise", request_id: rid,
    stages: [
      rec("a_to_b", "B", 101.85, 101.85 + aToB + 0.001, { fetch_s: aToB - 0.0004, materialize_s: 0.0004, request_id: rid }),
      rec("denoise", "B", 102, 143.2, { compute_s: compute, steps: [8.3, 8.2, 8.2, 8.2, 8.3], request_id: rid }),
      rec("b_to_a", "A", 143.21, 143.21 + bToA + 0.001, { fetch_s: bToA - 0.0003, materialize_s: 0.0003, request_id: rid }),
    ],
    summary: {
      compute_s: compute, machine: "B",
      a_to_b: { producer_wait_s: 0, fetch_s: aToB - 0.0004, materialize_s: 0.0004, serialize_s: 0.006, bytes: 2621440 },
      b_to_a: { producer_wait_s: 0, fetch_s: bToA - 0.0003, materialize_s: 0.0003, bytes: 14417920 },
      steps_done: 5, steps_total: 5,
    },
  };
}

function encodeTiming({ rid = RID, node = "3", start = 100, end = 101.8 } = {}) {
  return {
    prompt_id: "p1", node, node_type: "H3TextEncode", request_id: rid,
    stages: [rec("encode", "A", start, end, { compute_s: end - start - 0.006, serialize_s: 0.006, request_id: rid,
                                               bytes: { prompt_embeds: 2359296 } })],
    summary: { compute_s: end - start - 0.006, machine: "A", a_to_b: null, b_to_a: null },
  };
}

test("node types and defaults", () => {
  assert.equal(H3_NODE_TYPES.length, 10);
  for (const t of ["H3LoadEncoders", "H3RemoteDiT", "H3LoRA", "H3Keyframes", "H3References", "H3PromptList",
                   "H3TextEncode", "H3RemoteDenoise", "H3Decode", "H3SaveVideo"]) assert.ok(isH3NodeType(t), t);
  assert.equal(isH3NodeType("KSampler"), false);
  assert.equal(isH3NodeType(undefined), false);
  assert.equal(DEFAULT_WARN_SHARE, 0.1);
  assert.equal(MAX_REQUESTS, 20);
});

test("fmtSeconds picks ms, s, minutes and hours", () => {
  assert.equal(fmtSeconds(0.0004), "0.4 ms");
  assert.equal(fmtSeconds(0.068), "68 ms");
  assert.equal(fmtSeconds(0.0441), "44 ms");
  assert.equal(fmtSeconds(0.00996), "10 ms"); // would be "10.0 ms" with one decimal
  assert.equal(fmtSeconds(0.9996), "1.0 s");
  assert.equal(fmtSeconds(41.2), "41.2 s");
  assert.equal(fmtSeconds(59.96), "1 m 00 s");
  assert.equal(fmtSeconds(125), "2 m 05 s");
  assert.equal(fmtSeconds(3725.4), "1 h 02 m");
  assert.equal(fmtSeconds(0), "0.0 ms");
  assert.equal(fmtSeconds("1.5"), "1.5 s");
  assert.equal(fmtSeconds(-0.068), "-68 ms");
  for (const bad of [null, undefined, NaN, Infinity, "x", {}, []]) assert.equal(fmtSeconds(bad), "–");
});

test("fmtBytes, fmtPercent, totalBytes", () => {
  assert.equal(fmtBytes(512), "512 B");
  assert.equal(fmtBytes(2621440), "2.5 MiB");
  assert.equal(fmtBytes(14417920), "13.8 MiB");
  assert.equal(fmtBytes(null), "–");
  assert.equal(fmtPercent(0.1234), "12 %");
  assert.equal(fmtPercent(0.0123), "1.2 %");
  assert.equal(fmtPercent(0.0001), "<0.1 %");
  assert.equal(totalBytes({ a: 1, b: 2 }), 3);
  assert.equal(totalBytes(7), 7);
  assert.equal(totalBytes("a=1;b=5"), 6);
  assert.equal(totalBytes(null), null);
});

test("normalizeRecord accepts event, JSON-route and CSV-row forms", () => {
  const fromCsv = normalizeRecord({ request_id: RID, stage: "denoise", machine: "B", node: "127.0.0.3", start: "10",
                                    end: "20.5", compute_s: "10.4", steps: "2.000000;3.500000", bytes: "x=10;y=20",
                                    fetch_s: "", note: "" });
  assert.equal(fromCsv.start, 10);
  assert.equal(fromCsv.end, 20.5);
  assert.deepEqual(fromCsv.steps, [2, 3.5]);
  assert.deepEqual(fromCsv.bytes, { x: 10, y: 20 });
  assert.equal(fromCsv.total_bytes, 30);
  assert.equal(fromCsv.fetch_s, 0);
  const xfer = normalizeRecord({ request_id: null, stage: "b_to_a", fetch_s: 0.04, materialize_s: 0.0003 });
  assert.equal(xfer.machine, "A"); // receiver of B->A
  assert.equal(xfer.request_id, null);
  assert.ok(Math.abs(xfer.receive_s - 0.0403) < 1e-12);
  for (const bad of [null, 3, "x", {}, { stage: "" }, { stage: 5 }]) assert.equal(normalizeRecord(bad), null);
});

test("transferFigures splits fetch and materialisation", () => {
  const f = transferFigures({ fetch_s: 0.061, materialize_s: 0.0004, producer_wait_s: 0.5, bytes: 2621440 });
  assert.ok(Math.abs(f.receive_s - 0.0614) < 1e-12);
  assert.equal(f.producer_wait_s, 0.5);
  assert.equal(f.bytes, 2621440);
  assert.equal(transferFigures(null), null);
});

test("aggregation across steps: h3.progress events sum into the live readout", () => {
  const store = new H3Store();
  const secs = [8.31, 8.22, 8.19];
  secs.forEach((s, i) => store.ingestProgress({ prompt_id: "p1", node: "4", request_id: RID, step: i + 1, total: 5, seconds: s }));
  // a repeated event (reconnect replay) does not count twice
  store.ingestProgress({ prompt_id: "p1", node: "4", request_id: RID, step: 3, total: 5, seconds: secs[2] });
  const ps = progressSteps(store.findNode("4").progress);
  assert.deepEqual(ps.map((e) => e.step), [1, 2, 3]);
  const st = stepStats(ps.map((e) => e.seconds));
  assert.ok(Math.abs(st.total_s - (8.31 + 8.22 + 8.19)) < 1e-9);
  const m = readoutModel(store, 4, { nodeType: "H3RemoteDenoise" });
  const text = readoutText(m);
  // h3.progress counts forwards; the node's `steps` input counts sigma points (one more)
  assert.match(text, new RegExp(`^B denoise ${fmtSeconds(8.31 + 8.22 + 8.19).replace(".", "\\.")} · forward 3 of 5 \\(6 sigma points\\)`));
  assert.match(text, /~16\.5 s left/); // mean 8.24 s x 2 steps
  assert.ok(m.classes.includes("h3-live"));
  // the request aggregate carries the same steps
  const req = store.request(RID, { create: false });
  assert.equal(progressSteps(req.progress).length, 3);
  assert.equal(req.progress.total, 5);
});

test("final readout of H3RemoteDenoise: compute, steps, A->B and B->A with the split on hover and line 2", () => {
  const store = new H3Store();
  store.ingestTiming(encodeTiming());
  store.ingestTiming(denoiseTiming());
  const m = readoutModel(store, "4");
  assert.equal(m.lines[0].map((p) => p.text).join(" · "), "B denoise 41.2 s · 8.2 s per forward · A->B 61 ms · B->A 40 ms");
  assert.equal(m.lines[1].map((p) => p.text).join(" · "),
               "A->B fetch 61 ms + mat 0.4 ms · B->A fetch 40 ms + mat 0.3 ms");
  const a2b = m.lines[0].find((p) => p.key === "a_to_b");
  assert.match(a2b.title, /fetch 61 ms \+ materialise 0\.4 ms/);
  assert.match(a2b.title, /2\.5 MiB/);
  assert.match(m.title, /request a1b2c3d4e5f6/);
  assert.deepEqual(m.slow, []); // 61 ms of a ~43 s request
  assert.equal(m.state, "done");
});

test("a transfer above the threshold share of its request is highlighted", () => {
  const store = new H3Store();
  store.ingestTiming(encodeTiming());
  // A->B of 6 s within a ~43 s request (about 14 %); B->A stays small
  store.ingestTiming(denoiseTiming({ aToB: 6 }));
  const span = store.requestSpan(RID);
  const share = 6 / span.total_s;
  assert.ok(share > 0.1 && share < 0.2, String(share));
  let m = readoutModel(store, "4", { warnShare: 0.1 });
  assert.deepEqual(m.slow, ["a_to_b"]);
  assert.ok(m.classes.includes("h3-has-slow"));
  assert.match(m.lines[0].find((p) => p.key === "a_to_b").cls, /h3-slow/);
  assert.doesNotMatch(m.lines[0].find((p) => p.key === "b_to_a").cls, /h3-slow/);
  m = readoutModel(store, "4", { warnShare: 0.2 });
  assert.deepEqual(m.slow, []);
});

test("aggregation across nodes by request_id; load/connect records stay out of the requests", () => {
  const store = new H3Store();
  store.ingestTiming({ node: "1", node_type: "H3LoadEncoders", request_id: null,
                       stages: [{ request_id: null, stage: "load", machine: "A", start: 1, end: 15, load_s: 14 }],
                       summary: { compute_s: 14, machine: "A" } });
  store.ingestTiming(encodeTiming());
  store.ingestTiming(denoiseTiming());
  store.ingestTiming({ node: "5", node_type: "H3Decode", request_id: RID,
                       stages: [rec("decode", "A", 143.3, 149.6, { compute_s: 6.3 })],
                       summary: { compute_s: 6.3, machine: "A" } });
  assert.equal(store.requests.size, 1);
  assert.equal(store.loads.length, 1);
  const req = store.request(RID, { create: false });
  assert.deepEqual(req.records.map((r) => r.stage), ["encode", "a_to_b", "denoise", "b_to_a", "decode"]);
  assert.deepEqual([...req.nodes.keys()].sort(), ["3", "4", "5"]);
  assert.equal(req.state, "done");
  const s = requestSummary(req);
  assert.ok(Math.abs(s.total_s - 49.6) < 1e-9);
  assert.ok(Math.abs(s.stages.denoise - 41.2) < 1e-9);
  assert.equal(s.steps.count, 5);
  assert.ok(Math.abs(s.transfers.a_to_b.share - 0.0612 / 49.6) < 1e-9);
  // the same payload again (h3.timing and executed.output.h3_timing) changes nothing
  const v = req.version;
  store.ingestExecuted({ node: "4", output: { h3_timing: [denoiseTiming()] } });
  assert.equal(req.version, v);
  assert.equal(req.records.length, 5);
  // /h3/timings rows of the same request merge without duplicates
  store.ingestRecords({ records: req.records.map((r) => ({ ...r })) });
  assert.equal(req.records.length, 5);
  // readouts of encode/decode nodes: their compute time
  assert.equal(readoutModel(store, "3").lines[0][0].text, `A encode ${fmtSeconds(1.8 - 0.006)}`);
  assert.equal(readoutModel(store, "5").lines[0][0].text, "A decode 6.3 s");
  assert.equal(readoutModel(store, "1").lines[0][0].text, "A load 14.0 s");
});

test("only the last N requests are kept, newest first", () => {
  const store = new H3Store({ maxRequests: 3 });
  for (let i = 0; i < 5; i += 1) {
    store.ingestRecords([{ request_id: `r${i}`, stage: "encode", machine: "A", start: 100 + i * 10, end: 101 + i * 10 }]);
  }
  assert.deepEqual(store.requestList().map((r) => r.request_id), ["r4", "r3", "r2"]);
});

test("execution events drive node states; subgraph ids match by suffix", () => {
  const store = new H3Store();
  store.executionStart({ prompt_id: "p1" });
  store.executing("3");
  assert.equal(readoutModel(store, "3", { nodeType: "H3TextEncode" }).lines[0][0].text, "A encode running…");
  store.ingestTiming(encodeTiming());
  store.executing("4");
  assert.equal(store.findNode("3").state, "done");
  store.executionEnd("execution_error", { node_id: "4", exception_message: "B actor died" });
  const m = readoutModel(store, "4", { nodeType: "H3RemoteDenoise" });
  assert.equal(m.state, "error");
  assert.equal(m.title, "B actor died");
  store.executionStart({ prompt_id: "p2" });
  assert.equal(store.findNode("3").state, "stale");
  store.ingestTiming({ ...encodeTiming({ rid: "other" }), node: "12:3" });
  assert.equal(store.findNode(3).state, "stale"); // exact id first
  assert.equal(store.findNode("7"), null);
  store.ingestTiming({ ...encodeTiming({ rid: "other2" }), node: "12:7" });
  assert.equal(store.findNode(7).id, "12:7");
  assert.equal(readoutModel(store, "99").lines[0][0].text, "A compute –");
});

test("malformed payloads are ignored without throwing", () => {
  const store = new H3Store();
  for (const bad of [null, undefined, 1, "x", [], {}, { node: null }, { node: "1", stages: "nope", summary: 3 }]) {
    store.ingestTiming(bad);
    store.ingestProgress(bad);
    store.ingestExecuted(bad);
    store.ingestRecords(bad);
    store.executing(bad);
    store.executionStart(bad);
    store.executionCached(bad);
    store.executionEnd("execution_error", bad);
  }
  assert.equal(readoutModel(store, "1").lines.length, 1);
  assert.equal(store.requests.size, 0);
});

test("a timing without a graph node (headless run) still feeds the timeline", () => {
  const store = new H3Store();
  assert.equal(store.ingestTiming({ ...encodeTiming(), node: null }), true);
  assert.equal(store.request(RID, { create: false }).records.length, 1);
  assert.equal(store.nodes.size, 0);
  // load records carry request_id "" from the runner: no request for them
  store.ingestTiming({ node: null, request_id: null, stages: [{ request_id: "", stage: "load", machine: "A", start: 1, end: 2 }] });
  assert.equal(store.requests.size, 1);
  assert.equal(store.loads.length, 1);
});

test("statusModel: roles, versions, warnings when B is unreachable", () => {
  const health = (role, ip) => ({ ok: true, node_ip: ip, node_id: `${role}node`, device: "cuda:0", dtype: "bfloat16",
                                  attention_backend: "sdpa", versions: { torch: "2.13.0", "comfy-h3": "0.1.0" },
                                  memory: { rss_mb: 1024 }, uptime_s: 60 });
  const ok = { connected: true, cluster: { mode: "address", address: "127.0.0.2:6379" }, nodes: ["n1", "n2"],
               topology: { A: { ip: "127.0.0.2" }, B: { ip: "127.0.0.3" } },
               actors: [{ name: "h3_dit", health: { A: health("A", "127.0.0.2"), B: { ...health("B", "127.0.0.3"), busy: true } } }],
               error: null };
  let m = statusModel(ok);
  assert.equal(m.ok, true);
  assert.equal(m.warning, null);
  assert.deepEqual(m.roles.map((r) => [r.role, r.ip]), [["A", "127.0.0.2"], ["B", "127.0.0.3"]]);
  assert.equal(m.roles[1].busy, true);
  assert.equal(m.cluster, "address 127.0.0.2:6379");
  m = statusModel({ ...ok, error: "B actor 'h3_dit' is unreachable: timeout" });
  assert.equal(m.ok, false);
  assert.equal(m.warning, "B unreachable");
  assert.match(m.detail, /timeout/);
  m = statusModel({ connected: false, error: null });
  assert.equal(m.warning, "B unreachable");
  assert.equal(m.detail, "not connected to the Ray cluster");
  m = statusModel({ ...ok, actors: [{ name: "h3_dit", error: "dead" }] });
  assert.equal(m.warning, "B unreachable");
  m = statusModel(null, { fetchError: "HTTP 502" });
  assert.equal(m.warning, "H3 status unavailable");
  assert.equal(m.detail, "HTTP 502");
  const mixed = JSON.parse(JSON.stringify(ok));
  mixed.actors[0].health.B.versions.torch = "2.12.0";
  assert.deepEqual(statusModel(mixed).mismatches, [{ name: "torch", A: "2.13.0", B: "2.12.0" }]);
});

test("the denoise readout shows the effective schedule B ran", async () => {
  const { H3Store } = await import("../../web/h3_view.js");
  const store = new H3Store();
  const rec = { request_id: "r1", stage: "denoise", machine: "B", node: "127.0.0.3", start: 1, end: 2,
                compute_s: 1, steps: [0.5, 0.5], bytes: {}, note: "" };
  store.ingestTiming({ node: "5", node_type: "H3RemoteDenoise", request_id: "r1", stages: [rec],
                    summary: { compute_s: 1, machine: "B", a_to_b: null, b_to_a: null, steps_done: 2,
                               steps_total: 2, schedule: "4 sigma points: 3 forwards, shift 5 (video) / 3 (audio)" } });
  const text = readoutText(readoutModel(store, "5"));
  assert.match(text, /shift 5 \(video\)/);
});

test("records measured on B are put on A's clock with their offset", async () => {
  const { normalizeRecord } = await import("../../web/h3_view.js");
  const r = normalizeRecord({ request_id: "r", stage: "denoise", machine: "B", start: 100.5, end: 101.5,
                              clock_offset_s: 0.25 });
  assert.equal(r.start, 100.25);
  assert.equal(r.end, 101.25);
  const a = normalizeRecord({ request_id: "r", stage: "encode", machine: "A", start: 100, end: 100.5 });
  assert.equal(a.start, 100);
});

test("B's model list comes from H3RemoteDiT's h3.timing or /h3/status, nothing else", async () => {
  const { bModelsFrom, sameChoices, B_MODEL_NODE_TYPE, MODEL_WIDGET } = await import("../../web/h3_view.js");
  assert.equal(B_MODEL_NODE_TYPE, "H3RemoteDiT");
  assert.equal(MODEL_WIDGET, "model_path");
  const timing = { node: "2", node_type: "H3RemoteDiT", summary: { b_models: ["/m/H3", "tiny-random", "/m/H3", "", 7] } };
  assert.deepEqual(bModelsFrom(timing), ["/m/H3", "tiny-random"]);
  assert.equal(bModelsFrom({ ...timing, node_type: "H3RemoteDenoise" }), null);
  assert.equal(bModelsFrom({ node_type: "H3RemoteDiT", summary: {} }), null);
  assert.equal(bModelsFrom({ node_type: "H3RemoteDiT", summary: { b_models: [] } }), null);
  assert.deepEqual(bModelsFrom({ connected: true, models: { A: ["/a"], B: ["/b", "tiny-random"] } }), ["/b", "tiny-random"]);
  assert.equal(bModelsFrom({ connected: false, models: { A: ["tiny-random"] } }), null);
  assert.equal(bModelsFrom({ connected: true }), null);
  for (const junk of [null, undefined, 3, "x", [], { models: "B" }, { node_type: "H3RemoteDiT", summary: null }]) {
    assert.equal(bModelsFrom(junk), null);
  }
  assert.ok(sameChoices(["a", "b"], ["a", "b"]));
  assert.ok(!sameChoices(["a", "b"], ["b", "a"]));
  assert.ok(!sameChoices(undefined, ["a"]));
});

test("shortId keeps a re-run suffix so repeated requests on one conditioning stay apart", async () => {
  const { shortId } = await import("../../web/h3_view.js");
  assert.equal(shortId("65b213cfa7a8", 8), "65b213cf");
  assert.equal(shortId("65b213cfa7a8.3", 8), "65b213cf.3");
  assert.equal(shortId("abc.12"), "abc.12");
  assert.equal(shortId("v1.2.3-alpha"), "v1.2.3");
  assert.equal(shortId(""), "–");
  assert.equal(shortId(null), "–");
});
