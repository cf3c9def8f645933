// The status panel shows what each machine holds (issue 29): B's resident memory per worker and partition, a
// released worker, A's DiT rank, A's encoders with their own count. Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import { heldText, roleText, statusModel, workerRows, workerText } from "../../web/h3_status.js";

const MIB = 2 ** 20;
const STATUS = {
  connected: true, cluster: { mode: "address", address: "10.0.0.1:6379" }, nodes: [], error: null, time: 1,
  topology: { A: { ip: "10.0.0.1" }, B: { ip: "10.0.0.2" } }, a_process: { in_process: true, pid: 7 },
  actors: [{ name: "h3_dit*", namespace: "comfy_h3", health: { B: { ok: true, node_ip: "10.0.0.2" } } }],
  workers: [
    { name: "h3_dit", node: "10.0.0.2", partitions: ["transformer", "transformer_ref"], queue: [],
      resident_bytes: { transformer: 30 * MIB, transformer_ref: 30 * MIB, "vae decoder": 4 * MIB }, released: null },
    { name: "h3_dit_b2", node: "10.0.0.3", partitions: [], queue: [], resident_bytes: {},
      released: { cause: "a release on request (Release B's model)", total_bytes: 60 * MIB } },
  ],
  a_rank: { name: "h3_rank_a", node: "10.0.0.1", partitions: ["transformer"], resident_bytes: { transformer: 30 * MIB } },
  encoders: [{ model_path: "tiny-random", dtype: "float32", resident_bytes: { vae: 2 * MIB, audio_vae: MIB },
               released: { text_encoder: "ComfyUI freed memory" } }],
};

test("B's workers: resident memory per partition, or released", () => {
  const [held, released] = workerRows(STATUS.workers).map(workerText);
  assert.match(held, /holds transformer 30(\.0)? MiB \+ transformer_ref 30(\.0)? MiB \+ vae decoder 4(\.0)? MiB \(64(\.0)? MiB\)/);
  assert.match(released, /weights released \(a release on request \(Release B's model\)\): the next run reloads them/);
  assert.equal(heldText([], null), "");
});

test("A's DiT rank and A's encoders show what they hold and what ComfyUI released", () => {
  const m = statusModel(STATUS);
  assert.ok(m.ok, m.detail);
  assert.match(workerText(m.aRank), /^h3_rank_a @ 10\.0\.0\.1 · transformer · idle · holds transformer 30(\.0)? MiB/);
  const a = roleText(m.roles.find((r) => r.role === "A"));
  assert.match(a.text, /encoders tiny-random float32 holds vae 2(\.0)? MiB \+ audio_vae 1(\.0)? MiB/);
  assert.match(a.text, /released text_encoder \(ComfyUI freed memory\): the next run reloads/);
});
