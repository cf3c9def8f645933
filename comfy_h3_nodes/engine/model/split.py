"""The A/B split of diffusers' own MiniMax-H3 blocks, and checked loading of a local checkpoint folder.

``MiniMaxH3Blocks().get_workflow(wf).sub_blocks`` is a flat, ordered dict of named blocks. Grouped by name prefix:
A-encode = ``before_encode*``, ``text_encoder*``, ``vae_encoder*``; B = every ``denoise.*``; A-decode =
``decode.*``. Running the three groups in order on the same state is the single-process pipeline, bit for bit.
No model code lives here: every block and component is diffusers'. Folder checks that need no torch are in
:mod:`.folders`; the names of workflows, partitions and components in :mod:`..contract.configs`.
"""

from __future__ import annotations

import contextlib
import pathlib
import time
import warnings
from dataclasses import dataclass, field

import torch
from diffusers import ModularPipeline
from diffusers.modular_pipelines import MiniMaxH3Blocks, SequentialPipelineBlocks

from ..contract.configs import DTYPES, MODEL_COMPONENTS, WORKFLOWS
from ..contract.errors import ModelFolderError
from .compat import ensure_processor_compat

ENCODE_PREFIXES = ("before_encode", "text_encoder", "vae_encoder")
DENOISE_PREFIX = "denoise."
DECODE_PREFIX = "decode."


def split_workflow(workflow: str) -> dict[str, object]:
    """``{"encode", "denoise", "decode"}`` -> a ``SequentialPipelineBlocks`` of diffusers' blocks for that part."""
    if workflow not in WORKFLOWS:
        raise ValueError(f"workflow is {workflow!r}; expected one of {WORKFLOWS}.")
    blocks = MiniMaxH3Blocks().get_workflow(workflow).sub_blocks
    groups: dict[str, dict] = {"encode": {}, "denoise": {}, "decode": {}}
    for name, block in blocks.items():
        if name.startswith(ENCODE_PREFIXES):
            groups["encode"][name] = block
        elif name.startswith(DENOISE_PREFIX):
            groups["denoise"][name] = block
        elif name.startswith(DECODE_PREFIX):
            groups["decode"][name] = block
        else:  # a diffusers release that added a block we do not know where to run: refuse, never guess
            raise RuntimeError(
                f"diffusers' {workflow} workflow has a block {name!r} that comfy-h3 does not place on A or B; "
                "this diffusers version is not supported."
            )
    return {k: SequentialPipelineBlocks.from_blocks_dict(v) for k, v in groups.items()}


def torch_dtype(name: str):
    if name not in DTYPES:
        raise ValueError(f"dtype is {name!r}; expected one of {DTYPES}.")
    return getattr(torch, name)


@dataclass
class LoadRecord:
    """One load the side performed; tests and the UI read these to prove a warm request loads nothing."""

    component: str
    seconds: float
    dtype: str
    reason: str = "startup"


@dataclass
class Loaded:
    host: object  # a ModularPipeline whose attributes are the loaded components
    records: list[LoadRecord] = field(default_factory=list)


@contextlib.contextmanager
def quiet_weight_norm():
    """The audio VAE is built with ``torch.nn.utils.weight_norm``, which torch deprecates with a FutureWarning on
    every load; the model is diffusers' to change, the warning nothing a user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.nn\.utils\.weight_norm.* is deprecated",
                                category=FutureWarning)
        yield


def load_checked(model_dir: pathlib.Path, names: tuple[str, ...], dtype: str, device: str,
                 reason: str = "startup", host=None) -> Loaded:
    """Load ``names`` through diffusers' ``load_components`` and raise if any came back ``None``.

    diffusers only logs a failed component load and leaves it ``None`` (shared/design.md, pitfall 1).
    """
    ensure_processor_compat()
    if host is None:
        host = ModularPipeline.from_pretrained(str(model_dir))
    records = []
    for name in names:
        t0 = time.perf_counter()
        kwargs = {"dtype": torch_dtype(dtype)}
        if name in MODEL_COMPONENTS:
            # straight onto the device: on a Spark's unified memory a CPU copy first would double the peak
            # (62 GB text encoder, 62 GB transformer partition) and can freeze the machine
            kwargs["device_map"] = device
        try:
            with quiet_weight_norm():
                host.load_components(names=[name], **kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised with the folder and component named
            raise ModelFolderError(f"component {name!r} in {model_dir} failed to load: {exc}") from exc
        comp = getattr(host, name, None)
        if comp is None:
            raise ModelFolderError(
                f"component {name!r} in {model_dir} did not load (diffusers left it None); check {model_dir / name}."
            )
        if hasattr(comp, "to") and hasattr(comp, "parameters"):
            comp.to(device)
            comp.eval()
        records.append(LoadRecord(name, time.perf_counter() - t0, dtype, reason))
    return Loaded(host, records)


def make_group_pipeline(blocks, model_dir: pathlib.Path, host, names: tuple[str, ...]):
    """A pipeline over ``blocks`` that shares the already-loaded components of ``host`` (no second load)."""
    pipe = blocks.init_pipeline(str(model_dir))
    wanted = set(pipe.component_names)
    pipe.update_components(**{n: getattr(host, n) for n in names if n in wanted and getattr(host, n, None) is not None})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pick_device(requested: str | None = None) -> str:
    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device {requested!r} was asked for, but torch sees no CUDA device on this machine.")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"

