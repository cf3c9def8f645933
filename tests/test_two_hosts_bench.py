"""``bench two-hosts --quick --json`` on the harness's hosts: one whole request on ``h3a`` alone against the pair
(A's head and B's setup by the docs' commands, parallel A+B, split decode), tiny model and canvas. Checks the last
line's keys (the issue's contract) and that each value is a number in a sane range; no timed assertion (the goals
live in the bench's figures). Part of ``make test-two-hosts`` (root)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from two_hosts_support import REPO, hosts  # noqa: F401

KEYS = ["shape", "one_host_s", "pair_s", "ratio", "denoise_ratio", "decode_ratio", "qsfp_share_of_bytes",
        "handoff_vs_wire"]


def test_two_hosts_bench_quick_json_line(hosts):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "comfy_h3_nodes", "bench", "two-hosts", "--quick", "--json",
                          "--timeout", "240"], capture_output=True, text=True, timeout=300, cwd=str(REPO), env=env)
    print(out.stdout[-3000:])
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert list(last) == KEYS, last
    assert last["shape"]["model"] == "tiny" and last["shape"]["transformer_params"] > 0, last["shape"]
    for key in KEYS[1:]:
        assert isinstance(last[key], (int, float)) and math.isfinite(last[key]), (key, last[key])
    assert 0 < last["one_host_s"] < 240 and 0 < last["pair_s"] < 240, last
    assert last["ratio"] == round(last["pair_s"] / last["one_host_s"], 4), last
    assert 0.05 < last["ratio"] < 20, last
    for key in ("denoise_ratio", "decode_ratio"):  # tiny stages: the group's collectives can outweigh the forward
        assert 0.01 < last[key] < 100, (key, last)
    # both hosts' links carried the pair's request, almost all of it on the QSFP link (what the harness's own tests
    # assert for a prompt: the hand-offs, B's events and the ranks' collectives go over it)
    assert 0.5 < last["qsfp_share_of_bytes"] <= 1.0, last
    assert last["handoff_vs_wire"] > 0, last
    assert "one host (h3a alone, one CPU)" in out.stdout and "'world': 2" in out.stdout, out.stdout[-3000:]
