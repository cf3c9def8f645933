// What each node's readout says after a run and while B denoises: the count of a denoise in the words of the node's
// `steps` input, B's status line, LoRA adapters, previews, B's share of a split decode, the prompt list; and the room
// each node type reserves for it. Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  adaptersText, decodeShare, forwardsDoneText, forwardsText, livePreviewText, previewText, READOUT_LINE_PX,
  READOUT_LINES, READOUT_PAD_PX, readoutHeight, readoutModel, readoutText,
} from "../../web/h3_readout.js";
import { H3_NODE_TYPES, H3Store } from "../../web/h3_view.js";

const rec = (stage, machine, start, end, extra = {}) => ({ request_id: "", stage, machine, node: "spark", start, end,
                                                          compute_s: end - start, ...extra });

function timing(nodeType, node, stages, summary, requestId = null) {
  return { prompt_id: "p1", node, node_type: nodeType, request_id: requestId, stages,
           summary: { compute_s: 0.25, machine: "A", a_to_b: null, b_to_a: null, ...summary } };
}

test("a denoise's count, once, in the node's words: forwards, and sigma points one more", () => {
  // steps=50 is 50 sigma points, 49 forwards (the old readout said "step 49/49"); turbo's 4 are 3 forwards
  assert.equal(forwardsDoneText(49, 49), "49 forwards (50 sigma points)");
  assert.equal(forwardsDoneText(3, 3), "3 forwards (4 sigma points)");
  assert.equal(forwardsText(12, 49), "forward 12 of 49 (50 sigma points)");
  assert.equal(forwardsDoneText(12, 49), "stopped after forward 12 of 49 (50 sigma points)");
  assert.equal(forwardsText(2, null), "forward 2");
});

test("previews: count, size, bytes and their share of a forward, or why there were none", () => {
  assert.equal(previewText({ note: "", count: 12, cost_s: 0.036, every: 1, bytes: 2048, size: [32, 32],
                             source: "ComfyUI", share_of_step: 0.003 }),
               "previews: 12 × 32x32 JPEG, 2.0 KiB each, 0.3 % of a forward on B");
  assert.equal(previewText({ count: 6, bytes: 1000, size: [64, 36], every: 8, cost_s: 0.2 }),
               "previews: 6 × 64x36 JPEG, 1000 B each, 200 ms on B in all, every 8 forwards");
  assert.equal(previewText({ note: "previews off (ComfyUI's preview method is none)" }),
               "previews off (ComfyUI's preview method is none)");
  assert.equal(previewText(null), null);
  assert.equal(livePreviewText({ step: 3, width: 104, height: 60, bytes: 5632 }), "preview 104x60, 5.5 KiB (forward 3)");
});

test("H3RemoteDenoise: schedule and previews complete, the count said once, no 'step x/y'", () => {
  const store = new H3Store();
  const den = { request_id: "r1", stage: "denoise", machine: "B", node: "b", start: 10, end: 13, compute_s: 3,
                steps: [1, 1, 1] };
  store.ingestTiming({ ...timing("H3RemoteDenoise", "5", [den], {
    machine: "B", steps_done: 3, steps_total: 3,
    schedule: "4 sigma points on transformer (bfloat16, sdpa): 3 forwards, shift 12 (video) / 3 (audio)",
    preview: { note: "", count: 3, cost_s: 0.01, every: 1, bytes: 5632, size: [104, 60], share_of_step: 0.0033 },
    batch: [2, 4] }, "r1") });
  const text = readoutText(readoutModel(store, "5"));
  assert.match(text, /^B denoise 250 ms · 1\.0 s per forward/);
  assert.match(text, /4 sigma points on transformer \(bfloat16, sdpa\): 3 forwards, shift 12 \(video\) \/ 3 \(audio\)/);
  assert.match(text, /request 2 of 4/);
  assert.match(text, /previews: 3 × 104x60 JPEG, 5\.5 KiB each, 0\.3 % of a forward on B/);
  assert.doesNotMatch(text, /step \d+\/\d+/);
  assert.equal(text.match(/sigma points/g).length, 1);
});

test("--preview-method taesd without taeh3: the node says latent2rgb ran, what was asked and why", () => {
  const fallback = "previews: latent2rgb (taesd asked, no taeh3.safetensors in ComfyUI's vae_approx)";
  assert.equal(previewText({ note: fallback, fallback, count: 4, bytes: 1024, size: [32, 32], every: 1, cost_s: 0.02 }),
               `${fallback}: 4 × 32x32 JPEG, 1.0 KiB each, 20 ms on B in all`);
  assert.equal(previewText({ note: fallback, fallback, count: 0 }), fallback);  // none made: still said
  const store = new H3Store();
  const den = { request_id: "r1", stage: "denoise", machine: "B", node: "b", start: 10, end: 13, compute_s: 3,
                steps: [1, 1, 1] };
  store.ingestTiming({ ...timing("H3RemoteDenoise", "5", [den], {
    machine: "B", steps_done: 3, steps_total: 3, schedule: "4 sigma points on transformer (bfloat16, sdpa): 3 forwards",
    preview: { note: fallback, fallback, count: 3, cost_s: 0.01, every: 1, bytes: 5632, size: [104, 60] } }, "r1") });
  const model = readoutModel(store, "5");
  const text = readoutText(model);
  assert.match(text, /previews: latent2rgb \(taesd asked, no taeh3\.safetensors in ComfyUI's vae_approx\): 3 × 104x60/);
  assert.equal(text.match(/taesd asked/g).length, 1);
});

test("a batch's denoise readout says why it has no previews", () => {
  const why = "no previews for a batch of 3: its requests run on B after this node returned, up to 2 at a time; " +
              "a single prompt gets live previews";
  const store = new H3Store();
  const den = { request_id: "r2", stage: "denoise", machine: "B", node: "b", start: 10, end: 12, compute_s: 2,
                steps: [1, 1] };
  store.ingestTiming({ ...timing("H3RemoteDenoise", "5", [den], {
    machine: "B", steps_done: 2, steps_total: 2, schedule: "3 sigma points on transformer (float32, sdpa): 2 forwards",
    preview: { note: why }, batch: [2, 3] }, "r2") });
  const text = readoutText(readoutModel(store, "5"));
  assert.ok(text.includes(why), text);
  assert.match(text, /request 2 of 3/);
});

test("a running denoise: forward k of n with sigma points, the newest preview, its place in a batch", () => {
  const store = new H3Store();
  for (const step of [1, 2]) {
    store.ingestProgress({ prompt_id: "p", node: "5", request_id: "r", step, total: 49, seconds: 2,
                           batch: [2, 4], ...(step === 2 ? { preview: { step: 2, width: 32, height: 32, bytes: 900 } } : {}) });
  }
  const text = readoutText(readoutModel(store, "5"));
  assert.match(text, /^B denoise 4\.0 s · forward 2 of 49 \(50 sigma points\)/);
  assert.match(text, /~1 m 34 s left/);
  assert.match(text, /request 2 of 4/);
  assert.match(text, /preview 32x32, 900 B \(forward 2\)/);
});

test("H3RemoteDiT: B's status line, each part on its own line, and the memory plan", () => {
  const store = new H3Store();
  const status = "A 10.0.0.2 · B 10.0.0.3 (cuda:0; /models/MiniMax-H3, transformer, precision fp8: fp8 storage, " +
    "bfloat16 compute, attention sdpa) · pool of 2: h3_dit 10.0.0.3, h3_dit_b2 10.0.0.4";
  const plan = "B plan (fp8): transformer 12.1 GiB + working 3.2 GiB = 15.3 GiB <= 110.0 GiB free on B";
  store.ingestTiming(timing("H3RemoteDiT", "2", [rec("connect", "B", 1, 1.2, { note: status })],
                            { machine: "B", status, memory_plan: plan }));
  const m = readoutModel(store, "2");
  assert.equal(m.lines[0][0].text, "B connect 250 ms");
  assert.deepEqual(m.lines.slice(1).map((l) => l.map((p) => p.text).join(" · ")),
                   ["A 10.0.0.2",
                    "B 10.0.0.3 (cuda:0; /models/MiniMax-H3, transformer, precision fp8: fp8 storage, bfloat16 compute, " +
                    "attention sdpa)",
                    "pool of 2: h3_dit 10.0.0.3, h3_dit_b2 10.0.0.4", plan]);
});

test("H3LoRA runs its check on B: machine B, the adapters of the chain and the file B found", () => {
  const store = new H3Store();
  const summary = { machine: "B", adapters: [["/models/loras/h3_turbo_4step.safetensors", 1], ["style.safetensors", 0.6]],
                    resolved: "/models/loras/h3_turbo_4step.safetensors" };
  assert.equal(adaptersText(summary), "adapters: h3_turbo_4step.safetensors × 1, style.safetensors × 0.6");
  store.ingestTiming(timing("H3LoRA", "11", [rec("lora", "B", 1, 1.1)], summary));
  const text = readoutText(readoutModel(store, "11"));
  assert.match(text, /^B lora 250 ms\nadapters: h3_turbo_4step\.safetensors × 1, style\.safetensors × 0\.6\n/);
  assert.match(text, /file on B: \/models\/loras\/h3_turbo_4step\.safetensors$/);
  // before any run the node still says where it runs
  assert.equal(readoutText(readoutModel(new H3Store(), "11", { nodeType: "H3LoRA" })), "B lora –");
});

test("H3PromptList shows how many prompts and which seeds", () => {
  const store = new H3Store();
  store.ingestTiming(timing("H3PromptList", "12", [rec("prompts", "A", 1, 1.001)],
                            { prompts: 6, seeds: [42, 43, 44, 45, 46, 47] }));
  assert.equal(readoutText(readoutModel(store, "12")), "A prompts 250 ms\n6 prompts · seeds 42, 43, 44, 45, …");
});

test("H3Decode says when B decoded part of the video: which clips, and why", () => {
  const b = rec("decode", "B", 5, 7, { request_id: "r", info: { clips: [4, 7], of: 7, clip_s: [0.4, 0.4, 0.4] } });
  const a = rec("decode", "A", 5, 8, { request_id: "r", info: { decode_on: "A+B" } });
  assert.deepEqual(decodeShare([a, b]), { start: 4, stop: 7, of: 7, text: "B decoded 3 of 7 clips (clips 5-7), A the rest" });
  assert.equal(decodeShare([a]), null);
  const store = new H3Store();
  store.ingestTiming(timing("H3Decode", "6", [b, a], {
    machine: "B", frames: 124, decode_on: "B decodes clips 4-6 of 7: A 0.400 s, B 0.400 s, fetch 0.050 s per clip" }, "r"));
  const text = readoutText(readoutModel(store, "6"));
  assert.match(text, /^A\+B decode 250 ms\nrequest r · 124 frames\nB decoded 3 of 7 clips \(clips 5-7\), A the rest\n/);
  assert.match(text, /why: A 0\.400 s, B 0\.400 s, fetch 0\.050 s per clip$/);
  // A alone: the reason, and the node says A
  const alone = new H3Store();
  alone.ingestTiming(timing("H3Decode", "6", [a], { decode_on: "B has 1 more request(s) waiting: A decodes alone" }, "r"));
  assert.match(readoutText(readoutModel(alone, "6")), /^A decode 250 ms[\s\S]*A decoded alone: B has 1 more request/);
});

test("every node type reserves its readout's room from the start, in whole lines", () => {
  for (const t of H3_NODE_TYPES) {
    assert.ok(READOUT_LINES[t] >= 2, `${t} reserves no readout room`);
    assert.equal(readoutHeight(t), READOUT_LINES[t] * READOUT_LINE_PX + READOUT_PAD_PX);
  }
  assert.equal(readoutHeight("H3RemoteDiT", 3), 3 * READOUT_LINE_PX + READOUT_PAD_PX);
});

test("an error's sentence is on the node that failed, whole", () => {
  const store = new H3Store();
  store.executing("11");
  store.executionEnd("execution_error", { node_id: "11", exception_message: "lora_path x.safetensors is not on B; choose tiny-random." });
  const m = readoutModel(store, "11", { nodeType: "H3LoRA" });
  assert.equal(readoutText(m), "B lora failed\nlora_path x.safetensors is not on B; choose tiny-random.");
});

test("a DiT group's denoise leads with its wall time, then each rank's, its start and what auto would have done", () => {
  // what the server sends for parallel = A+B: compute_s is the group's wall time (each rank ran at the same time:
  // 45.2 s + 44.8 s is no time anyone waited), the ranks' own times, the start of A's rank it waited for
  const store = new H3Store();
  const den = (rank, compute) => ({ request_id: "g1", stage: "denoise", machine: rank ? "B" : "A", node: "n",
                                    start: 10, end: 10 + compute, compute_s: compute, steps: [0.92, 0.92],
                                    info: { rank } });
  const ran = { method: "ulysses", partition: "transformer", dtype: "bfloat16", attention_backend: "sdpa",
                wall_s: 61.3, start_s: { a_rank: 16.2, group: 0.4 },
                auto_view: "auto would have used one worker (A pipelines its encodes and decodes beside it), 1 " +
                           "request(s) in flight, A 2.00 s each, denoise 40.0 s on one rank vs 44.0 s on 2: joined " +
                           "46.0 s vs pipelined 42.0 s",
                ranks: [{ rank: 0, machine: "A", step_s: 0.92, compute_s: 45.2, comm_share: 0.1 },
                        { rank: 1, machine: "B", step_s: 0.91, compute_s: 44.8, comm_share: 0.08 }] };
  store.ingestTiming({ ...timing("H3RemoteDenoise", "5", [den(0, 45.2), den(1, 44.8)], {
    compute_s: 61.3, machine: "A", steps_done: 2, steps_total: 2, ran,
    schedule: "3 sigma points on transformer (bfloat16, sdpa): ulysses over 2 ranks" }, "g1") });
  const text = readoutText(readoutModel(store, "5"));
  assert.match(text, /^A\+B denoise 1 m 01 s · 920 ms per forward/);
  assert.match(text, /2 ranks \(ulysses\): A 45\.2 s \(920 ms\/forward\), B 44\.8 s \(910 ms\/forward\) · comm 9\.0 %/);
  assert.match(text, /includes the group's start: A's DiT rank starting 16\.2 s, the group forming 400 ms/);
  assert.match(text, /auto would have used one worker \(A pipelines its encodes and decodes beside it\)/);
  assert.doesNotMatch(text, /1 m 30 s|A denoise/);
  // a group kept from an earlier request, auto agreeing: neither line
  store.ingestTiming({ ...timing("H3RemoteDenoise", "6", [den(0, 45.2), den(1, 44.8)], {
    compute_s: 46, machine: "A", ran: { ...ran, start_s: { a_rank: 0, group: 0 }, auto_view: undefined } }, "g2") });
  const kept = readoutText(readoutModel(store, "6"));
  assert.match(kept, /^A\+B denoise 46\.0 s/);
  assert.doesNotMatch(kept, /group's start|auto would/);
});

test("a rank lost mid-denoise: the node says so and counts the re-run from its first forward", () => {
  const store = new H3Store();
  for (const step of [1, 2, 3, 4, 5, 6]) {
    store.ingestProgress({ prompt_id: "p", node: "5", request_id: "r", step, total: 49, seconds: 1 });
  }
  store.ingestProgress({ prompt_id: "p", node: "5", request_id: "r", step: 0, total: 49, seconds: 0,
                         restart: "rank A lost at step 6: re-running on B" });
  let text = readoutText(readoutModel(store, "5"));
  assert.match(text, /rank A lost at step 6: re-running on B/);
  assert.match(text, /forward 0 of 49/);
  store.ingestProgress({ prompt_id: "p", node: "5", request_id: "r", step: 1, total: 49, seconds: 2 });
  text = readoutText(readoutModel(store, "5"));
  assert.match(text, /^B denoise 2\.0 s · forward 1 of 49 \(50 sigma points\)/);  // not 7 of 49
  assert.match(text, /rank A lost at step 6: re-running on B/);
});

test("ComfyUI's own graph with the DiT on B: the sampler shows forwards, transfers and LoRAs; H3RemoteModel its note", () => {
  const store = new H3Store();
  const note = "3 forwards on B (h3_dit): B compute 0.12 s, A->B 0.003 s, B->A 0.002 s in all; per forward 0.040 s " +
    "compute, 0.0017 s transfer; LoRA h3_test_lora_a.safetensors at 0.6";
  store.ingestTiming(timing("sampler", "10", [rec("sampling", "B", 10, 11, { note })],
                            { machine: "B", compute_s: 0.12, status: note }, "s1"));
  const connect = "B h3_dit on 127.0.0.3, B was already resident; ComfyUI's MODEL of minimax_h3_t2va_pruned_bf16.safetensors";
  store.ingestTiming(timing("H3RemoteModel", "4", [rec("connect", "B", 9, 9.5, { note: connect })],
                            { machine: "B", compute_s: 0.5, status: connect }));
  const sampler = readoutText(readoutModel(store, "10", { nodeType: "sampler" }));
  assert.match(sampler, /^B sampling 120 ms/);
  assert.match(sampler, /3 forwards on B \(h3_dit\): B compute 0\.12 s, A->B 0\.003 s, B->A 0\.002 s in all/);
  assert.match(sampler, /LoRA h3_test_lora_a\.safetensors at 0\.6/);
  const model = readoutText(readoutModel(store, "4", { nodeType: "H3RemoteModel" }));
  assert.match(model, /^B connect 500 ms/);
  assert.match(model, /ComfyUI's MODEL of minimax_h3_t2va_pruned_bf16\.safetensors/);
  assert.ok(readoutHeight("sampler") > readoutHeight("KSampler"));
});
