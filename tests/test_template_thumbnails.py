"""Every template has its own card in ComfyUI's Templates dialog.

The frontend asks for ``/api/workflow_templates/<pack>/<template>.jpg`` and ComfyUI serves ``example_workflows/``
there, so each ``example_workflows/<name>.json`` needs ``<name>.jpg`` beside it. scripts/make_template_thumbnails.py
makes them from the pack's own output (a tiny-model run of each template); this checks the shipped files only, no
model runs.
"""

from __future__ import annotations

import hashlib
import pathlib
import subprocess

import pytest
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "example_workflows"
WORKFLOWS = sorted(EXAMPLES.glob("*.json"))
CARD_SIZE = (512, 512)  # scripts/make_template_thumbnails.py: CARD_SIZE, MAX_BYTES
MAX_BYTES = 60 * 1024


def test_there_are_templates():
    assert len(WORKFLOWS) >= 6


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_each_template_has_its_own_jpeg_card(path):
    card = path.with_suffix(".jpg")
    assert card.is_file(), f"{card.name} is missing: run python scripts/make_template_thumbnails.py {path.stem}"
    size = card.stat().st_size
    assert size < MAX_BYTES, f"{card.name} is {size} bytes; the limit is {MAX_BYTES}"
    with Image.open(card) as img:
        assert img.format == "JPEG" and img.mode == "RGB" and img.size == CARD_SIZE, (img.format, img.mode, img.size)
        img.load()


def test_no_two_cards_are_the_same_picture():
    hashes = {}
    for path in WORKFLOWS:
        with Image.open(path.with_suffix(".jpg")) as img:
            hashes.setdefault(hashlib.sha256(img.convert("RGB").tobytes()).hexdigest(), []).append(path.stem)
    same = [names for names in hashes.values() if len(names) > 1]
    assert not same, f"these templates show the same card: {same}"


def test_no_card_is_left_out_of_the_pack_by_gitignore():
    """The registry packs the git checkout minus what .gitignore drops ([tool.comfy] includes is empty)."""
    cards = [str(p.with_suffix(".jpg").relative_to(ROOT)) for p in WORKFLOWS]
    try:
        out = subprocess.run(["git", "check-ignore", *cards], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if out.returncode == 128:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    assert out.returncode == 1 and not out.stdout.strip(), f"ignored by git: {out.stdout.split()}"
