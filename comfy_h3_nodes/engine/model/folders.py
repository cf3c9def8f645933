"""Checks of a diffusers checkpoint folder that read only the file system (no torch): what the node layer runs
before anything loads, and what both sides run before their loads."""

from __future__ import annotations

import os
import pathlib

from ..contract.configs import MODEL_INDEX, PARTITIONS, SCHEDULERS
from ..contract.errors import ModelFolderError


def b_components(partition: str) -> tuple[str, ...]:
    """What B loads from a folder for ``partition``: the partition and both schedulers."""
    if partition not in PARTITIONS:
        raise ModelFolderError(f"partition is {partition!r}; expected one of {PARTITIONS}.")
    return (partition, *SCHEDULERS)


def check_model_dir(path: str | os.PathLike, components: tuple[str, ...]) -> pathlib.Path:
    """The folder as a resolved path, after checking it holds the index and every needed component."""
    p = pathlib.Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise ModelFolderError(f"model folder {p} does not exist; give the folder that holds {MODEL_INDEX}.")
    if not p.is_dir():
        raise ModelFolderError(f"model path {p} is a file; give the folder that holds {MODEL_INDEX}.")
    p = p.resolve()
    if not (p / MODEL_INDEX).is_file():
        raise ModelFolderError(
            f"model folder {p} has no {MODEL_INDEX}; it is not a diffusers MiniMax-H3 checkpoint "
            "(ComfyUI's single-file repackages are a different layout)."
        )
    for name in components:
        sub = p / name
        if not sub.is_dir() or not any(sub.iterdir()):
            raise ModelFolderError(f"model folder {p} lacks the component {name!r} (no {sub}/); copy it there.")
    return p
