"""Model roots: the folders machine B may load checkpoints from.

The B actor enforces them itself, in ``__init__``, before anything is read: a model path is allowed only when its real
location (symlinks and ``..`` resolved) lies inside a root. Roots come from two independent places and each one that
is set must allow the path:

* the actor's config (``model_roots``, a list; ``remote_worker setup`` passes ``--model-root`` or, by default, the
  parent folder of ``--model-path``);
* the environment of B's Ray node, ``H3_MODEL_ROOTS`` (colon-separated). ``remote_worker setup`` sets it on
  ``ray start``, and Ray workers inherit the raylet's environment, so an actor that a driver on A creates on B (with
  any config) still obeys B's roots.

With neither set (the embedded single-machine cluster of tests and ``local`` mode) there is no restriction.

A model may be named as B's picker lists it: relative to the root it lies under (``MiniMax-H3``,
``diffusion_models/minimax_h3_t2va_fp8.safetensors``, as ComfyUI names its models). :func:`resolve_model` turns such a
name into the path under the first root holding it (B's own roots; with none, the ``search_roots`` A sent: A's model
roots, which the embedded cluster's B and A's DiT rank share); an absolute path and ``tiny-random`` are used as given,
and a name no root holds is refused in one sentence naming it and the roots. :func:`enforce` resolves first, so every
place B accepts a model path takes a name.
"""

from __future__ import annotations

import os
import pathlib

from comfy_h3_nodes.engine.contract.errors import ModelFolderError
from comfy_h3_nodes.engine.model import catalog
from comfy_h3_nodes.engine.model.folders import b_components, check_model_dir

ENV = "H3_MODEL_ROOTS"


class ModelRootError(ModelFolderError):
    """A model path outside every configured model root."""


def parse_roots(value: str | list | tuple | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(os.pathsep)
    return [str(v).strip() for v in value if str(v).strip()]


def own_roots(config: dict, environ: dict | None = None) -> list[str]:
    """B's own model roots: the config's, then its node's ``H3_MODEL_ROOTS``."""
    environ = os.environ if environ is None else environ
    return list(dict.fromkeys(parse_roots(config.get("model_roots")) + parse_roots(environ.get(ENV))))


def name_roots(config: dict, environ: dict | None = None) -> list[str]:
    """Where a model name is looked up: B's own roots, else (it has none) the ``search_roots`` A sent."""
    return own_roots(config, environ) or parse_roots(config.get("search_roots"))


def resolve_model(config: dict, environ: dict | None = None) -> str:
    """The path ``config["model_dir"]`` names: a name (relative) joined to the first of :func:`name_roots` that holds
    it; an absolute path (``~`` expanded) and ``tiny-random`` as given. A name none of them holds is a
    :class:`ModelRootError` (with no roots at all, a path relative to the working folder, as before, when it exists)."""
    model = str(config.get("model_dir") or "").strip()
    if catalog.is_tiny(model):
        return model
    text = os.path.expanduser(model)
    if not model or os.path.isabs(text):
        return text
    roots = name_roots(config, environ)
    found = catalog.find_named(text, roots)  # as ComfyUI names it, whatever layout the roots have
    if found:
        return found
    if not roots and os.path.exists(text):
        return os.path.abspath(text)
    where = f"under its model roots ({', '.join(roots)})" if roots else "and no model roots to look it up in"
    raise ModelRootError(f"machine B has no model {model!r} {where}")


def real(path: str | os.PathLike) -> pathlib.Path:
    return pathlib.Path(os.path.realpath(os.path.expanduser(str(path))))


def inside(path: pathlib.Path, root: pathlib.Path) -> bool:
    return path == root or root in path.parents


def check_model_path(path: str | os.PathLike, roots: list[str], source: str = "model roots") -> pathlib.Path:
    """``path`` resolved, if it lies inside one of ``roots`` (resolved); else :class:`ModelRootError`."""
    resolved = real(path)
    if not roots:
        return resolved
    real_roots = [real(r) for r in roots]
    if any(inside(resolved, r) for r in real_roots):
        return resolved
    shown = ", ".join(f"{r}" + (f" (= {rr})" if str(rr) != str(r) else "") for r, rr in zip(roots, real_roots))
    via = f" (resolves to {resolved})" if str(resolved) != str(path) else ""
    raise ModelRootError(
        f"model path {path}{via} is outside the {source} of machine B: {shown}. B loads checkpoints only from "
        f"inside its model roots; put the checkpoint folder under one of them, or add its parent folder with "
        f"`python -m remote_worker setup --model-root DIR` (environment {ENV}, colon-separated)."
    )


def enforce(config: dict, environ: dict | None = None) -> pathlib.Path:
    """What the B actor calls first: the config's roots and the node's ``H3_MODEL_ROOTS`` must both allow the path."""
    environ = os.environ if environ is None else environ
    path = resolve_model(config, environ)  # a name as B's picker lists it: under the first root holding it
    resolved = check_model_path(path, parse_roots(config.get("model_roots")), "configured model roots")
    check_model_path(path, parse_roots(environ.get(ENV)), f"model roots ({ENV})")
    return resolved


def preflight(config: dict) -> str | None:
    """Why B cannot load ``config``'s model, checked on B's node before its DiT actor starts (no torch, no model
    read: roots, existence, a diffusers folder's index and partition); None when it can try. The actor's own load
    still checks everything (formats, tensors)."""
    model = str(config.get("model_dir") or "")
    if catalog.is_tiny(model):
        return None
    try:
        path = enforce(config)
        if not path.exists():
            raise ModelFolderError(f"model path {model} does not exist")
        if path.is_dir():
            check_model_dir(path, b_components(config.get("partition", "transformer")))
    except ModelFolderError as exc:
        said = str(exc).rstrip(".")
        where = "" if "machine B" in said else " on machine B"
        picker = str(config.get("asked_by") or DIT_PICKER)
        has = names_b_has(config, picker) if isinstance(exc, ModelRootError) else ""  # a name it lacks: its names
        return (f"{said}{where}; choose a model B has in {picker}, or {catalog.TINY!r} to try the pack without "
                f"weights.{has}")
    return None


#: the input a model name comes from, unless the config says another (``asked_by``: H3RemoteModel's unet_name)
DIT_PICKER = "H3RemoteDiT's model_path"
#: the most names a refusal lists
NAMES_SHOWN = 8


def names_b_has(config: dict, picker: str = DIT_PICKER) -> str:
    """`` B has: a, b, ...``: the models under B's roots as the asking picker names them (UNETLoader's names of
    the transformer files for ``unet_name``; folders and files for H3RemoteDiT)."""
    try:
        names = [n for n in catalog.named_models(name_roots(config)) if not catalog.is_tiny(n)]
    except OSError:
        return ""
    if picker.endswith("unet_name"):
        names = list(dict.fromkeys(catalog.comfy_dit_name(n) for n in names
                                   if n.endswith((".safetensors", ".gguf"))))
    if not names:
        return " B has no model under its roots."
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    return f" B has: {', '.join(names[:NAMES_SHOWN])}{more}."
