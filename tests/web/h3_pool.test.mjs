// The status panel lists every DiT worker of a pool (GET /h3/status `workers`). Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import { statusModel, workerRows, workerText } from "../../web/h3_status.js";

const WORKERS = [
  { name: "h3_dit", node: "10.0.0.2", partitions: ["transformer"], queued_steps: 13, current_request: "abcdef123456",
    client: "sparkA:4242 (job 01000000)", current: { request_id: "abcdef123456", step: 3, total: 8 },
    queue: [{ request_id: "abcdef123456", steps: 8, client: "sparkA:4242 (job 01000000)", state: "running" },
            { request_id: "0011223344", steps: 8, client: "laptop:77 (job 02000000)", state: "queued" }] },
  { name: "h3_dit_b2", node: "10.0.0.3", partitions: ["transformer_ref"], queued_steps: 0, current_request: null,
    client: null, current: null, queue: [] },
];

test("pool workers: node, partitions, current request and its client, queue in steps", () => {
  const rows = workerRows(WORKERS);
  assert.equal(rows.length, 2);
  assert.deepEqual([rows[0].queued, rows[0].queuedSteps, rows[0].step, rows[0].total], [1, 13, 3, 8]);
  assert.deepEqual(rows[0].clients, ["sparkA:4242 (job 01000000)", "laptop:77 (job 02000000)"]);
  assert.equal(workerText(rows[0]),
               "h3_dit @ 10.0.0.2 · transformer · running abcdef 3/8 for sparkA:4242 (job 01000000) · 1 queued (13 steps)");
  assert.equal(workerText(rows[1]), "h3_dit_b2 @ 10.0.0.3 · transformer_ref · idle");
  const m = statusModel({ connected: true, cluster: { mode: "local" }, actors: [], workers: WORKERS, error: null });
  assert.deepEqual(m.workers.map((w) => w.name), ["h3_dit", "h3_dit_b2"]);
  assert.deepEqual(workerRows(undefined), []);
  assert.deepEqual(workerRows([null, 3]), []);
});

test("A's DiT rank (parallel denoise) is listed with the workers, with its machine and pid", () => {
  const rank = { name: "h3_rank_a", machine: "A", role: "DiT rank (parallel denoise)", node: "10.0.0.1", pid: 4321,
                 partitions: ["transformer"], queued_steps: 0, current: null, queue: [] };
  const [b, a] = workerRows([WORKERS[1], rank]);
  assert.equal(workerText(a), "h3_rank_a @ 10.0.0.1 (A's DiT rank, pid 4321) · transformer · idle");
  assert.equal(workerText(b), "h3_dit_b2 @ 10.0.0.3 · transformer_ref · idle");
  const [gone] = workerRows([{ ...rank, ok: false, error: "A's DiT rank did not answer: ActorDiedError" }]);
  assert.equal(workerText(gone), "h3_rank_a @ 10.0.0.1 (A's DiT rank, pid 4321) · A's DiT rank did not answer: ActorDiedError");
});

test("what waits for B: ComfyUI's queued prompts that reach B, running first, then pending in order", async () => {
  const { queueText } = await import("../../web/h3_status.js");
  const queue = [{ number: 4, prompt_id: "p4", state: "running", b_nodes: ["5"], client_id: "aaaaaa11" },
                 ...[5, 6, 7, 8, 9, 10].map((n) => ({ number: n, prompt_id: `p${n}`, state: "pending", b_nodes: ["5"],
                                                      client_id: n % 2 ? "bbbbbb22" : "aaaaaa11" }))];
  assert.equal(queueText(queue), "waiting for B: 7 prompts · running #4 (client aaaaaa) · 6 pending: #5 (client " +
               "bbbbbb), #6 (client aaaaaa), #7 (client bbbbbb), #8 (client aaaaaa), #9 (client bbbbbb), … 1 more");
  assert.equal(queueText([]), "");
  assert.equal(queueText(undefined), "");
  const m = statusModel({ connected: true, cluster: { mode: "local" }, actors: [], workers: [], queue, error: null });
  assert.equal(m.queue.length, 7);
});
