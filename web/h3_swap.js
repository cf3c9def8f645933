// comfy-h3 web extension: "Run on machine B", the swap of ComfyUI's UNETLoader for the pack's H3RemoteModel (#28).
//
// No ComfyUI import and no side effects at load time (ComfyUI also loads it as an extension script on its own): the
// glue (h3_extension.js) hands over the graph's node and a way to make nodes (LiteGraph.createNode). Works on the
// graph the node lives in: the root graph or a subgraph (whose inputs and outputs are the nodes with ids -10, -20).

export const SWAP_FROM_TYPE = "UNETLoader";
export const SWAP_TO_TYPE = "H3RemoteModel";
export const SWAP_MENU_LABEL = "Run on machine B";
const MODEL_NAME = "unet_name";
const SUBGRAPH_INPUT_ID = -10;
const SUBGRAPH_OUTPUT_ID = -20;

function typeOf(node) {
  return node?.comfyClass ?? node?.constructor?.comfyClass ?? node?.type ?? null;
}

/** Whether a node is one the menu entry is offered on. */
export function isSwappable(node) {
  return typeOf(node) === SWAP_FROM_TYPE;
}

function linkOf(graph, id) {
  if (id === null || id === undefined) return null;
  const links = graph?.links;
  return graph?.getLink?.(id) ?? links?.get?.(id) ?? links?.[id] ?? null;
}

function widgetOf(node, name) {
  return node?.widgets?.find?.((w) => w?.name === name) ?? null;
}

function outputIndex(node, type) {
  return (node?.outputs ?? []).findIndex((o) => o?.type === type);
}

/**
 * What a swap re-makes, read from the node before anything changes: its position, its `unet_name` value, the targets
 * of its MODEL output and the links into its inputs ({name, origin_id, origin_slot}).
 */
export function swapPlan(graph, node) {
  const slot = Math.max(0, outputIndex(node, "MODEL"));
  const targets = [];
  for (const id of node?.outputs?.[slot]?.links ?? []) {
    const l = linkOf(graph, id);
    if (l) targets.push({ id: l.target_id, slot: l.target_slot });
  }
  const inputs = [];
  for (const input of node?.inputs ?? []) {
    const l = linkOf(graph, input?.link);
    if (l) inputs.push({ name: input.name, origin_id: l.origin_id, origin_slot: l.origin_slot });
  }
  return {
    pos: [Number(node?.pos?.[0]) || 0, Number(node?.pos?.[1]) || 0],
    unetName: widgetOf(node, MODEL_NAME)?.value ?? null,
    outputSlot: slot,
    targets,
    inputs,
  };
}

/** Sets a combo's value even when its list lacks it (B's list may not have the file yet). */
function setValue(widget, value) {
  if (!widget || value === null || value === undefined) return;
  widget.value = value;
  try {
    widget.callback?.(value);
  } catch {
    /* the value is set; a widget's own callback is not ours to fix */
  }
}

/**
 * Replaces `node` (a UNETLoader) in the graph it lives in with an H3RemoteModel at the same position, `unet_name`
 * set to the UNETLoader's value, every link of its MODEL output re-made from the new node to the same targets, the
 * links into its inputs of the same name (a subgraph's promoted `unet_name`) moved over, and the old node removed.
 *
 * `createNode(type)` makes a node (LiteGraph.createNode). Returns the new node, or throws with a sentence.
 */
function box(n) {
  const [x, y] = [Number(n?.pos?.[0]) || 0, Number(n?.pos?.[1]) || 0];
  const [w, h] = [Number(n?.size?.[0]) || 0, Number(n?.size?.[1]) || 0];
  return { x, y, w, h, bottom: y + h, right: x + w };
}

/**
 * The swap leaves no overlap: the new node keeps the old one's width where its widgets fit it, and when it is taller
 * every node below it in its column (across its width, under the old node's top) moves down by what it grew, so
 * the column keeps its spacing (ComfyUI's i2v template: "Load LoRA" sat 52 units under the taller node). Returns
 * how far they moved.
 */
export function makeRoom(graph, made, old) {
  const want = typeof made.computeSize === "function" ? made.computeSize() : made.size;
  const width = Math.max(old.w, Number(want?.[0]) || 0);
  const height = Math.max(Number(made.size?.[1]) || 0, Number(want?.[1]) || 0);
  if (typeof made.setSize === "function") made.setSize([width, height]);
  else made.size = [width, height];
  const grew = made.pos[1] + height - old.bottom;
  if (!(grew > 0)) return 0;
  const right = made.pos[0] + width;
  for (const n of graph?.nodes ?? graph?._nodes ?? []) {
    if (n === made) continue;
    const b = box(n);
    const across = b.x < right && b.right > made.pos[0];
    if (across && b.y >= old.y + 1) n.pos = [b.x, b.y + grew];
  }
  return grew;
}

/**
 * After the page laid the new node out (a Vue node's element may be taller than its `size` said): every node of its
 * column that starts above `bottom` (the node's drawn bottom, canvas units) plus a gap, title bar included, and all
 * below them, move down by what is missing. Returns how far they moved (0: nothing overlapped).
 */
export function clearBelow(graph, made, bottom, title = 30, gap = 10) {
  const left = Number(made.pos?.[0]) || 0;
  const right = left + (Number(made.size?.[0]) || 0);
  const top = Number(made.pos?.[1]) || 0;
  const column = (graph?.nodes ?? graph?._nodes ?? []).filter((n) => {
    if (n === made) return false;
    const b = box(n);
    return b.x < right && b.right > left && b.y > top;
  });
  const first = Math.min(...column.map((n) => box(n).y - title));
  const need = bottom + gap - first;
  if (!column.length || !(need > 0)) return 0;
  for (const n of column) n.pos = [box(n).x, box(n).y + need];
  return need;
}

/** The widgets a subgraph's node outside shows for the subgraph input `name` (a promoted `unet_name`). */
export function promotedWidgets(rootNodes, graph, name) {
  const out = [];
  for (const n of rootNodes ?? []) {
    if (n?.subgraph !== graph) continue;
    for (const w of n.widgets ?? []) if (w?.name === name || w?.label === name) out.push(w);
  }
  return out;
}

/** A combo's choices replaced in place (a Vue node's select keeps the array it was given). */
export function setChoices(widget, values) {
  if (!widget?.options || !Array.isArray(values)) return;
  const have = widget.options.values;
  if (Array.isArray(have) && !Object.isFrozen(have)) have.splice(0, have.length, ...values);
  else widget.options.values = [...values];
}

export function swapToRemoteModel(node, { createNode, graph = node?.graph, rootNodes = [] } = {}) {
  if (!isSwappable(node)) throw new Error(`"${SWAP_MENU_LABEL}" swaps a ${SWAP_FROM_TYPE}, not ${typeOf(node)}`);
  if (!graph || typeof graph.add !== "function") throw new Error(`the ${SWAP_FROM_TYPE} is in no graph`);
  const made = createNode?.(SWAP_TO_TYPE);
  if (!made) throw new Error(`no ${SWAP_TO_TYPE} node type: is the comfy-h3 pack loaded by ComfyUI?`);
  const plan = swapPlan(graph, node);
  const old = box(node);
  made.pos = [...plan.pos];
  graph.add(made);
  setValue(widgetOf(made, MODEL_NAME), plan.unetName);
  const out = Math.max(0, outputIndex(made, "MODEL"));
  for (const t of plan.targets) {
    if (Number(t.id) === SUBGRAPH_OUTPUT_ID) { // ids may come as strings
      graph.outputNode?.slots?.[t.slot]?.connect?.(made.outputs[out], made);
      continue;
    }
    const target = graph.getNodeById(t.id);
    if (target) made.connect(out, target, t.slot);
  }
  graph.remove(node);
  for (const i of plan.inputs) {
    const at = (made.inputs ?? []).findIndex((x) => x?.name === i.name);
    if (at < 0) continue;
    try {
      if (Number(i.origin_id) === SUBGRAPH_INPUT_ID) { // ids may come as strings
        graph.inputNode?.slots?.[i.origin_slot]?.connect?.(made.inputs[at], made);
      } else {
        graph.getNodeById(i.origin_id)?.connect?.(i.origin_slot, made, at);
      }
    } catch {
      /* an input the new node refuses keeps the value set on its widget */
    }
  }
  // the promoted value (if the link was refused or re-made) never overrides the UNETLoader's own
  setValue(widgetOf(made, MODEL_NAME), plan.unetName);
  makeRoom(graph, made, old);
  // a promoted unet_name (the subgraph's input, shown on its node outside) offers the new node's list: B's files
  const choices = widgetOf(made, MODEL_NAME)?.options?.values;
  for (const i of plan.inputs) {
    if (Number(i.origin_id) !== SUBGRAPH_INPUT_ID || i.name !== MODEL_NAME) continue;
    const name = graph.inputs?.[i.origin_slot]?.name ?? MODEL_NAME;
    for (const w of promotedWidgets(rootNodes, graph, name)) setChoices(w, choices);
  }
  return made;
}
