"""``python -m comfy_h3_nodes VERB ...``: the pack's command line, one module per verb, each loaded only when run (so
``cluster start-head`` sets Ray's token auth before anything imports Ray).

Verbs: ``run WORKFLOW.json`` (headless runner), ``demo`` (the t2va example on the embedded cluster, tiny model),
``cluster start-head`` (machine A's Ray head with token auth), ``bench`` (hand-off and pipeline benchmarks).
"""

from __future__ import annotations

import importlib
import sys

VERBS = {
    "run": ("comfy_h3_nodes.tools.runner", "main_run"),
    "demo": ("comfy_h3_nodes.tools.runner", "main_demo"),
    "cluster": ("comfy_h3_nodes.cluster.cli", "main"),
    "bench": ("comfy_h3_nodes.tools.bench", "main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"unknown verb {verb!r}; expected one of {', '.join(VERBS)}", file=sys.stderr)
        return 2
    module, func = VERBS[verb]
    return int(getattr(importlib.import_module(module), func)(rest) or 0)
