"""The engine never imports the B side (house.md: Engine -> Worker must not exist); placement composes them."""

from __future__ import annotations

import ast
import pathlib

ENGINE = pathlib.Path(__file__).resolve().parents[1] / "comfy_h3_nodes" / "engine"


def _imports(path: pathlib.Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.append(node.module or "")
                continue
            pkg = list(path.relative_to(ENGINE.parents[1]).with_suffix("").parts)[:-node.level]
            base = ".".join(pkg + ([node.module] if node.module else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def test_engine_never_imports_remote_worker():
    offenders = {str(p.relative_to(ENGINE.parent)): m for p in sorted(ENGINE.rglob("*.py"))
                 for m in _imports(p) if m == "remote_worker" or m.startswith("remote_worker.")}
    assert not offenders, f"engine modules import the B side: {offenders}"


def test_engine_never_imports_placement_or_nodes():
    bad = ("comfy_h3_nodes.placement", "comfy_h3_nodes.nodes.all", "comfy_h3_nodes.host.adapter")
    offenders = {str(p.relative_to(ENGINE.parent)): m for p in sorted(ENGINE.rglob("*.py"))
                 for m in _imports(p) if m in bad}
    assert not offenders, offenders


def test_placement_hands_the_executor_its_classes():
    from comfy_h3_nodes import placement
    from comfy_h3_nodes.engine.executor import executor as ex
    from remote_worker.actor import dit_actor_class

    assert placement.ACTORS.dit is dit_actor_class
    assert ex._DEFAULT_ACTORS is placement.ACTORS
