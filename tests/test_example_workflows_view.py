"""Every template opens readable, with all its nodes on the first screen, none over another.

ComfyUI applies a workflow's saved view, ``extra.ds = {"scale", "offset"}``, when it opens the file: LiteGraph draws
canvas point ``p`` at screen point ``(p + offset) * scale``. The zoom must be at least 0.6 (LiteGraph draws nodes as
empty grey boxes below it); each node's box (``pos``/``size`` plus the title bar drawn above ``pos``) must land inside
a 1280 x 720 window, clear of the frontend's tab bar and menus (top), sidebar (left) and minimap (bottom-right
corner); each node is saved at least as big as the real frontend draws it (scripts/node_sizes.json, measured by
tests/web/measure_node_sizes.py in both frontends and both UI modes), so no two nodes overlap when opened.
scripts/make_example_workflows.py computes the layout; this checks the shipped files. tests/test_web_frontend.py
checks the same in the real frontend, and with every readout filled.
"""

from __future__ import annotations

import json
import re
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "example_workflows").glob("*.json"))
SIZES = json.loads((ROOT / "scripts" / "node_sizes.json").read_text())["largest"]
CANVAS_W, CANVAS_H = 1280, 720
FREE_LEFT, FREE_TOP, MINIMAP = 60, 80, (1020, 460)  # what the frontends draw over the canvas (measured)
TITLE_H = 30   # LiteGraph's title bar, drawn above a node's pos
MARGIN = 8     # screen pixels free on every side (the generator keeps 16)
MIN_ZOOM = 0.6
#: nodes that grow after a run: the denoise and ComfyUI's sampler (their previews), the save nodes (the video)
GROWERS = ("H3RemoteDenoise", "H3SaveVideo", "SamplerCustomAdvanced", "SaveVideo")


def test_there_are_templates():
    assert len(WORKFLOWS) >= 5


def _screen_boxes(wf: dict) -> list[tuple[dict, tuple[float, float, float, float]]]:
    ds = wf["extra"]["ds"]
    scale, (ox, oy) = ds["scale"], ds["offset"]
    out = []
    for node in wf["nodes"]:
        (x, y), (w, h) = node["pos"], node["size"]
        out.append((node, ((x + ox) * scale, (y - TITLE_H + oy) * scale, (x + w + ox) * scale, (y + h + oy) * scale)))
    return out


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_saved_view_opens_readable_with_every_node_on_the_first_screen(path):
    wf = json.loads(path.read_text())
    scale = wf["extra"]["ds"]["scale"]
    assert MIN_ZOOM <= scale <= 1.0, f"{path.name}: opens at zoom {scale}: LiteGraph draws no titles below {MIN_ZOOM}"
    bad = []
    for node, (left, top, right, bottom) in _screen_boxes(wf):
        inside = (left >= FREE_LEFT + MARGIN and top >= FREE_TOP + MARGIN and right <= CANVAS_W - MARGIN
                  and bottom <= CANVAS_H - MARGIN)
        under_minimap = right > MINIMAP[0] - MARGIN and bottom > MINIMAP[1] - MARGIN
        if not inside or under_minimap:
            bad.append(f"node {node['id']} ({node['type']}) at screen [{left:.0f}, {top:.0f}, {right:.0f}, {bottom:.0f}]")
    assert not bad, f"{path.name}: with ds {wf['extra']['ds']} these nodes are not clear on the first screen: " + "; ".join(bad)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_nodes_are_saved_at_their_drawn_size_and_do_not_overlap(path):
    wf = json.loads(path.read_text())
    for node in wf["nodes"]:
        w, h = SIZES[node["type"]]
        assert node["size"][0] >= w - 0.5 and node["size"][1] + TITLE_H >= h - 0.5, (
            f"{path.name}: node {node['id']} ({node['type']}) is saved at {node['size']}, the frontend draws it in "
            f"{w} x {h} (title included): run scripts/make_example_workflows.py")
    boxes = [(n, (n["pos"][0], n["pos"][1] - TITLE_H, n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1]))
             for n in wf["nodes"]]
    for i, (a, (l1, t1, r1, b1)) in enumerate(boxes):
        for b, (l2, t2, r2, b2) in boxes[i + 1:]:
            assert min(r1, r2) <= max(l1, l2) or min(b1, b2) <= max(t1, t2), (
                f"{path.name}: {a['type']} {a['id']} overlaps {b['type']} {b['id']}")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_nothing_is_below_the_nodes_that_grow_after_a_run(path):
    """The denoise and ComfyUI's sampler show a preview, the save nodes the video after a run: no node below them."""
    wf = json.loads(path.read_text())
    for grower in (n for n in wf["nodes"] if n["type"] in GROWERS):
        x0, x1, y = grower["pos"][0], grower["pos"][0] + grower["size"][0], grower["pos"][1]
        below = [n for n in wf["nodes"] if n is not grower and n["pos"][1] > y
                 and min(x1, n["pos"][0] + n["size"][0]) > max(x0, n["pos"][0])]
        assert not below, f"{path.name}: {[n['type'] for n in below]} below {grower['type']}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_each_template_says_on_the_canvas_what_to_set_before_the_first_run(path):
    """The first-run hint is a note on the first screen (the view test above), not behind an error's details: it
    names the model path the template holds, every node that has a path to set, and the tiny choice that needs no
    weights."""
    wf = json.loads(path.read_text())
    notes = [n for n in wf["nodes"] if n["type"] == "MarkdownNote"]
    assert len(notes) == 1, f"{path.name}: {len(notes)} notes"
    text = notes[0]["widgets_values"][0]
    # in bold, not backticks: frontend 1.49.6's Vue nodes draw `code` blue on the note's brown (contrast 1.8)
    assert "`" not in text, text
    remote = [n for n in wf["nodes"] if n["type"] == "H3RemoteModel"]
    if remote:  # ComfyUI's own graph (h3_core_*): A's files on its loaders, B's transformer on H3RemoteModel
        (model,) = remote
        assert f"**{model['widgets_values'][0]}**" in text, text
        for kind in ("CLIPLoader", "VAELoader", "H3RemoteModel"):
            assert f"**{kind}**" in text, f"{path.name}: the note does not name {kind}"
        return
    encoders = next(n for n in wf["nodes"] if n["type"] == "H3LoadEncoders")
    model = encoders["widgets_values"][0]
    tiny = "tiny-random-fasth3" if "FastH3" in model else "tiny-random"
    assert f"**{model}**" in text and f"**{tiny}**" in text, text
    for node in wf["nodes"]:
        if node["type"] in ("H3LoadEncoders", "H3RemoteDiT", "H3LoRA"):
            assert f"**{node['type']}**" in text, f"{path.name}: the note does not name {node['type']}"


def _readme_headings() -> set[str]:
    text = (ROOT / "README.md").read_text()
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} +(.+?)\s*$", text, re.M)}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_the_note_names_only_real_inputs_and_readme_sections(path):
    """Every name in bold in the note (a word such as **cluster_address**, not a path or a value) is a node type or an
    input of a node in the template or of the pack, or a value one of its widgets holds or offers; every README section it
    points to ("the README's *...*") is a heading of README.md."""
    from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS
    from comfy_h3_nodes.tools.runner import input_specs

    wf = json.loads(path.read_text())
    (note,) = [n for n in wf["nodes"] if n["type"] == "MarkdownNote"]
    text = note["widgets_values"][0]
    names, values = set(NODE_CLASS_MAPPINGS), set()
    for cls in NODE_CLASS_MAPPINGS.values():
        for iname, (ityp, _opts, _section) in input_specs(cls).items():
            names.add(iname)
            if isinstance(ityp, (list, tuple)):
                values.update(str(v) for v in ityp)
    for node in wf["nodes"]:
        names.add(node["type"])
        names.update(i["name"] for i in node.get("inputs", []))
        if node["type"] != "MarkdownNote":
            values.update(str(v) for v in node.get("widgets_values", []))
    words = [w for w in re.findall(r"\*\*([^*]+)\*\*", text) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", w)]
    assert words, text
    unknown = [w for w in words if w not in names and w not in values]
    assert not unknown, f"{path.name}: the note names {unknown}, which no node of the template or the pack has"
    sections = re.findall(r"README's \*([^*]+)\*", text)
    assert sections, text  # the note points to where B's setup is described
    headings = _readme_headings()
    missing = [s for s in sections if s not in headings]
    assert not missing, f"{path.name}: README has no section {missing}; its headings: {sorted(headings)}"
