"""Write scripts/core_nodes.json: what the h3_core_* templates need to know of ComfyUI's own nodes.

    python scripts/snapshot_core_nodes.py http://127.0.0.1:8188     # a running ComfyUI (0.33 or newer)

For each core node type the templates use (``CORE_TYPES``), from ComfyUI's ``GET /object_info``: its inputs in
order with their kind (a link type such as ``CLIP``, or a widget kind: ``INT``, ``FLOAT``, ``STRING``, ``BOOLEAN``,
``COMBO``, or a V3 kind such as ``COMFY_AUTOGROW_V3``) and whether a seed widget has ComfyUI's "control after
generate" slot, and its outputs. scripts/make_example_workflows.py builds the templates' slots from it; the
real-ComfyUI suite checks it against the live ComfyUI (test_core_model_node_snapshot_matches_comfyui).
"""

from __future__ import annotations

import json
import pathlib
import sys
import urllib.request

OUT = pathlib.Path(__file__).resolve().parent / "core_nodes.json"
CORE_TYPES = ("CLIPLoader", "VAELoader", "LoadImage", "MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo",
              "RandomNoise", "KSamplerSelect", "BasicScheduler", "BasicGuider", "SamplerCustomAdvanced", "VAEDecode",
              "VAEDecodeAudio", "CreateVideo", "SaveVideo")
WIDGET_KINDS = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


def kind(entry: list) -> str:
    """An input's kind as object_info gives it: a list of choices is a COMBO (ComfyUI's V1 form)."""
    return "COMBO" if isinstance(entry[0], list) else entry[0]


def describe(info: dict) -> dict:
    """One node type's slots: ``inputs`` (name, kind, section, seed control) in ComfyUI's order, ``outputs``."""
    inputs = []
    for section in ("required", "optional"):
        for name in (info.get("input_order") or {}).get(section, []):
            entry = info["input"][section][name]
            opts = entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {}
            item = {"name": name, "kind": kind(entry), "section": section,
                    "widget": kind(entry) in WIDGET_KINDS or kind(entry).startswith("COMFY_DYNAMICCOMBO"),
                    "control_after_generate": bool(opts.get("control_after_generate"))}
            if kind(entry) == "COMFY_AUTOGROW_V3":  # slots <prefix>0, 1, ... of one type, named <input>.<prefix><n>
                (slot,) = opts["template"]["input"]["required"].values()
                item.update(prefix=opts["template"]["prefix"], slot_type=slot[0])
            inputs.append(item)
    return {"inputs": inputs, "outputs": [{"name": n, "type": t} for n, t in zip(info["output_name"], info["output"])]}


def snapshot(object_info: dict) -> dict:
    missing = [t for t in CORE_TYPES if t not in object_info]
    if missing:
        raise SystemExit(f"this ComfyUI has no {', '.join(missing)}: it is older than 0.33 (ComfyUI's H3 nodes)")
    return {t: describe(object_info[t]) for t in CORE_TYPES}


def main(argv: list[str]) -> None:
    base = (argv[0] if argv else "http://127.0.0.1:8188").rstrip("/")
    with urllib.request.urlopen(f"{base}/object_info", timeout=60) as r:
        info = json.load(r)
    with urllib.request.urlopen(f"{base}/system_stats", timeout=60) as r:
        version = json.load(r)["system"].get("comfyui_version", "?")
    data = {"about": f"ComfyUI's own node slots the h3_core_* templates use, from {base}/object_info of ComfyUI "
                     f"{version} (scripts/snapshot_core_nodes.py)", "comfyui_version": version, "nodes": snapshot(info)}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main(sys.argv[1:])
