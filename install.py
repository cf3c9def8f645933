"""ComfyUI-Manager runs this with ComfyUI's own Python after installing requirements.txt; by hand, run it with the
Python that runs ComfyUI (``/path/to/ComfyUI/.venv/bin/python install.py``).

It installs the pack's requirements into the Python running it (never torch, torchvision or torchaudio) and copies
the example workflows' inputs (``example_workflows/inputs/``) into ComfyUI's ``input/`` folder, skipping every file
already there: a file of the user's is never overwritten. ``--input-dir DIR`` names the folder when ComfyUI runs
with ``--input-directory``; ``--no-pip`` only copies.
"""
import argparse
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
INPUTS = HERE / "example_workflows" / "inputs"
NEVER = ("torch", "torchvision", "torchaudio", "torchsde")


def requirements() -> list[str]:
    reqs = []
    for line in (HERE / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.lower().startswith(NEVER):
            reqs.append(line)
    return reqs


def comfyui_input_dir() -> pathlib.Path | None:
    """``ComfyUI/input`` when this pack sits in ``ComfyUI/custom_nodes/<pack>``; else None."""
    root = HERE.parent.parent
    if HERE.parent.name == "custom_nodes" and (root / "main.py").is_file():
        return root / "input"
    return None


def copy_inputs(dest: pathlib.Path) -> tuple[list[str], list[str]]:
    """Copy the example inputs into ``dest``; returns ``(copied, kept)`` file names (kept: already there)."""
    dest.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for src in sorted(INPUTS.iterdir()):
        if not src.is_file():
            continue
        target = dest / src.name
        if target.exists():
            kept.append(src.name)
            continue
        shutil.copyfile(src, target)
        copied.append(src.name)
    return copied, kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Install comfy-h3's requirements and example inputs.")
    ap.add_argument("--input-dir", help="ComfyUI's input folder (default: ComfyUI/input above custom_nodes)")
    ap.add_argument("--no-pip", action="store_true", help="only copy the example inputs")
    args = ap.parse_args(argv)
    rc = 0
    if not args.no_pip:
        reqs = requirements()
        print(f"[comfy-h3] installing into {sys.executable}: {' '.join(reqs)}")
        rc = subprocess.call([sys.executable, "-m", "pip", "install", *reqs])
    dest = pathlib.Path(args.input_dir).expanduser() if args.input_dir else comfyui_input_dir()
    if dest is None:
        print(f"[comfy-h3] not inside ComfyUI/custom_nodes: copy {INPUTS} into ComfyUI's input/ folder yourself, or "
              "run again with --input-dir DIR")
        return rc
    copied, kept = copy_inputs(dest)
    print(f"[comfy-h3] example inputs in {dest}: copied {', '.join(copied) or 'none'}"
          + (f"; already there (not overwritten): {', '.join(kept)}" if kept else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
