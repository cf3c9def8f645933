"""Build (or reuse) the Python environment of a real ComfyUI for the real-ComfyUI suite, the way a user's machine has it.

    python3 scripts/comfyui_env.py [--comfyui DIR] [--env DIR]     # prints the environment's python on its last line

What it does, in the order a user does it (README, "Install in ComfyUI"), on a CPU machine:
1. a venv with torch pinned to the CPU build (``torch==2.13.0``: this machine's file; PyPI's newest is a CUDA build);
2. ComfyUI's own ``requirements.txt`` from PyPI with that pin (``-c``), less ``torchaudio`` (PyPI has none for torch
   2.13), then the two work-arounds a CPU torch needs (../shared/comfyui.md, last part):
   - torchaudio 2.11.1 without its dependencies and without its ``lib/*.so`` (the pure-Python parts core's audio and
     H3 nodes use keep working);
   - PyPI's torchvision is a CUDA build whose C++ ops do not load beside a CPU torch: the two ``register_fake``
     decorators of ``torchvision/_meta_registrations.py`` become no-ops when the op does not exist (only in this venv);
3. **the pack installed by its own ``install.py``, run by that Python** (what ComfyUI-Manager does after reading
   ``requirements.txt``), with the same pin, so nothing it asks for replaces torch.

The environment is cached in an ignored folder (default ``.comfyui-venv`` in the repository) and rebuilt only when its
key changes: ComfyUI's ``requirements.txt``, the pack's ``requirements.txt`` and ``install.py``, the recipe's number
(``RECIPE``, bumped with the steps below) and the Python version. ComfyUI's own folder is only read (CI's copy has no write bits).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
TORCHAUDIO = "torchaudio==2.11.1"
STAMP = ".comfy-h3-env-key"
#: bump when the recipe below changes (the key also holds the requirements it installs)
RECIPE = 1
#: the patch of torchvision's meta registrations (a marker line makes it idempotent)
TV_MARKER = "# comfy-h3 test env:"
TV_GUARD = f'''
{TV_MARKER} PyPI's torchvision is a CUDA build; beside a CPU torch its C++ ops are missing and
# registering a fake kernel for them raises "operator torchvision::nms does not exist". Skip only that case.
def _h3_register_fake(name):
    def apply(fn):
        try:
            return torch.library.register_fake(name)(fn)
        except RuntimeError as e:
            if "does not exist" not in str(e):
                raise
            return fn
    return apply

'''


def log(msg: str) -> None:
    print(f"[comfyui-env] {msg}", file=sys.stderr, flush=True)


def env_key(comfyui: pathlib.Path) -> str:
    h = hashlib.sha256()
    for f in (comfyui / "requirements.txt", REPO / "requirements.txt", REPO / "install.py"):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(f"{RECIPE} {sys.version_info[:2]} {TORCH} {TORCHAUDIO}".encode())
    return h.hexdigest()[:16]


def run(cmd: list[str], logfile: pathlib.Path | None = None, **kw) -> None:
    """Run one step; with ``logfile`` its output goes there and only its tail is shown when it fails."""
    log("$ " + " ".join(map(str, cmd)))
    t0 = time.monotonic()
    if logfile is None:
        subprocess.run([str(c) for c in cmd], check=True, **kw)
    else:
        with open(logfile, "ab") as out:
            proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, **kw)
        if proc.returncode:
            tail = logfile.read_text(errors="replace").splitlines()[-40:]
            raise SystemExit(f"[comfyui-env] step failed (exit {proc.returncode}); the end of {logfile}:\n"
                             + "\n".join(tail))
    log(f"  ({time.monotonic() - t0:.0f} s)")


def site_packages(py: pathlib.Path) -> pathlib.Path:
    out = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return pathlib.Path(out)


def patch_torchvision(site: pathlib.Path) -> None:
    path = site / "torchvision" / "_meta_registrations.py"
    text = path.read_text()
    if TV_MARKER in text:
        return
    n = text.count("@torch.library.register_fake(")
    if n == 0:
        raise SystemExit(f"{path} has no @torch.library.register_fake decorator: this torchvision needs another "
                         "work-around (see ../shared/comfyui.md)")
    text = text.replace("@torch.library.register_fake(", "@_h3_register_fake(")
    # after the imports: the guard must exist before the first decorated function
    first = re.search(r"^@", text, flags=re.M)
    text = text[:first.start()] + TV_GUARD.lstrip("\n") + "\n" + text[first.start():]
    path.write_text(text)
    log(f"patched {n} register_fake decorators in {path}")


def build(comfyui: pathlib.Path, env: pathlib.Path, key: str) -> pathlib.Path:
    if env.exists():
        log(f"rebuilding {env} (its key is not {key})")
        shutil.rmtree(env)
    work = env / "build"
    run([sys.executable, "-m", "venv", env])
    py = env / "bin" / "python"
    work.mkdir()
    pin = work / "pin.txt"
    pin.write_text(TORCH + "\n")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run(pip + [TORCH])
    reqs = [ln for ln in (comfyui / "requirements.txt").read_text().splitlines()
            if not re.match(r"\s*torchaudio\b", ln)]
    (work / "comfyui-requirements.txt").write_text("\n".join(reqs) + "\n")
    run(pip + ["-r", work / "comfyui-requirements.txt", "-c", pin], work / "pip.log")
    run(pip + ["--no-deps", TORCHAUDIO])
    site = site_packages(py)
    for so in sorted((site / "torchaudio" / "lib").glob("*.so")):
        so.unlink()
    patch_torchvision(site)
    # the pack, as the README tells users: its install.py run by ComfyUI's Python (PIP_CONSTRAINT keeps torch)
    run([py, REPO / "install.py", "--input-dir", work / "input"], work / "install.py.log", cwd=REPO,
        env={**_clean_env(), "PIP_CONSTRAINT": str(pin), "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    check = ("import torch, torchvision, torchaudio, av, comfy_kitchen, ray, diffusers, transformers; "
             "print('torch', torch.__version__, 'torchvision', torchvision.__version__, "
             "'diffusers', diffusers.__version__, 'ray', ray.__version__)")
    run([py, "-c", check], env=_clean_env())
    (env / STAMP).write_text(key + "\n")
    return py


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui", default=str(REPO.parent / "shared" / "comfyui"),
                    help="ComfyUI's source folder (default: ../shared/comfyui)")
    ap.add_argument("--env", default=str(REPO / ".comfyui-venv"), help="the environment's folder (default: .comfyui-venv)")
    args = ap.parse_args(argv)
    comfyui, env = pathlib.Path(args.comfyui).resolve(), pathlib.Path(args.env).absolute()
    if not (comfyui / "main.py").is_file() or not (comfyui / "requirements.txt").is_file():
        raise SystemExit(f"{comfyui} is not a ComfyUI checkout (no main.py and requirements.txt); set COMFYUI_DIR")
    key = env_key(comfyui)
    py = env / "bin" / "python"
    stamp = env / STAMP
    if py.exists() and stamp.is_file() and stamp.read_text().strip() == key:
        log(f"reusing {env} (key {key})")
    else:
        t0 = time.monotonic()
        py = build(comfyui, env, key)
        log(f"built {env} in {time.monotonic() - t0:.0f} s (key {key})")
    print(py)
    return 0


if __name__ == "__main__":
    sys.exit(main())
