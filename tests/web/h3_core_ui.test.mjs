// ComfyUI's own graph with the DiT on B in the H3 panel (#37): a finished sampling is done (not dashed as running),
// and the actor line shows once however many connections (one per model / partition) this ComfyUI holds to it.
// Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import { statusModel } from "../../web/h3_status.js";
import { H3Store } from "../../web/h3_view.js";

test("a core sampler's sampling is done once its record came, and its bar is not the running one", () => {
  const store = new H3Store();
  store.executionStart({ prompt_id: "p1" });
  store.executing({ prompt_id: "p1", node: "10" });
  store.ingestTiming({ prompt_id: "p1", node: "10", node_type: "sampler", request_id: "s1-abc",
                       stages: [{ request_id: "s1-abc", stage: "sampling", machine: "B", node: "h3_dit", start: 10,
                                  end: 12, compute_s: 1.2, steps: [0.4, 0.4, 0.4] }],
                       summary: { compute_s: 1.2, machine: "B", status: "3 forwards on B (h3_dit)" } });
  assert.equal(store.request("s1-abc", { create: false }).state, "done");
  store.executionEnd("execution_success", { prompt_id: "p1" });
  assert.equal(store.request("s1-abc", { create: false }).state, "done");
});

test("the panel lists a worker spec once, with the partitions this ComfyUI's connections use", () => {
  const b = { node_ip: "127.0.0.3", model: "m", dtype: "float32" };
  const m = statusModel({ connected: true, cluster: { mode: "address", address: "127.0.0.2:6379" },
                          actors: [{ name: "h3_dit*", namespace: "comfy_h3", partition: "transformer", health: { B: b } },
                                   { name: "h3_dit*", namespace: "comfy_h3", partition: "transformer_ref",
                                     health: { B: b } }] });
  assert.equal(m.actors.length, 1);
  assert.equal(m.actors[0].partition, "transformer, transformer_ref");
});
