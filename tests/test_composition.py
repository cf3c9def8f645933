"""The composition of the pack, read from its source (house.md): which part may import which, no cycles, imports
where a reader sees them, files of a readable size.

The import graph is built from the AST of every production module (``comfy_h3_nodes``, ``remote_worker``, the
root ``__init__``), function-local imports included. "The edge" is what ComfyUI imports when it loads the pack:
every module reachable from the root ``__init__`` through module-level imports. Only there may a module import
lazily (ComfyUI must load the pack without Ray, diffusers or a GPU), and every function-local import anywhere says
why next to it.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("comfy_h3_nodes", "remote_worker")
COMFY = ("comfy", "server", "folder_paths", "nodes", "execution", "comfy_extras", "comfy_api")
MAX_LAZY_OUTSIDE_EDGE = 40
MAX_LAZY = 120
MAX_LINES = 600
MAX_EXECUTOR_LINES = 400


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__root__"


def _modules() -> dict[str, pathlib.Path]:
    mods = {"__root__": ROOT / "__init__.py"}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            mods[_module_name(p)] = p
    return mods


MODULES = _modules()


class _Import:
    def __init__(self, target: str, lineno: int, local: bool, line: str, above: str):
        self.target, self.lineno, self.local, self.line, self.above = target, lineno, local, line, above

    @property
    def has_reason(self) -> bool:
        return "#" in self.line or self.above.strip().startswith("#")


def _resolve(mod: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    if mod == "__root__":
        base = []
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str) -> list[_Import]:
    path = MODULES[mod]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    local_nodes = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local_nodes.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = _resolve(mod, path, node)
            for a in node.names:  # `from pkg import module` imports the module; `from m import name` imports m
                sub = f"{base}.{a.name}" if base else a.name
                targets.append(sub if sub in MODULES else base)
        line = lines[node.lineno - 1]
        above = lines[node.lineno - 2] if node.lineno > 1 else ""
        if '"""' in above or "'''" in above:
            above = ""
        out += [_Import(t, node.lineno, id(node) in local_nodes, line, above) for t in targets]
    return out


IMPORTS = {m: _imports(m) for m in MODULES}


def _internal(target: str) -> str | None:
    """The pack's own module a target names (itself, or the nearest enclosing module of ours)."""
    parts = target.split(".")
    while parts:
        name = ".".join(parts)
        if name in MODULES:
            return name
        parts.pop()
    return None


def _graph(include_local: bool = True) -> dict[str, set[str]]:
    g = defaultdict(set)
    for mod, imps in IMPORTS.items():
        for imp in imps:
            if imp.local and not include_local:
                continue
            t = _internal(imp.target) if imp.target.split(".")[0] in PACKAGES else None
            if t and t != mod and not mod.startswith(t + "."):  # a package's own __init__ is not an edge back
                g[mod].add(t)
    return g


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by a DFS from each node (enough to report one per strongly connected set)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def _edge() -> set[str]:
    """What ComfyUI imports at load: reachable from the root __init__ through module-level imports."""
    g = _graph(include_local=False)
    seen, todo = set(), ["__root__"]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(g.get(m, ()))
        parts = m.split(".")  # importing a module imports its packages first
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES)
    return seen


EDGE = _edge()


def _package(mod: str) -> str:
    path = MODULES[mod]
    return mod if path.name == "__init__.py" else mod.rpartition(".")[0]


def test_no_import_cycle_between_modules():
    cycles = _cycles(_graph(include_local=True))
    assert not cycles, f"import cycles (function-local imports counted): {cycles}"


def test_no_import_cycle_between_packages():
    g = defaultdict(set)
    for mod, targets in _graph(include_local=True).items():
        for t in targets:
            a, b = _package(mod), _package(t)
            if a != b and not a.startswith(b + ".") and not b.startswith(a + "."):
                g[a].add(b)
    cycles = _cycles(g)
    assert not cycles, f"package cycles: {cycles}"


@pytest.mark.parametrize("forbidden", ["comfy_h3_nodes.nodes", "comfy_h3_nodes.host", "comfy_h3_nodes.tools",
                                       "comfy_h3_nodes.placement", "remote_worker", *COMFY])
def test_engine_never_imports_the_ui_the_tools_or_the_b_side(forbidden):
    offenders = {f"{m}:{i.lineno}": i.target for m, imps in IMPORTS.items() if m.startswith("comfy_h3_nodes.engine")
                 for i in imps if i.target == forbidden or i.target.startswith(forbidden + ".")}
    assert not offenders, f"engine modules import {forbidden}: {offenders}"


def test_b_side_never_imports_nodes_host_or_comfyui():
    bad = ("comfy_h3_nodes.nodes", "comfy_h3_nodes.host", *COMFY)
    offenders = {f"{m}:{i.lineno}": i.target for m, imps in IMPORTS.items() if m.startswith("remote_worker")
                 for i in imps if any(i.target == b or i.target.startswith(b + ".") for b in bad)}
    assert not offenders, offenders


def test_only_the_host_imports_comfyui():
    offenders = {f"{m}:{i.lineno}": i.target for m, imps in IMPORTS.items() if not m.startswith("comfy_h3_nodes.host")
                 for i in imps if i.target.split(".")[0] in COMFY and i.target.split(".")[0] not in PACKAGES}
    assert not offenders, offenders


def test_lazy_imports_are_few_at_the_edge_and_each_says_why():
    lazy = [(m, i) for m, imps in IMPORTS.items() for i in imps if i.local]
    statements = {(m, i.lineno) for m, i in lazy}
    outside = {(m, i.lineno) for m, i in lazy if m not in EDGE}
    unexplained = sorted(f"{m}:{i.lineno}: {i.line.strip()}" for m, i in lazy if not i.has_reason)
    assert not unexplained, "function-local imports without their reason next to them:\n" + "\n".join(unexplained)
    assert len(outside) <= MAX_LAZY_OUTSIDE_EDGE, sorted(outside)
    assert len(statements) <= MAX_LAZY, len(statements)


def test_the_edge_loads_without_ray_torch_or_diffusers():
    heavy = ("ray", "torch", "diffusers", "transformers", "safetensors", "av")
    offenders = {f"{m}:{i.lineno}": i.target for m in EDGE for i in IMPORTS[m]
                 if not i.local and i.target.split(".")[0] in heavy}
    assert not offenders, f"modules ComfyUI imports at load import heavy packages at their top: {offenders}"


def test_files_stay_readable():
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"production files over {MAX_LINES} lines: {big}"
    executor = {m: n for m, p in MODULES.items() if m.startswith("comfy_h3_nodes.engine.executor")
                and (n := len(p.read_text().splitlines())) > MAX_EXECUTOR_LINES}
    assert not executor, f"executor files over {MAX_EXECUTOR_LINES} lines: {executor}"


@pytest.mark.parametrize("name", ["holder_of", "a_mode", "synthetic_stages", "synthetic_delay", "H3_SYNTHETIC_STAGES"])
def test_retired_mechanisms_are_gone(name):
    found = [m for m, p in MODULES.items() if re.search(rf"\b{name}\b", p.read_text())]
    assert not found, f"{name} is still in {found}"


def test_the_graph_sees_what_it_must():
    """The checks above would pass on an empty graph: these edges exist, so the walker is reading the code."""
    g = _graph()
    assert "comfy_h3_nodes.engine.executor.handoff" in g["remote_worker.actor"]
    assert "comfy_h3_nodes.nodes" in g["__root__"] and "comfy_h3_nodes.nodes" in EDGE
    assert "comfy_h3_nodes.engine.executor.executor" not in EDGE  # Ray loads when a node runs
    assert any(i.local for i in IMPORTS["comfy_h3_nodes.nodes.loaders"])


def test_placement_hands_the_executor_its_classes():
    from comfy_h3_nodes import placement
    from comfy_h3_nodes.engine.executor import executor as ex
    from remote_worker.actor import start_dit

    assert placement.ACTORS.dit is start_dit
    assert ex._DEFAULT_ACTORS is placement.ACTORS
