"""A tiny random FastH3 checkpoint: the tiny checkpoint (:mod:`.tiny`) in FastVideo's FastH3 layout.

Both transformer partitions gain a VSA gate in every main block, ``transformer_blocks.{i}.attn.to_gate_compress.weight``
(``[heads * head_dim, hidden]``, random and non-zero, so the compression branch counts), stored in the partition's
own safetensors next to its other weights, and a ``vsa`` block in its ``config.json`` with the release's settings
(:mod:`.fasth3`). Everything else (text encoder, VAEs, schedulers, index) is the tiny checkpoint's, byte for byte: A
encodes and decodes for it exactly as for ``tiny-random``.

    python -m comfy_h3_nodes.engine.model.tiny_fasth3 OUT_DIR [--seed N] [--release v1|v2]

The same seed gives byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..contract.configs import PARTITIONS
from .fasth3 import GATE_SUFFIX, RELEASES
from .tiny import build_tiny_checkpoint

WEIGHTS = "diffusion_pytorch_model.safetensors"
#: the gates' scale: large enough that the compression branch moves the output visibly
GATE_STD = 0.5


def add_gates(folder: Path, seed: int, release: str = "v1", offset: int = 0) -> None:
    """Turn one tiny transformer folder into a FastH3 one: gates into its weights, the ``vsa`` block into its
    config."""
    config = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / WEIGHTS))
    gen = torch.Generator().manual_seed(20_000 + 100 * seed + offset)
    inner = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    for i in range(int(config["num_layers"])):
        state[f"transformer_blocks.{i}{GATE_SUFFIX}"] = (
            torch.randn(inner, int(config["hidden_size"]), generator=gen) * GATE_STD).contiguous()
    save_file({k: state[k] for k in sorted(state)}, str(folder / WEIGHTS), metadata={"format": "pt"})
    settings = dict(RELEASES[release])
    settings["dense_layers"] = list(settings["dense_layers"])
    config["vsa"] = {"release": release, **settings}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_tiny_fasth3(out_dir, seed: int = 0, release: str = "v1") -> Path:
    """Write the tiny FastH3 checkpoint into ``out_dir`` (the tiny checkpoint's model only, then the gates)."""
    out = build_tiny_checkpoint(out_dir, seed=seed, formats=False)
    for offset, part in enumerate(PARTITIONS):
        add_gates(out / part, seed, release, offset)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m comfy_h3_nodes.engine.model.tiny_fasth3",
                                     description="Write a tiny random FastH3 (VSA) MiniMax-H3 checkpoint for tests.")
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--release", choices=sorted(RELEASES), default="v1")
    args = parser.parse_args(argv)
    print(build_tiny_fasth3(args.out_dir, args.seed, args.release))
    return 0


if __name__ == "__main__":
    sys.exit(main())
