"""LoRA adapters on B's resident transformer, through diffusers' own ``MiniMaxH3LoraLoaderMixin``.

An adapter file is loaded once per partition (``load_lora_weights``) and kept; a request names the adapters it wants
with a weight each, and B activates exactly those (``set_adapters``) or none (``disable_lora``) before denoising. The
base transformer is never reloaded. Before loading, every LoRA tensor is checked against the transformer's modules and
shapes: diffusers (peft) only warns and drops keys that do not fit, which would silently give a different model.

An adapter may ship a sidecar ``<file stem>.json`` next to it with the schedule it was trained for, e.g.
``{"steps": 4, "shift": 5.0, "audio_shift": 3.0}``; B applies its shifts to the request's schedulers.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import time
from dataclasses import dataclass

import torch
from safetensors import safe_open

from comfy_h3_nodes.engine.contract.errors import ModelFolderError
from comfy_h3_nodes.engine.model import catalog

#: Tensor-name fragments of other runtimes' checkpoints, and the runtime they belong to.
FOREIGN_PATTERNS = (
    ("gate_compress", "FastVideo's video sparse attention (VSA) gates"),
    ("block_sparse", "a block-sparse attention runtime"),
    ("sparse_gate", "a block-sparse attention runtime"),
    ("weight_scale", "a quantized (FP8/INT8) runtime's scales"),
    ("input_scale", "a quantized (FP8/INT8) runtime's scales"),
    ("_orig_mod.", "a torch.compile()-wrapped state dict"),
    ("lora_", "a LoRA adapter (load it with H3LoRA, not as a checkpoint)"),
)


class AdapterError(ValueError):
    """An adapter (or checkpoint) whose tensors do not fit B's transformer; the message lists them."""


def runtime_of(names: list[str]) -> str:
    hits = sorted({label for n in names for pat, label in FOREIGN_PATTERNS if pat in n})
    return "; ".join(hits) if hits else "another runtime or model (no diffusers MiniMax-H3 module has these names)"


def describe_keys(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(frozen=True)
class AdapterSchedule:
    steps: int | None = None
    shift: float | None = None
    audio_shift: float | None = None


def read_sidecar(path: pathlib.Path) -> AdapterSchedule:
    side = path.with_suffix(".json")
    if not side.is_file():
        return AdapterSchedule()
    try:
        data = json.loads(side.read_text())
    except json.JSONDecodeError as exc:
        raise AdapterError(f"adapter config {side} is not valid JSON: {exc}") from exc
    out = {}
    for key, kind in (("steps", int), ("shift", float), ("audio_shift", float)):
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise AdapterError(f"adapter config {side}: {key} is {value!r}; it must be a positive number.")
            out[key] = kind(value)
    return AdapterSchedule(**out)


def check_lora_fits(state_dict: dict, transformer, prefix: str = "transformer.") -> None:
    """Every LoRA tensor must name a Linear of the transformer with matching in/out features."""
    modules = dict(transformer.named_modules())
    unknown, wrong = [], []
    for key, tensor in state_dict.items():
        name = key.removeprefix(prefix).removeprefix("transformer_ref.")
        for part in (".lora_A.weight", ".lora_B.weight", ".lora_A.bias", ".lora_B.bias", ".alpha"):
            if name.endswith(part):
                mod_name = name[: -len(part)]
                break
        else:
            unknown.append(key)
            continue
        mod = modules.get(mod_name)
        mod = getattr(mod, "base_layer", mod)  # once an adapter is loaded, peft wraps the Linear
        if not isinstance(mod, torch.nn.Linear):
            unknown.append(key)
            continue
        if part == ".lora_A.weight" and tensor.shape[-1] != mod.in_features:
            wrong.append(f"{key} {tuple(tensor.shape)} (module takes {mod.in_features} inputs)")
        if part == ".lora_B.weight" and tensor.shape[0] != mod.out_features:
            wrong.append(f"{key} {tuple(tensor.shape)} (module gives {mod.out_features} outputs)")
    adaln = [k for k in unknown if any(m in k for m in ("adaln_proj", "norm_out.linear", "time_embedder"))]
    if adaln and getattr(transformer, "_h3_pruned", False):
        raise AdapterError(
            f"the adapter adapts the full-width AdaLN ({describe_keys(adaln, 2)}), which this pruned transformer "
            "replaces by a small time-curve basis: use it with an unpruned file (Comfy-Org's minimax_h3_*_bf16 or "
            "*_int8_convrot, or the diffusers folder), or a LoRA that leaves AdaLN alone. Nothing was loaded."
        )
    if unknown:
        raise AdapterError(
            f"the adapter has {len(unknown)} tensors that fit no module of B's MiniMax-H3 transformer: "
            f"{describe_keys(unknown)}; they belong to {runtime_of(unknown)}. Nothing was loaded."
        )
    if wrong:
        raise AdapterError(
            f"the adapter's tensors do not match the transformer's shapes (trained for another or a pruned "
            f"checkpoint?): {describe_keys(wrong, 4)}. Nothing was loaded."
        )


class AdapterManager:
    """Loaded adapters of one partition and which are active."""

    def __init__(self, host, partition: str, path_check=None):
        self.host = host
        self.partition = partition
        self.path_check = path_check
        self.loaded: dict[str, str] = {}            # resolved path -> adapter name
        self.schedules: dict[str, AdapterSchedule] = {}
        self.active: tuple = ()

    def _name(self, path: str) -> str:
        return f"h3_{len(self.loaded)}_{pathlib.Path(path).stem}"[:64]

    def _file(self, path: str) -> pathlib.Path:
        p = pathlib.Path(os.path.expanduser(path))
        if self.path_check is not None:
            p = pathlib.Path(self.path_check(p))
        if not p.is_file():
            raise AdapterError(f"adapter file {p} does not exist on machine B; give a LoRA file B has (the "
                               f"tiny-random model's own 4-step LoRA is '{catalog.TINY}').")
        return p

    def _read(self, p: pathlib.Path) -> dict:
        try:
            state_dict = self.host.lora_state_dict(str(p.resolve()))
        except Exception as exc:  # noqa: BLE001 - re-raised with the file named
            raise AdapterError(f"adapter file {p} could not be read as a LoRA: {exc}") from exc
        if not state_dict:
            raise AdapterError(f"adapter file {p} holds no tensors.")
        check_lora_fits(state_dict, getattr(self.host, self.partition))
        return state_dict

    def check(self, path: str) -> str:
        """What :meth:`ensure_loaded` would refuse, without touching the transformer (a node checks its LoRA up
        front while B denoises); returns the resolved path."""
        p = self._file(path)
        if str(p.resolve()) not in self.loaded:
            self._read(p)
        return str(p.resolve())

    def ensure_loaded(self, path: str) -> tuple[str, float]:
        """The adapter name of ``path`` (loading it once); returns ``(name, load_seconds)``."""
        p = self._file(path)
        key = str(p.resolve())
        if key in self.loaded:
            return self.loaded[key], 0.0
        t0 = time.perf_counter()
        state_dict = self._read(p)
        schedule = read_sidecar(p)
        name = self._name(key)
        self.host.load_lora_weights(state_dict, adapter_name=name)
        self.loaded[key] = name
        self.schedules[name] = schedule
        return name, time.perf_counter() - t0

    def activate(self, adapters: tuple) -> tuple[float, AdapterSchedule]:
        """Make exactly ``adapters`` (``(path, weight)`` pairs) active; returns seconds spent and their schedule."""
        t0 = time.perf_counter()
        names, weights = [], []
        for path, weight in adapters:
            name, _ = self.ensure_loaded(path)
            names.append(name)
            weights.append(float(weight))
        schedule = self.merged_schedule(names)
        key = tuple(zip(names, weights))
        if key != self.active:
            if names:
                self.host.enable_lora()
                self.host.set_adapters(names, weights)
            elif self.loaded:
                self.host.disable_lora()
            self.active = key
        return time.perf_counter() - t0, schedule

    def merged_schedule(self, names: list[str]) -> AdapterSchedule:
        out: dict = {}
        for name in names:
            sched = self.schedules.get(name, AdapterSchedule())
            for key in ("steps", "shift", "audio_shift"):
                value = getattr(sched, key)
                if value is None:
                    continue
                if key in out and out[key] != value:
                    raise AdapterError(
                        f"the active adapters ask for different {key}s ({out[key]} and {value}); use adapters "
                        "trained for the same schedule together."
                    )
                out[key] = value
        return AdapterSchedule(**out)


def check_no_foreign_tensors(model_dir, component: str, model) -> None:
    """Refuse a checkpoint whose files hold tensors the diffusers model has no place for.

    ``from_pretrained`` only warns about unexpected keys and drops them: a checkpoint made for another runtime
    (block-sparse attention gates, quantisation scales) would then load silently as a different model.
    """
    folder = model_dir / component
    expected = set(model.state_dict().keys())
    unexpected = []
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            unexpected.extend(k for k in fh.keys() if k not in expected)
    if unexpected and os.environ.get("H3_ALLOW_UNEXPECTED_TENSORS") == "1":
        logging.getLogger("comfy_h3.B").warning(
            "H3_ALLOW_UNEXPECTED_TENSORS=1: loading %s/%s with %d tensors dropped: %s", model_dir, component,
            len(unexpected), describe_keys(unexpected))
        return
    if unexpected:
        raise ModelFolderError(
            f"component {component!r} in {model_dir} holds {len(unexpected)} tensors the diffusers MiniMax-H3 "
            f"transformer cannot hold: {describe_keys(unexpected)}; they belong to {runtime_of(unexpected)}. "
            "Refusing to load it with them dropped: use a checkpoint converted for diffusers (or set "
            "H3_ALLOW_UNEXPECTED_TENSORS=1 on B to load it anyway, knowing they are ignored)."
        )
