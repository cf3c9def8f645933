// "Run on machine B" (#28): the swap of a UNETLoader for an H3RemoteModel, on a small stand-in of a LiteGraph
// subgraph (links in a Map, the subgraph's input node with id -10). The real frontends are checked by
// tests/test_comfyui_integration.py::test_core_model_swap_from_unetloader_context_menu.
// Run: node --test tests/web/
import assert from "node:assert/strict";
import { test } from "node:test";
import { isSwappable, swapPlan, swapToRemoteModel } from "../../web/h3_swap.js";

class FakeGraph {
  constructor() {
    this.nodes = [];
    this.links = new Map();
    this.nextLink = 1;
    this.nextId = 100;
    this.inputNode = {
      slots: [{ connect: (input, node) => this.link(-10, 0, node, node.inputs.indexOf(input)) }],
    };
  }

  add(node) {
    node.id ??= this.nextId++;
    node.graph = this;
    this.nodes.push(node);
  }

  getNodeById(id) {
    return this.nodes.find((n) => n.id === Number(id)) ?? null;
  }

  link(originId, originSlot, target, targetSlot) {
    const old = target.inputs[targetSlot].link;
    if (old != null) this.unlink(old);
    const id = this.nextLink++;
    this.links.set(id, { id, origin_id: originId, origin_slot: originSlot, target_id: target.id, target_slot: targetSlot });
    target.inputs[targetSlot].link = id;
    const origin = this.getNodeById(originId);
    if (origin) origin.outputs[originSlot].links.push(id);
    return id;
  }

  unlink(id) {
    const l = this.links.get(id);
    this.links.delete(id);
    const origin = this.getNodeById(l.origin_id);
    if (origin) origin.outputs[l.origin_slot].links = origin.outputs[l.origin_slot].links.filter((x) => x !== id);
    const target = this.getNodeById(l.target_id);
    if (target) target.inputs[l.target_slot].link = null;
  }

  remove(node) {
    for (const o of node.outputs) for (const id of [...o.links]) this.unlink(id);
    for (const i of node.inputs) if (i.link != null) this.unlink(i.link);
    this.nodes = this.nodes.filter((n) => n !== node);
  }
}

function makeNode(type, inputs, outputs, widgets = []) {
  const node = {
    type,
    pos: [0, 0],
    inputs: inputs.map((name) => ({ name, link: null })),
    outputs: outputs.map((type) => ({ type, links: [] })),
    widgets: widgets.map(([name, value]) => ({ name, value, type: "combo" })),
    connect(slot, target, targetSlot) {
      return this.graph.link(this.id, slot, target, targetSlot);
    },
  };
  return node;
}

const create = (type) => (type === "H3RemoteModel"
  ? makeNode(type, ["unet_name", "dtype"], ["MODEL"], [["unet_name", "b_file.safetensors"], ["dtype", "bfloat16"]])
  : null);

function subgraph() {
  const g = new FakeGraph();
  const unet = makeNode("UNETLoader", ["unet_name", "weight_dtype"], ["MODEL"],
                        [["unet_name", "minimax_h3_fl2va.safetensors"], ["weight_dtype", "default"]]);
  unet.id = 127;
  unet.pos = [-2020, 4650];
  const lora = makeNode("LoraLoaderModelOnly", ["model"], ["MODEL"]);
  lora.id = 134;
  const sw = makeNode("ComfySwitchNode", ["on_false", "on_true"], ["*"]);
  sw.id = 135;
  for (const n of [unet, lora, sw]) g.add(n);
  g.inputNode.slots[0].connect(unet.inputs[0], unet);
  unet.connect(0, lora, 0);
  unet.connect(0, sw, 1);
  return { g, unet };
}

test("only a UNETLoader is offered the swap", () => {
  assert.equal(isSwappable({ type: "UNETLoader" }), true);
  assert.equal(isSwappable({ comfyClass: "UNETLoader", type: "Load Diffusion Model" }), true);
  assert.equal(isSwappable({ type: "CheckpointLoaderSimple" }), false);
  assert.equal(isSwappable(null), false);
});

test("the swap keeps the place, the value, the MODEL targets and the subgraph's input", () => {
  const { g, unet } = subgraph();
  assert.deepEqual(swapPlan(g, unet).targets, [{ id: 134, slot: 0 }, { id: 135, slot: 1 }]);
  const made = swapToRemoteModel(unet, { createNode: create });
  assert.deepEqual(g.nodes.map((n) => n.type).sort(), ["ComfySwitchNode", "H3RemoteModel", "LoraLoaderModelOnly"]);
  assert.deepEqual(made.pos, [-2020, 4650]);
  assert.equal(made.widgets[0].value, "minimax_h3_fl2va.safetensors"); // kept though B's list lacks it
  const targets = made.outputs[0].links.map((id) => g.links.get(id)).map((l) => [l.target_id, l.target_slot]);
  assert.deepEqual(targets, [[134, 0], [135, 1]]);
  const feed = g.links.get(made.inputs[0].link);
  assert.deepEqual([feed.origin_id, feed.origin_slot], [-10, 0]);
});

test("a swap without the node type or of another node says why", () => {
  const { unet } = subgraph();
  assert.throws(() => swapToRemoteModel(unet, { createNode: () => null }), /H3RemoteModel/);
  assert.throws(() => swapToRemoteModel({ type: "VAELoader" }, { createNode: create }), /UNETLoader/);
});

test("the swap leaves no overlap: the nodes below move down by what the new node grew; the old width is kept", async () => {
  const { makeRoom, promotedWidgets, setChoices } = await import("../../web/h3_swap.js");
  const graph = { nodes: [] };
  const old = { x: 100, y: 100, w: 300, h: 82, bottom: 182, right: 400 };
  const made = { pos: [100, 100], size: [260, 60], computeSize: () => [280, 230],
                 setSize(s) { this.size = s; } };
  const lora = { pos: [100, 230], size: [300, 80] }; // under the old node, 48 units below its bottom
  const beside = { pos: [450, 230], size: [200, 80] }; // another column: stays
  const above = { pos: [100, 0], size: [300, 60] };
  graph.nodes.push(made, lora, beside, above);
  const grew = makeRoom(graph, made, old);
  assert.deepEqual(made.size, [300, 230]);
  assert.equal(grew, 100 + 230 - 182);
  assert.deepEqual(lora.pos, [100, 230 + grew]);
  assert.ok(lora.pos[1] >= made.pos[1] + made.size[1], "the LoRA node sits below the new node");
  assert.deepEqual(beside.pos, [450, 230]);
  assert.deepEqual(above.pos, [100, 0]);
  // the promoted unet_name of the subgraph's node outside gets the new list, in place
  const sub = {};
  const values = ["a.safetensors", "other_model.safetensors"];
  const outside = { subgraph: sub, widgets: [{ name: "unet_name", options: { values } }] };
  const [w] = promotedWidgets([outside, { subgraph: {} }], sub, "unet_name");
  setChoices(w, ["minimax_h3_t2va_pruned_bf16.safetensors"]);
  assert.equal(w.options.values, values);
  assert.deepEqual(values, ["minimax_h3_t2va_pruned_bf16.safetensors"]);
});

test("once laid out, a node drawn taller than its size said pushes its column down by what overlaps", async () => {
  const { clearBelow } = await import("../../web/h3_swap.js");
  const made = { pos: [430, 420], size: [640, 330] };
  const lora = { pos: [430, 782], size: [640, 130] }; // its title bar starts 30 above: 752
  const below = { pos: [430, 1000], size: [640, 100] };
  const beside = { pos: [1200, 700], size: [300, 100] };
  const graph = { nodes: [made, lora, below, beside] };
  assert.equal(clearBelow(graph, made, 778, 30, 10), 778 + 10 - 752);
  assert.deepEqual(lora.pos, [430, 818]);
  assert.deepEqual(below.pos, [430, 1036]);
  assert.deepEqual(beside.pos, [1200, 700]);
  assert.equal(clearBelow(graph, made, 778, 30, 10), 0); // nothing overlaps any more
});
