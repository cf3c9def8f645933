"""What A and B must agree on before a request crosses: the pack's version and the versions of what it builds on.

The executor compares both machines' :func:`versions` at every health check (the wire schema included), and B's
setup compares them with what A's head published; a difference is one sentence naming both values.
"""

from __future__ import annotations

import pathlib
from importlib import metadata

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from .wire import SCHEMA_VERSION

#: the repository root (the pack's folder): pyproject.toml, example_workflows/, web/
PACK_ROOT = pathlib.Path(__file__).resolve().parents[3]

PYPROJECT = PACK_ROOT / "pyproject.toml"


def pack_version(pyproject: pathlib.Path = PYPROJECT) -> str:
    """comfy-h3's version: from the checkout's ``pyproject.toml`` when the code runs from one (a git clone into
    ``custom_nodes/`` has no installed-package metadata, and an editable install's metadata can be stale), else from
    the installed package's metadata."""
    try:
        text = pyproject.read_text()
    except OSError:
        text = ""
    if text:
        project = tomllib.loads(text).get("project", {})
        if project.get("name") == "comfy-h3" and project.get("version"):
            return str(project["version"])
    try:
        return metadata.version("comfy-h3")
    except metadata.PackageNotFoundError:
        return "unknown (no pyproject.toml beside the code and no installed comfy-h3)"


def versions() -> dict[str, str]:
    def v(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    return {"comfy-h3": pack_version(), "diffusers": v("diffusers"), "torch": v("torch"),
            "transformers": v("transformers"), "ray": v("ray"), "wire_schema": str(SCHEMA_VERSION)}
