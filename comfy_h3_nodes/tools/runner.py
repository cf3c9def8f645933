"""Headless runner: executes a saved workflow of this pack's nodes without ComfyUI.

``python -m comfy_h3_nodes run WORKFLOW.json [--tiny | --model-path DIR] [--set ID.input=VALUE ...]`` takes the
editor's UI format (version 0.4) or the API format (what ``POST /prompt`` takes), checks every node against the
pack's ``INPUT_TYPES`` (unknown types, missing links and bad widget values are reported before anything runs),
executes the graph in dependency order through the same node classes ComfyUI runs, shows progress, prints a per-node
timing table and writes the MP4. ``python -m comfy_h3_nodes demo`` runs the t2va example on the embedded two-node
cluster with a tiny random checkpoint (generated on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import pathlib
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from ..engine import session
from ..engine.contract.configs import TINY
from ..engine.contract.versions import PACK_ROOT
from ..host import LocalHost, host, set_host
from ..nodes import NODE_CLASS_MAPPINGS
from . import runner_nodes
EXAMPLES = PACK_ROOT / "example_workflows"
UI_ONLY_TYPES = {"Note", "MarkdownNote"}
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
SEED_CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}


class WorkflowError(ValueError):
    """A workflow the runner cannot execute; the message names the node and the fix."""


def _mappings():
    return {**NODE_CLASS_MAPPINGS, **runner_nodes.CORE_NODES}


def input_specs(cls) -> dict[str, tuple]:
    """name -> (type_or_choices, options, section) in declaration order (required, then optional)."""
    spec = cls.INPUT_TYPES()
    out = {}
    for section in ("required", "optional"):
        for name, entry in (spec.get(section) or {}).items():
            typ = entry[0]
            opts = entry[1] if len(entry) > 1 else {}
            out[name] = (typ, opts, section)
    return out


def is_widget(typ) -> bool:
    return isinstance(typ, (list, tuple)) or typ in WIDGET_TYPES


def widget_names(cls) -> list[str]:
    return [n for n, (typ, _, _) in input_specs(cls).items() if is_widget(typ)]


# ------------------------------------------------------------------------------------------------ UI -> API
def ui_to_api(workflow: dict, mappings=None) -> dict:
    """The API prompt the frontend would build from a UI-format workflow (widget values named, links as refs)."""
    mappings = mappings or _mappings()
    links = {int(link[0]): link for link in workflow.get("links") or []}
    unknown = sorted({n["type"] for n in workflow["nodes"]
                      if n["type"] not in mappings and n["type"] not in UI_ONLY_TYPES})
    if unknown:
        raise WorkflowError(
            f"the workflow uses node types this runner does not have: {', '.join(unknown)}; it runs only this "
            f"pack's nodes ({', '.join(sorted(mappings))}). Open it in ComfyUI instead."
        )
    api = {}
    for node in workflow["nodes"]:
        if node["type"] in UI_ONLY_TYPES or node.get("mode", 0) == 2:
            continue
        if node.get("mode", 0) == 4:
            raise WorkflowError(f"node {node['id']} ({node['type']}) is bypassed; the runner does not bypass nodes.")
        cls = mappings[node["type"]]
        specs = input_specs(cls)
        values = node.get("widgets_values") or []
        if isinstance(values, dict):
            values = [values.get(n) for n in widget_names(cls)]
        values = list(values)
        inputs: dict = {}
        pos = 0
        for name in widget_names(cls):
            if pos >= len(values) and specs[name][2] == "optional" and "default" in specs[name][1]:
                inputs[name] = specs[name][1]["default"]  # saved before the widget existed: ComfyUI's default too
                continue
            if pos >= len(values):
                raise WorkflowError(
                    f"node {node['id']} ({node['type']}) has {len(values)} widget values; input {name!r} has none."
                )
            inputs[name] = values[pos]
            pos += 1
            if specs[name][1].get("control_after_generate") and pos < len(values) \
                    and values[pos] in SEED_CONTROL_VALUES:
                pos += 1
        for inp in node.get("inputs") or []:
            link_id = inp.get("link")
            if link_id is None:
                continue
            if int(link_id) not in links:
                raise WorkflowError(f"node {node['id']} input {inp['name']!r} names link {link_id}, which is missing.")
            link = links[int(link_id)]
            inputs[inp["name"]] = [str(link[1]), int(link[2])]
        api[str(node["id"])] = {"class_type": node["type"], "inputs": inputs,
                                "_meta": {"title": node.get("title") or node["type"]}}
    return api


def load_workflow(path: str | os.PathLike) -> tuple[dict, dict | None]:
    """``(api_prompt, ui_workflow_or_None)`` from a UI- or API-format JSON file."""
    p = pathlib.Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise WorkflowError(f"workflow file {p} does not exist.") from None
    except json.JSONDecodeError as exc:
        raise WorkflowError(f"workflow file {p} is not valid JSON: {exc}.") from None
    if isinstance(data, dict) and isinstance(data.get("nodes"), list):
        return ui_to_api(data), data
    if isinstance(data, dict) and data and all(isinstance(v, dict) and "class_type" in v for v in data.values()):
        return data, None
    raise WorkflowError(f"{p} is neither a ComfyUI UI workflow (with 'nodes') nor an API prompt.")


# ------------------------------------------------------------------------------------------------ checks
def check_prompt(api: dict, mappings=None) -> list[str]:
    """Every node against INPUT_TYPES: known type, required inputs present, links to existing outputs of the right
    type, literal values of the right kind, and VALIDATE_INPUTS. Returns the execution order."""
    mappings = mappings or _mappings()
    unknown = sorted({n["class_type"] for n in api.values() if n["class_type"] not in mappings})
    if unknown:
        raise WorkflowError(f"unknown node types: {', '.join(unknown)}; this runner runs only this pack's nodes.")
    for nid, node in api.items():
        cls = mappings[node["class_type"]]
        specs = input_specs(cls)
        inputs = node.get("inputs", {})
        where = f"node {nid} ({node['class_type']})"
        # like ComfyUI: an input VALIDATE_INPUTS names skips the list/range check (a typed model path is allowed)
        own_check = set(inspect.signature(cls.VALIDATE_INPUTS).parameters) if hasattr(cls, "VALIDATE_INPUTS") else set()
        for name, (typ, opts, section) in specs.items():
            value = inputs.get(name)
            if value is None:
                if section == "required":
                    kind = "a value" if is_widget(typ) else f"a link from a {typ} output"
                    raise WorkflowError(f"{where} is missing input {name!r}: connect {kind}.")
                continue
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
                src = api.get(value[0])
                if src is None:
                    raise WorkflowError(f"{where} input {name!r} links to node {value[0]}, which is not in the graph.")
                src_cls = mappings[src["class_type"]]
                if value[1] >= len(src_cls.RETURN_TYPES):
                    raise WorkflowError(f"{where} input {name!r} links to output {value[1]} of node {value[0]}, "
                                        f"which has {len(src_cls.RETURN_TYPES)} outputs.")
                out_type = src_cls.RETURN_TYPES[value[1]]
                want = "COMBO" if isinstance(typ, (list, tuple)) else typ
                if out_type != want:
                    raise WorkflowError(f"{where} input {name!r} expects {want} but is linked to a {out_type} output "
                                        f"of node {value[0]} ({src['class_type']}).")
                continue
            if name in own_check:  # its VALIDATE_INPUTS decides, below; only the kind of value is checked here
                typ, opts = ("STRING" if isinstance(typ, (list, tuple)) else typ), {}
            _check_literal(where, name, typ, opts, value)
        if hasattr(cls, "VALIDATE_INPUTS"):
            literal = {k: v for k, v in inputs.items() if not (isinstance(v, list) and len(v) == 2)}
            params = inspect.signature(cls.VALIDATE_INPUTS).parameters
            has_var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
            kwargs = literal if has_var_kw else {k: v for k, v in literal.items() if k in params}
            if getattr(cls, "INPUT_IS_LIST", False):  # ComfyUI hands such a node's validation lists too
                kwargs = {k: [v] for k, v in kwargs.items()}
            verdict = cls.VALIDATE_INPUTS(**kwargs)
            if verdict is not True:
                about = getattr(verdict, "about", None)  # a message about one input: name it, as ComfyUI cannot
                if about:
                    raise WorkflowError(f"{where} input {about!r}: {verdict.sentence}")
                raise WorkflowError(f"{where}: {verdict}")
    return _topological_order(api)


def _check_literal(where, name, typ, opts, value):
    if isinstance(typ, (list, tuple)):
        if value not in typ:
            raise WorkflowError(f"{where} input {name!r} is {value!r}; choose one of {list(typ)}.")
    elif typ == "INT":
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkflowError(f"{where} input {name!r} is {value!r}; it must be a whole number.")
        lo, hi = opts.get("min"), opts.get("max")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise WorkflowError(f"{where} input {name!r} is {value}; it must be within {lo}..{hi}.")
    elif typ == "FLOAT":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WorkflowError(f"{where} input {name!r} is {value!r}; it must be a number.")
    elif typ == "STRING" and not isinstance(value, str):
        raise WorkflowError(f"{where} input {name!r} is {value!r}; it must be text.")
    elif typ == "BOOLEAN" and not isinstance(value, bool):
        raise WorkflowError(f"{where} input {name!r} is {value!r}; it must be true or false.")


def _topological_order(api: dict) -> list[str]:
    deps = {nid: {v[0] for v in node.get("inputs", {}).values() if isinstance(v, list) and len(v) == 2}
            for nid, node in api.items()}
    order, ready = [], sorted((n for n, d in deps.items() if not d), key=_id_key)
    remaining = {n: set(d) for n, d in deps.items() if d}
    while ready:
        n = ready.pop(0)
        order.append(n)
        for m in sorted(list(remaining), key=_id_key):
            remaining[m].discard(n)
            if not remaining[m]:
                del remaining[m]
                ready.append(m)
    if remaining:
        raise WorkflowError(f"the graph has a cycle through nodes {sorted(remaining, key=_id_key)}.")
    return order


def _id_key(nid: str):
    return (0, int(nid)) if nid.isdigit() else (1, nid)


# ------------------------------------------------------------------------------------------------ execution
@dataclass
class RunResult:
    prompt_id: str
    outputs: dict = field(default_factory=dict)      # node id -> one list per output slot (ComfyUI's own form)
    ui: dict = field(default_factory=dict)           # node id -> ui dict
    events: list = field(default_factory=list)       # (event, data) in order
    seconds: float = 0.0

    def timing_payloads(self) -> dict[str, dict]:
        return {d["node"]: d for e, d in self.events if e == "h3.timing"}

    def videos(self) -> list[pathlib.Path]:
        """Every MP4 the run wrote, in the order they were saved (a batch saves one per prompt)."""
        paths = []
        for event, payload in self.events:
            if event == "h3.timing" and payload["node_type"] == "H3SaveVideo":
                paths.extend(pathlib.Path(s["note"]) for s in payload["stages"] if s["stage"] == "save")
        return paths


async def run_prompt(api: dict, ui_workflow: dict | None = None, prompt_id: str | None = None) -> RunResult:
    mappings = _mappings()
    order = check_prompt(api, mappings)
    h = host()
    prompt_id = prompt_id or uuid.uuid4().hex
    if hasattr(h, "current_prompt"):
        h.current_prompt = prompt_id
    result = RunResult(prompt_id)
    start_events = len(getattr(h, "events", []))
    t_run = time.perf_counter()
    for nid in order:
        node = api[nid]
        cls = mappings[node["class_type"]]
        lists = {}  # every input as a list, as ComfyUI holds them
        for name, value in node.get("inputs", {}).items():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
                lists[name] = result.outputs[value[0]][value[1]]
            else:
                lists[name] = [value]
        hidden = (cls.INPUT_TYPES().get("hidden") or {})
        for name, kind in hidden.items():
            lists[name] = [{"UNIQUE_ID": nid, "PROMPT": api,
                            "EXTRA_PNGINFO": {"workflow": ui_workflow} if ui_workflow else None}.get(kind)]
        h.send_event("executing", {"node": nid, "display_node": nid, "prompt_id": prompt_id})
        result.outputs[nid], result.ui[nid] = await _call_over_lists(cls, lists)
        if result.ui.get(nid):
            h.send_event("executed", {"node": nid, "display_node": nid, "output": result.ui[nid],
                                      "prompt_id": prompt_id})
    h.send_event("executing", {"node": None, "prompt_id": prompt_id})
    result.seconds = time.perf_counter() - t_run
    result.events = list(getattr(h, "events", [])[start_events:])
    return result


async def _call_over_lists(cls, lists: dict) -> tuple[tuple, dict]:
    """Call a node the way ComfyUI does with list values: once with the lists when it declares ``INPUT_IS_LIST``,
    else once per item (the longest list sets the count; shorter lists repeat their last item). Returns one list per
    output slot (``OUTPUT_IS_LIST`` slots concatenated) and the ``ui`` dicts merged key by key."""
    if getattr(cls, "INPUT_IS_LIST", False):
        calls = [lists]
    else:
        n = max((len(v) for v in lists.values()), default=1)
        calls = [{k: v[min(i, len(v) - 1)] for k, v in lists.items()} for i in range(n)]
    is_list = getattr(cls, "OUTPUT_IS_LIST", None) or (False,) * len(cls.RETURN_TYPES)
    slots: list[list] = [[] for _ in cls.RETURN_TYPES]
    uis: list[dict] = []
    for kwargs in calls:
        out = getattr(cls(), cls.FUNCTION)(**kwargs)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, dict):
            uis.append(out.get("ui") or {})
            out = out.get("result", ())
        for i, value in enumerate(tuple(out or ())):
            if is_list[i]:
                slots[i].extend(value)
            else:
                slots[i].append(value)
    ui = {k: [x for u in uis for x in u.get(k, [])] for k in dict.fromkeys(k for u in uis for k in u)}
    return tuple(slots), ui


def timing_table(result: RunResult) -> str:
    rows = [("node", "type", "on", "compute", "A->B fetch+mat", "B->A fetch+mat", "bytes moved")]
    for nid, p in sorted(result.timing_payloads().items(), key=lambda kv: _id_key(kv[0])):
        s = p["summary"]

        def hand(x):
            return "" if not x else f"{(x['fetch_s'] + x['materialize_s']) * 1e3:.1f} ms"

        moved = sum((s.get(k) or {}).get("bytes", 0) for k in ("a_to_b", "b_to_a"))
        rows.append((nid, p["node_type"], s.get("machine", ""), f"{s['compute_s']:.3f} s", hand(s.get("a_to_b")),
                     hand(s.get("b_to_a")), f"{moved / 2**20:.2f} MiB" if moved else ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ CLI
MODEL_PATH_NODES = {"H3LoadEncoders": "model_path", "H3RemoteDiT": "model_path"}


def apply_overrides(api: dict, model_path: str | None, sets: list[str], cluster: str | None = None,
                    decode_on: str | None = None) -> None:
    if model_path:
        for node in api.values():
            key = MODEL_PATH_NODES.get(node["class_type"])
            if key:
                node["inputs"][key] = str(model_path)
    if cluster:
        for node in api.values():
            if node["class_type"] == "H3RemoteDiT":
                node["inputs"]["cluster_address"] = cluster
    if decode_on:
        for node in api.values():
            if node["class_type"] == "H3Decode":
                node["inputs"]["decode_on"] = decode_on
    for item in sets:
        target, sep, raw = item.partition("=")
        nid, dot, name = target.partition(".")
        if not sep or not dot:
            raise WorkflowError(f"--set {item!r} must look like ID.input=VALUE (e.g. 4.steps=8).")
        if nid not in api:
            raise WorkflowError(f"--set {item!r}: there is no node {nid} (nodes: {', '.join(sorted(api, key=_id_key))}).")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        api[nid]["inputs"][name] = value


def _parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("workflow", nargs="?" if prog.endswith("demo") else None)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--tiny", action="store_true",
                     help="use the tiny random checkpoint on A and B (model_path 'tiny-random'; built on first use)")
    src.add_argument("--model-path", help="diffusers MiniMax-H3 folder for every model_path input")
    ap.add_argument("--set", action="append", default=[], metavar="ID.input=VALUE")
    ap.add_argument("--cluster", help="override H3RemoteDiT cluster_address ('local' or host:port)")
    ap.add_argument("--decode-on", choices=("auto", "A", "A+B"),
                    help="every H3Decode's decode_on: split the video decode with B (auto, A+B) or A alone")
    ap.add_argument("--output", default=os.environ.get("H3_OUTPUT_DIR", "output"), help="output folder")
    ap.add_argument("--input", action="append", default=[], help="folder LoadImage/LoadAudio read from")
    ap.add_argument("--events-out", help="write every UI event of the run as JSONL here")
    ap.add_argument("--json-out", help="write the per-node timing payloads as JSON here")
    return ap


def execute(workflow_path: str, *, tiny: bool = False, model_path: str | None = None, sets=(), cluster=None,
            output: str = "output", events_out: str | None = None, json_out: str | None = None,
            quiet: bool = False, inputs=(), decode_on: str | None = None) -> RunResult:
    api, ui = load_workflow(workflow_path)
    runner_nodes.INPUT_DIRS[:] = [pathlib.Path(p) for p in inputs] + [
        pathlib.Path(workflow_path).resolve().parent / "inputs", EXAMPLES / "inputs"]
    if tiny:
        model_path = TINY  # each machine resolves it to its own copy, built on first use
    apply_overrides(api, model_path, list(sets), cluster, decode_on)
    check_prompt(api)
    h = host()
    if not isinstance(h, LocalHost):
        set_host(h := LocalHost())
    h.set_output_dir(output)
    previous = signal.getsignal(signal.SIGINT) if _main_thread() else None
    if _main_thread():
        def on_sigint(signum, frame):
            if h.interrupt_flag.is_set():
                raise KeyboardInterrupt
            print("\n[comfy-h3] interrupt: cancelling the request on B (Ctrl-C again to abort)", file=sys.stderr)
            h.interrupt_flag.set()
        signal.signal(signal.SIGINT, on_sigint)
    try:
        result = asyncio.run(run_prompt(api, ui))
    finally:
        if _main_thread():
            signal.signal(signal.SIGINT, previous)
        h.interrupt_flag.clear()
    if events_out:
        with open(events_out, "w") as fh:
            for event, data in result.events:
                fh.write(json.dumps({"type": event, "data": data}, default=str) + "\n")
    if json_out:
        pathlib.Path(json_out).write_text(json.dumps(result.timing_payloads(), indent=1, default=str))
    if not quiet:
        print(timing_table(result))
        for v in result.videos():
            print(f"[comfy-h3] wrote {v}")
    return result


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _shutdown_embedded() -> None:
    if session.CLUSTER.embedded is not None:
        session.CLUSTER.embedded.shutdown()


def _execute_cli(args, workflow: str, *, tiny: bool, sets: list[str], cluster: str | None) -> int:
    """Run for a command line: bad input exits 2, a failed run 1, each with one line on stderr."""
    try:
        execute(workflow, tiny=tiny, model_path=args.model_path, sets=sets, cluster=cluster, output=args.output,
                events_out=args.events_out, json_out=args.json_out, inputs=args.input, decode_on=args.decode_on)
    except (WorkflowError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # H3Error, ClusterError, AttentionBackendError: their messages say what to do
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        _shutdown_embedded()
    return 0


def main_run(argv: list[str]) -> int:
    args = _parser("python -m comfy_h3_nodes run").parse_args(argv)
    return _execute_cli(args, args.workflow, tiny=args.tiny, sets=args.set, cluster=args.cluster)


DEMO_SETTINGS = ["3.width=128", "3.height=128", "3.num_frames=124", "5.steps=4"]


def main_demo(argv: list[str]) -> int:
    args = _parser("python -m comfy_h3_nodes demo").parse_args(argv)
    workflow = args.workflow or str(EXAMPLES / "h3_t2va.json")
    print(f"[comfy-h3] demo: {workflow} on the embedded two-node Ray cluster, tiny random checkpoint")
    return _execute_cli(args, workflow, tiny=not args.model_path, sets=DEMO_SETTINGS + args.set,
                        cluster=args.cluster or "local")
