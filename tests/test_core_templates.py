"""The h3_core_* templates: ComfyUI's own H3 graph (core's loaders, MiniMaxH3ImageToVideo or
MiniMaxH3ReferenceToVideo, SamplerCustomAdvanced, VAEDecode, VAEDecodeAudio, CreateVideo, SaveVideo) with the DiT on
machine B through H3RemoteModel in UNETLoader's place.

Checked here against the snapshot of ComfyUI's own node slots (scripts/core_nodes.json, from ComfyUI 0.33's
``/object_info``; the real-ComfyUI suite checks the snapshot against the live ComfyUI and runs each template to an
MP4 with tiny files) and H3RemoteModel's INPUT_TYPES: every link joins an output to an input of the same type, every
node has the widget values its type takes, the graph is the one ComfyUI's own templates have (no UNETLoader, the
sampler fed by the remote model), and the pack's headless runner refuses it in one sentence that says to open it in
ComfyUI.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from comfy_h3_nodes.nodes.core_model import H3RemoteModel
from comfy_h3_nodes.tools import runner

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = json.loads((ROOT / "scripts" / "core_nodes.json").read_text())["nodes"]
TEMPLATES = {w: ROOT / "example_workflows" / f"h3_core_{w}.json" for w in ("t2va", "i2va", "r2va")}
ENCODER = {"t2va": "MiniMaxH3ImageToVideo", "i2va": "MiniMaxH3ImageToVideo", "r2va": "MiniMaxH3ReferenceToVideo"}


def _outputs(node_type: str) -> list[str]:
    if node_type == "H3RemoteModel":
        return list(H3RemoteModel.RETURN_TYPES)
    return [o["type"] for o in CORE[node_type]["outputs"]]


def _widgets(node_type: str) -> int:
    """How many widget values a node of this type saves (a seed's "control after generate" and LoadImage's upload
    button take one more each)."""
    if node_type == "H3RemoteModel":
        return len(runner.widget_names(H3RemoteModel))
    inputs = CORE[node_type]["inputs"]
    return (sum(1 for i in inputs if i["widget"]) + sum(1 for i in inputs if i["control_after_generate"])
            + (node_type == "LoadImage"))


@pytest.mark.parametrize("workflow", TEMPLATES)
def test_core_template_links_and_widgets_match_comfyuis_nodes(workflow):
    wf = json.loads(TEMPLATES[workflow].read_text())
    nodes = {n["id"]: n for n in wf["nodes"]}
    for lid, src, slot, dst, dst_slot, typ in wf["links"]:
        assert _outputs(nodes[src]["type"])[slot] == typ, (lid, nodes[src]["type"], slot, typ)
        target = nodes[dst]["inputs"][dst_slot]
        assert target["link"] == lid and target["type"] == typ, (lid, target)
        if nodes[dst]["type"] in CORE:
            specs = {i["name"]: i for i in CORE[nodes[dst]["type"]]["inputs"]}
            name, _, slot_name = target["name"].partition(".")
            spec = specs[name]
            assert (spec["slot_type"] if slot_name else spec["kind"]) == typ, (nodes[dst]["type"], target)
            if slot_name:
                assert slot_name.startswith(spec["prefix"]), target
    for node in wf["nodes"]:
        if node["type"] == "MarkdownNote":
            continue
        assert node["type"] in CORE or node["type"] == "H3RemoteModel", node["type"]
        assert len(node.get("widgets_values") or []) == _widgets(node["type"]), (node["type"], node["widgets_values"])
        cnr = "comfy-h3" if node["type"] == "H3RemoteModel" else "comfy-core"
        assert node["properties"]["cnr_id"] == cnr, node
        linked = {i["name"] for i in node["inputs"] if i["link"] is not None}
        if node["type"] in CORE:  # every link input ComfyUI requires is wired
            required = {i["name"] for i in CORE[node["type"]]["inputs"]
                        if i["section"] == "required" and not i["widget"]}
            assert required <= linked, (node["type"], required - linked)


@pytest.mark.parametrize("workflow", TEMPLATES)
def test_core_template_is_comfyuis_h3_graph_with_the_dit_on_b(workflow):
    wf = json.loads(TEMPLATES[workflow].read_text())
    nodes = {n["id"]: n for n in wf["nodes"]}
    by_type: dict[str, list[dict]] = {}
    for n in wf["nodes"]:
        by_type.setdefault(n["type"], []).append(n)
    assert "UNETLoader" not in by_type
    (remote,) = by_type["H3RemoteModel"]
    dit = remote["widgets_values"][0]
    assert dit.endswith(".safetensors") and ("ref2va" in dit) == (workflow == "r2va"), dit
    sources = {(nodes[dst]["type"], nodes[dst]["inputs"][ds]["name"]): nodes[src]["type"]
               for _, src, _, dst, ds, _ in wf["links"]}
    assert sources[("BasicGuider", "model")] == sources[("BasicScheduler", "model")] == "H3RemoteModel"
    assert sources[("SamplerCustomAdvanced", "latent_image")] == ENCODER[workflow]
    assert sources[("VAEDecode", "samples")] == sources[("VAEDecodeAudio", "samples")] == "SamplerCustomAdvanced"
    assert sources[("SaveVideo", "video")] == "CreateVideo"
    (enc,) = by_type[ENCODER[workflow]]
    image_input = {"t2va": None, "i2va": "first_frame", "r2va": "ref_images.ref_image_0"}[workflow]
    fed = {i["name"] for i in enc["inputs"] if i["link"] is not None}
    assert (image_input in fed) if image_input else not (fed - {"clip", "vae"}), fed
    if image_input:
        (load,) = by_type["LoadImage"]
        assert (ROOT / "example_workflows" / "inputs" / load["widgets_values"][0]).is_file(), load
    (clip,) = by_type["CLIPLoader"]
    assert clip["widgets_values"][1] == "minimax", clip


def test_the_headless_runner_refuses_a_core_template_in_one_sentence():
    with pytest.raises(runner.WorkflowError, match=r"node types this runner does not have: .*CLIPLoader.*"
                                                   r"Open it in ComfyUI instead"):
        runner.load_workflow(TEMPLATES["t2va"])
