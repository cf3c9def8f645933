"""The web extension knows every node of the pack, from one table (``H3_NODES`` in web/h3_view.js): a node added to
NODE_CLASS_MAPPINGS without a readout entry fails here instead of showing nothing in the graph."""

from __future__ import annotations

import pathlib
import re

from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS

VIEW = pathlib.Path(__file__).resolve().parents[1] / "web" / "h3_view.js"


def _h3_nodes_table() -> dict[str, tuple[str, str]]:
    text = VIEW.read_text()
    body = text[text.index("export const H3_NODES = Object.freeze({"):]
    body = body[: body.index("});")]
    return {m.group(1): (m.group(2), m.group(3))
            for m in re.finditer(r'^\s+(H3\w+): \{ verb: "(\w+)", machine: "([AB])" \}', body, re.M)}


def test_the_web_table_lists_exactly_the_python_nodes():
    table = _h3_nodes_table()
    assert set(table) == set(NODE_CLASS_MAPPINGS), (sorted(set(NODE_CLASS_MAPPINGS) ^ set(table)))


def test_every_node_reports_a_timing_record_the_table_can_name():
    """Each node's report names its compute stage; the web table gives it a word and a machine."""
    table = _h3_nodes_table()
    for name, cls in NODE_CLASS_MAPPINGS.items():
        assert "unique_id" in (cls.INPUT_TYPES().get("hidden") or {}), f"{name} cannot report: no UNIQUE_ID"
        assert table[name][0], name
