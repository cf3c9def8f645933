"""Every template opens with all its nodes on the first screen.

ComfyUI applies a workflow's saved view, ``extra.ds = {"scale", "offset"}``, when it opens the file: LiteGraph draws
canvas point ``p`` at screen point ``(p + offset) * scale``. Each node's box (``pos``/``size`` plus the title bar drawn
above ``pos``) must land inside a 1280 x 720 canvas (a laptop's ComfyUI window without its side and top bars), with
a free border. scripts/make_example_workflows.py computes the view; this checks the shipped files.
"""

from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "example_workflows").glob("*.json"))
CANVAS_W, CANVAS_H = 1280, 720
TITLE_H = 30   # LiteGraph's title bar, drawn above a node's pos
MARGIN = 30    # screen pixels free on every side (the generator keeps 40)


def test_there_are_templates():
    assert len(WORKFLOWS) >= 4


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_saved_view_shows_every_node(path):
    wf = json.loads(path.read_text())
    ds = wf["extra"]["ds"]
    scale, (ox, oy) = ds["scale"], ds["offset"]
    assert 0.3 <= scale <= 1.0, f"{path.name}: scale {scale}"
    outside = []
    for node in wf["nodes"]:
        (x, y), (w, h) = node["pos"], node["size"]
        left, top = (x + ox) * scale, (y - TITLE_H + oy) * scale
        right, bottom = (x + w + ox) * scale, (y + h + oy) * scale
        if not (left >= MARGIN and top >= MARGIN and right <= CANVAS_W - MARGIN and bottom <= CANVAS_H - MARGIN):
            outside.append(f"node {node['id']} ({node['type']}) at screen "
                           f"[{left:.0f}, {top:.0f}, {right:.0f}, {bottom:.0f}]")
    assert not outside, (f"{path.name}: with ds {ds} these nodes are not inside the {CANVAS_W}x{CANVAS_H} first "
                         f"screen with a {MARGIN} px border: " + "; ".join(outside))
