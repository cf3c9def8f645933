"""FastH3: FastVideo's distilled MiniMax-H3 checkpoints that run video sparse attention (VSA-H3). What makes a folder
one, and the settings the pack reads from it (file system and JSON only: no torch, so pickers may import it).

A FastH3 transformer is a diffusers transformer folder whose every main block carries the compression gate of VSA:
``transformer_blocks.{i}.attn.to_gate_compress.weight`` (``[heads * head_dim, hidden]``, no bias; 50 x 38.5 M = 1.93 B
parameters at release size). diffusers' ``MiniMaxH3Transformer3DModel`` has no such module; B adds it and loads the
gates itself (:mod:`.vsa`). A gate on some blocks only, anywhere else (the token refiner) or under another name
is refused. FastH3 loads as a folder only: a single file or a GGUF with gates is refused.

FastVideo passes sparsity, tile size and steps as run-time arguments, so a checkpoint may state none of them. The pack
reads them, key by key, from the first place that has them:

1. a ``vsa`` block in ``<transformer>/config.json``::

       "vsa": {"release": "v1", "sparsity": 0.9, "tile_size": 64, "mode": "exempt", "steps": 5,
               "shift": 12.0, "audio_shift": 3.0, "dense_layers": []}

   (unknown keys in it are refused: a typo must not fall back to a default);
2. FastVideo's own argument names at the top of that ``config.json``: ``VSA_sparsity``, ``VSA_tile_size``,
   ``vsa_mode``, ``num_inference_steps``, ``vsa_dense_layers`` (:data:`INFERENCE_KEYS`);
3. ``fastvideo_inference.json`` in the transformer folder, else in the checkpoint folder, with the same names and
   ``release``, ``shift``, ``audio_shift`` (its other keys are FastVideo's business and ignored);
4. the release's defaults (:data:`RELEASES`; ``release`` defaults to ``v1``).

``steps`` counts sigma points, as the pack's ``steps`` input and FastVideo's ``num_inference_steps`` do: N points run
N - 1 transformer forwards. A request for another count is refused (:meth:`VSASettings.check_steps`): a distilled
checkpoint is only defined on its trained schedule. ``shift`` / ``audio_shift`` are the schedulers' sigma shifts B
runs with (the trained ones replace the folder's scheduler configs).
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import asdict, dataclass

from ..contract.errors import ModelFolderError

GATE_MODULE = "to_gate_compress"
GATE_SUFFIX = f".attn.{GATE_MODULE}.weight"
GATE_MARKER = "gate_compress"
INFERENCE_JSON = "fastvideo_inference.json"
#: tokens per tile -> its (t, h, w) extent in latent tokens
TILE_SHAPES = {64: (4, 4, 4), 256: (4, 8, 8)}
MODES = ("exempt", "compete")
#: the trained recipes (v1: 4 forwards at sparsity 0.9; V2: 8 forwards at 0.8), both at 64-token tiles
RELEASES = {
    "v1": {"sparsity": 0.9, "tile_size": 64, "mode": "exempt", "steps": 5, "shift": 12.0, "audio_shift": 3.0,
           "dense_layers": ()},
    "v2": {"sparsity": 0.8, "tile_size": 64, "mode": "exempt", "steps": 9, "shift": 10.0, "audio_shift": 3.0,
           "dense_layers": ()},
}
#: ``config.json`` ``vsa`` block key -> ``fastvideo_inference.json`` key
INFERENCE_KEYS = {"release": "release", "sparsity": "VSA_sparsity", "tile_size": "VSA_tile_size", "mode": "vsa_mode",
                  "steps": "num_inference_steps", "shift": "shift", "audio_shift": "audio_shift",
                  "dense_layers": "vsa_dense_layers"}


class FastH3Error(ModelFolderError):
    """A FastH3 folder B cannot run as it is; the message names the file, the value and the fix."""


class TrainedScheduleError(ValueError):
    """A request whose step count is not the one its FastH3 checkpoint was trained for."""


@dataclass(frozen=True)
class VSASettings:
    """How B runs one FastH3 transformer partition."""

    release: str
    sparsity: float
    tile_size: int
    mode: str
    steps: int  # sigma points (forwards + 1)
    shift: float
    audio_shift: float
    dense_layers: tuple[int, ...]
    gates: int  # blocks with a gate
    source: str  # where the values came from

    @property
    def tile_shape(self) -> tuple[int, int, int]:
        return TILE_SHAPES[self.tile_size]

    @property
    def forwards(self) -> int:
        return self.steps - 1

    def describe(self) -> str:
        t, h, w = self.tile_shape
        return (f"FastH3 {self.release} (VSA-H3): sparsity {self.sparsity:g}, tile {self.tile_size} = {t}x{h}x{w}, "
                f"{self.mode}, trained for {self.steps} sigma points ({self.forwards} forwards, shifts "
                f"{self.shift:g}/{self.audio_shift:g}); settings from {self.source}")

    def check_steps(self, steps: int, where: str) -> None:
        """Refuse a step count the checkpoint was not trained for, in one sentence."""
        if int(steps) != self.steps:
            raise TrainedScheduleError(
                f"{where} is a FastH3 {self.release} checkpoint trained for {self.steps} sigma points "
                f"({self.forwards} transformer forwards, shifts {self.shift:g}/{self.audio_shift:g}) and the request "
                f"asks for {steps} steps: set steps to {self.steps}.")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dense_layers"] = list(self.dense_layers)
        d["tile_shape"] = list(self.tile_shape)
        return d


def gate_names(names) -> list[str]:
    return sorted(n for n in names if GATE_MARKER in n)


def expected_gates(num_layers: int) -> list[str]:
    return [f"transformer_blocks.{i}{GATE_SUFFIX}" for i in range(num_layers)]


def detect(folder: pathlib.Path, config: dict, names, where: str | None = None) -> VSASettings | None:
    """The VSA settings of a diffusers transformer folder (``config``: its config.json; ``names``: its tensors), or
    ``None`` for a dense one. Raises :class:`FastH3Error` for a folder that is half one, half the other."""
    where = where or str(folder)
    gates = gate_names(names)
    block = config.get("vsa")
    if not gates:
        if block is not None:
            raise FastH3Error(
                f"{where}/config.json declares VSA (a `vsa` block) but the folder holds no `{GATE_MODULE}` tensors: "
                "give the FastH3 folder with its gate weights, or remove the `vsa` block to run it dense.")
        return None
    layers = int(config.get("num_layers", 0))
    want = expected_gates(layers)
    missing, extra = sorted(set(want) - set(gates)), sorted(set(gates) - set(want))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of its {layers} blocks have none (`{missing[0]}` is missing)")
        if extra:
            parts.append(f"{len(extra)} are not a main block's `attn.{GATE_MODULE}.weight` (`{extra[0]}`)")
        raise FastH3Error(f"{where} holds VSA gate tensors that do not fit FastH3's layout: " + "; ".join(parts)
                          + ". Use the FastH3 checkpoint as FastVideo published it.")
    return read_settings(folder, config, len(gates), where)


def _inference_json(folder: pathlib.Path) -> tuple[dict, pathlib.Path | None]:
    for candidate in (folder / INFERENCE_JSON, folder.parent / INFERENCE_JSON):
        if candidate.is_file():
            try:
                data = json.loads(candidate.read_text())
            except json.JSONDecodeError as exc:
                raise FastH3Error(f"{candidate} is not valid JSON ({exc}): fix or remove it.") from exc
            if not isinstance(data, dict):
                raise FastH3Error(f"{candidate} holds a {type(data).__name__}, not a JSON object: fix or remove it.")
            return data, candidate
    return {}, None


def read_settings(folder: pathlib.Path, config: dict, gates: int, where: str | None = None) -> VSASettings:
    """Each setting from the ``vsa`` block, else ``fastvideo_inference.json``, else the release's default."""
    where = where or str(folder)
    block = config.get("vsa") or {}
    if not isinstance(block, dict):
        raise FastH3Error(f"{where}/config.json has `vsa` = {block!r}; it must be a JSON object of VSA settings.")
    unknown = sorted(set(block) - set(INFERENCE_KEYS))
    if unknown:
        raise FastH3Error(f"{where}/config.json's `vsa` block has unknown keys {', '.join(unknown)}; it takes "
                          f"{', '.join(INFERENCE_KEYS)}.")
    inference, inference_path = _inference_json(folder)
    values, sources = {}, set()
    for key, fv_key in INFERENCE_KEYS.items():
        if key in block:
            values[key], origin = block[key], f"{where}/config.json `vsa`.{key}"
            sources.add("config.json `vsa`")
        elif fv_key.startswith(("VSA_", "vsa_", "num_")) and fv_key in config:
            values[key], origin = config[fv_key], f"{where}/config.json `{fv_key}`"
            sources.add("config.json")
        elif fv_key in inference:
            values[key], origin = inference[fv_key], f"{inference_path} `{fv_key}`"
            sources.add(inference_path.name)
        else:
            continue
        values[key] = _checked(key, values[key], origin)
    release = values.pop("release", "v1")
    merged = {**RELEASES[release], **values}
    if not sources:
        source = f"FastH3 {release} defaults (no VSA settings in the folder)"
    else:
        source = " + ".join(sorted(sources))
        if len(values) < len(INFERENCE_KEYS) - 1:
            source += f", the rest {release} defaults"
    return VSASettings(release=release, sparsity=float(merged["sparsity"]), tile_size=int(merged["tile_size"]),
                       mode=str(merged["mode"]), steps=int(merged["steps"]), shift=float(merged["shift"]),
                       audio_shift=float(merged["audio_shift"]), dense_layers=tuple(merged["dense_layers"]),
                       gates=gates, source=source)


def _checked(key: str, value, origin: str):
    def bad(want: str):
        return FastH3Error(f"{origin} is {value!r}; it must be {want}.")

    if key == "release":
        rel = str(value).strip().lower()
        rel = {"1": "v1", "2": "v2"}.get(rel, rel)
        if rel not in RELEASES:
            raise bad(f"one of {', '.join(RELEASES)}")
        return rel
    if key == "sparsity":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
            raise bad("a number in [0, 1)")
        return float(value)
    if key == "tile_size":
        if isinstance(value, bool) or value not in TILE_SHAPES:
            raise bad(f"one of {', '.join(map(str, TILE_SHAPES))} (tokens per tile)")
        return int(value)
    if key == "mode":
        if value not in MODES:
            raise bad(f"one of {', '.join(MODES)}")
        return value
    if key == "steps":
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise bad("a whole number of sigma points, at least 2")
        return value
    if key in ("shift", "audio_shift"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise bad("a positive number")
        return float(value)
    if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in value):
        raise bad("a list of block indices")
    return tuple(value)
