"""ComfyUI-Manager runs this with ComfyUI's own Python after installing requirements.txt.

It installs the pack's requirements into the Python running it and never touches torch, torchvision or torchaudio.
"""
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
NEVER = ("torch", "torchvision", "torchaudio", "torchsde")


def requirements() -> list[str]:
    reqs = []
    for line in (HERE / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.lower().startswith(NEVER):
            reqs.append(line)
    return reqs


def main() -> int:
    reqs = requirements()
    print(f"[comfy-h3] installing into {sys.executable}: {' '.join(reqs)}")
    return subprocess.call([sys.executable, "-m", "pip", "install", *reqs])


if __name__ == "__main__":
    sys.exit(main())
