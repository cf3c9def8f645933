"""Regenerate example_workflows/<template>.jpg, the card each template shows in ComfyUI's Templates dialog.

ComfyUI's frontend asks for a custom node pack's template thumbnail at
``/api/workflow_templates/<pack folder>/<template name>.jpg`` and ComfyUI serves the pack's ``example_workflows/``
there, so the card of ``example_workflows/h3_t2va.json`` is ``example_workflows/h3_t2va.jpg``. Without one every card
shows the same placeholder.

Each card is made from the pack's own output: the template runs through the headless runner
(``comfy_h3_nodes.tools.runner.execute``) with the tiny random model on the embedded two-node Ray cluster, at a small
canvas (256 x 160) and 2 steps (FastH3: the 5 it was trained for) so a run takes seconds, and the card shows frames
of the MP4 it wrote, the waveform of its sound, the template's inputs where it has some (fl2va's first and last
frame, ref2va's image and voice), its short title, what it does and its settings as shipped. A template of ComfyUI's
own nodes (h3_core_*: the runner does not run ComfyUI's sampler) shows the run of the pack template of the same
workflow, and says so. With random weights the
frames are noise; the card says so. The seed is the template's own and the model is built from a fixed seed, so
re-running writes the same files (same Pillow, same codecs).

    python scripts/make_template_thumbnails.py                 # all nine templates
    python scripts/make_template_thumbnails.py h3_fl2va h3_ref2va

The cards are square (the dialog draws thumbnails in a square box), CARD_SIZE pixels, each under MAX_BYTES
(tests/test_template_thumbnails.py checks the shipped files).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import pathlib
import sys
import tempfile
from typing import NamedTuple

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from comfy_h3_nodes.engine import session  # noqa: E402
from comfy_h3_nodes.engine.contract.configs import TINY, TINY_FASTH3  # noqa: E402
from comfy_h3_nodes.tools.runner import execute, load_workflow  # noqa: E402

EXAMPLES = ROOT / "example_workflows"
INPUTS = EXAMPLES / "inputs"
CARD_SIZE = (512, 512)
MAX_BYTES = 60 * 1024
QUALITIES = (90, 85, 80, 75, 70, 65, 60, 55, 50)  # the first that fits under MAX_BYTES is kept
#: the small run each card is made from: canvas (multiples of 32) and sigma points (FastH3 keeps its 5)
RUN_WIDTH, RUN_HEIGHT, RUN_STEPS = 256, 160, 2


class Card(NamedTuple):
    """What a template's card says: a short title, a badge, a caption, and the inputs shown beside its output."""

    title: str
    badge: str
    caption: str
    accent: tuple[int, int, int]
    inputs: tuple[tuple[str, str], ...] = ()  # (label, file in example_workflows/inputs/)
    #: for a template of ComfyUI's own nodes (h3_core_*, which the headless runner does not run): the pack template
    #: of the same workflow whose run the card shows (the same model and B, the pack's own nodes on A)
    source: str = ""


CARDS = {
    "h3_t2va": Card("Text to video + audio", "t2va", "one prompt -> a clip with its own sound",
                    (64, 150, 255)),
    "h3_fl2va": Card("First + last frame", "fl2va", "two keyframes -> the video between them, with sound",
                     (255, 150, 40), (("first frame", "h3_first.png"), ("last frame", "h3_last.png"))),
    "h3_ref2va": Card("Reference image + voice", "ref2va", "an image and a voice guide the clip and its speech",
                      (190, 90, 255), (("reference image", "h3_reference.png"), ("voice", "h3_voice_32k.wav"))),
    "h3_t2va_turbo": Card("Turbo: 4 steps", "LoRA", "text to video + audio in 4 steps with a turbo LoRA",
                          (40, 200, 120)),
    "h3_fasth3_t2va": Card("FastH3", "VSA", "sparse attention (VSA) checkpoint, 5 sigma points",
                           (240, 70, 90)),
    "h3_t2va_batch": Card("Batch: a prompt list", "x4", "four prompts, one graph run, pipelined over A and B",
                          (240, 200, 40)),
    "h3_core_t2va": Card("ComfyUI's H3 graph, DiT on B", "core", "ComfyUI's own nodes; H3RemoteModel for UNETLoader",
                         (90, 200, 230), source="h3_t2va"),
    "h3_core_i2va": Card("ComfyUI's H3 image to video", "core", "MiniMaxH3ImageToVideo's first frame, DiT on B",
                         (230, 120, 60), (("first frame", "h3_first.png"),), source="h3_fl2va"),
    "h3_core_r2va": Card("ComfyUI's H3 reference video", "core", "MiniMaxH3ReferenceToVideo's image, DiT on B",
                         (160, 110, 240), (("reference image", "h3_reference.png"),), source="h3_ref2va"),
}

BG, PANEL, TEXT, DIM = (20, 22, 28), (34, 37, 46), (240, 242, 246), (150, 156, 170)
W, H = CARD_SIZE
MARGIN, GAP = 16, 8
INNER = W - 2 * MARGIN
TILE = ((INNER - GAP) // 2, 148)  # an input: two a row
FRAME = ((INNER - 3 * GAP) // 4, 72)  # an output frame: four a row
WAVE_H, LINE_H = 44, 21
VOICE_MS = 20  # how much of an input voice its tile shows


def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)  # Pillow's own font: the same on every machine


# ------------------------------------------------------------------------------------------------ running
def run_template(name: str, out_dir: pathlib.Path) -> tuple[list[pathlib.Path], dict]:
    """Run ``example_workflows/<name>.json`` small with the tiny model: the MP4s it wrote, and the template as
    shipped (API form)."""
    path = EXAMPLES / f"{name}.json"
    api, _ = load_workflow(path)
    tiny = TINY_FASTH3 if "fasth3" in name else TINY
    sets = []
    for nid, node in api.items():
        kind = node["class_type"]
        if kind == "H3TextEncode":
            sets += [f"{nid}.width={RUN_WIDTH}", f"{nid}.height={RUN_HEIGHT}"]
        elif kind == "H3RemoteDenoise" and tiny != TINY_FASTH3:  # FastH3 runs the sigma points it was trained for
            sets.append(f"{nid}.steps={RUN_STEPS}")
        elif kind == "H3LoRA":
            sets.append(f"{nid}.lora_path={json.dumps(TINY)}")
    result = execute(str(path), model_path=tiny, sets=sets, cluster="local", output=str(out_dir), quiet=True,
                     inputs=[str(INPUTS)])
    return result.videos(), api


def read_mp4(path: pathlib.Path) -> tuple[list[np.ndarray], np.ndarray, float]:
    """Every frame (RGB uint8), the sound (mono float) and the frame rate of an MP4."""
    with av.open(str(path)) as container:
        fps = float(container.streams.video[0].average_rate or 24)
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return frames, read_audio(path)[0], fps


def read_audio(path: pathlib.Path) -> tuple[np.ndarray, int]:
    """The sound of a media file as one mono channel (its scale does not matter: waveforms are drawn to their peak)
    and its sample rate."""
    chunks, rate = [], 1
    with av.open(str(path)) as container:
        if container.streams.audio:
            rate = container.streams.audio[0].rate
            for frame in container.decode(audio=0):
                raw = frame.to_ndarray()
                channels = len(frame.layout.channels)
                a = raw.reshape(channels, -1) if frame.format.is_planar else raw.reshape(-1, channels).T
                chunks.append(a.astype(np.float32).mean(axis=0))
    return (np.concatenate(chunks) if chunks else np.zeros(1, np.float32)), rate


# ------------------------------------------------------------------------------------------------ what it says
def nodes(api: dict, kind: str) -> list[dict]:
    """The inputs of every node of ``kind``."""
    return [n["inputs"] for n in api.values() if n["class_type"] == kind]


def prompts(api: dict) -> list[str]:
    plist = nodes(api, "H3PromptList")
    if plist:
        return [line.strip() for line in plist[0]["prompts"].splitlines() if line.strip()]
    return [enc["prompt"] for enc in nodes(api, "H3TextEncode") if isinstance(enc.get("prompt"), str)]


def core_widgets(ui: dict) -> dict[str, list]:
    """A template of ComfyUI's own nodes: each node type's widget values (the first node of each type)."""
    out: dict[str, list] = {}
    for node in ui["nodes"]:
        out.setdefault(node["type"], node.get("widgets_values") or [])
    return out


def core_prompts(ui: dict) -> list[str]:
    w = core_widgets(ui)
    return [(w.get("MiniMaxH3ImageToVideo") or w["MiniMaxH3ReferenceToVideo"])[0]]


def core_shipped(ui: dict) -> list[str]:
    """What a template of ComfyUI's own nodes runs as shipped: canvas, length, sampler, steps, seed, B's file."""
    w = core_widgets(ui)
    _, width, height, length = (w.get("MiniMaxH3ImageToVideo") or w["MiniMaxH3ReferenceToVideo"])[:4]
    scheduler, steps = w["BasicScheduler"][:2]
    return [f"as shipped: {width} x {height}, {length} frames, {w['KSamplerSelect'][0]} {scheduler}, {steps} steps, "
            f"seed {w['RandomNoise'][0]}", f"B: {w['H3RemoteModel'][0]}",
            "ComfyUI samples on A, every forward runs on B"]


def shipped(api: dict) -> list[str]:
    """What the template runs as shipped, from its own JSON: canvas, length, steps, seed, model (and LoRA)."""
    enc, den, dit = nodes(api, "H3TextEncode")[0], nodes(api, "H3RemoteDenoise")[0], nodes(api, "H3RemoteDiT")[0]
    seed = den.get("seed")
    for plist in nodes(api, "H3PromptList"):
        seed = f"{plist['seed']} ({plist['seed_mode']})"
    model = f"model {dit['model_path']}"
    for lora in nodes(api, "H3LoRA"):
        model += f" + LoRA {pathlib.Path(lora['lora_path']).stem} at {lora['strength']}"
    return [f"as shipped: {enc['width']} x {enc['height']}, {enc['num_frames']} frames, {den['steps']} steps, "
            f"seed {seed}", model, "A encodes and decodes in ComfyUI, B denoises on Ray"]


# ------------------------------------------------------------------------------------------------ drawing
def waveform(samples: np.ndarray, size: tuple[int, int], colour) -> Image.Image:
    """A min/max waveform of ``samples`` on a panel of ``size``."""
    w, h = size
    img = Image.new("RGB", size, PANEL)
    draw = ImageDraw.Draw(img)
    peak = float(np.abs(samples).max()) or 1.0
    mid = (h - 1) / 2
    for x, col in enumerate(np.array_split(samples / peak, w)):
        if col.size:
            draw.line([(x, mid - float(col.max()) * mid * 0.9), (x, mid - float(col.min()) * mid * 0.9)], fill=colour)
    return img


def trace(samples: np.ndarray, size: tuple[int, int], colour) -> Image.Image:
    """``samples`` drawn as one line across a panel of ``size`` (a short stretch: the shape of the wave)."""
    w, h = size
    img = Image.new("RGB", size, PANEL)
    peak = float(np.abs(samples).max()) or 1.0
    mid = (h - 1) / 2
    x = np.linspace(0, w - 1, len(samples))
    ImageDraw.Draw(img).line([(float(a), mid - float(b) / peak * mid * 0.8) for a, b in zip(x, samples)], fill=colour,
                             width=2)
    return img


def fit(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    return ImageOps.fit(image.convert("RGB"), size, Image.Resampling.LANCZOS)


def fit_text(text: str, size: int, width: int) -> str:
    """``text`` cut to ``width`` pixels at ``size``, with an ellipsis when cut."""
    f = font(size)
    if f.getlength(text) <= width:
        return text
    while text and f.getlength(text + "...") > width:
        text = text[:-1]
    return text.rstrip(" ,;") + "..."


def wrap(text: str, size: int, width: int, lines: int) -> list[str]:
    """``text`` in at most ``lines`` lines of ``width`` pixels, the last cut with an ellipsis when it does not fit."""
    f, out, words = font(size), [], text.split()
    while words and len(out) < lines:
        line = words.pop(0)
        while words and f.getlength(f"{line} {words[0]}") <= width:
            line = f"{line} {words.pop(0)}"
        out.append(line)
    if words:
        out[-1] = fit_text(f"{out[-1]} {' '.join(words)}", size, width)
    return out


def label(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str) -> None:
    draw.text(xy, fit_text(text, 14, INNER), font=font(14), fill=DIM)


def draw_inputs(img: Image.Image, card: Card, texts: list[str], top: int) -> None:
    """The template's inputs: its media files as tiles, else its prompt(s) as text."""
    draw = ImageDraw.Draw(img)
    if card.inputs:
        for i, (name, file) in enumerate(card.inputs):
            x = MARGIN + i * (TILE[0] + GAP)
            if file.endswith(".wav"):
                samples, rate = read_audio(INPUTS / file)
                label(draw, (x, top), f"input: {name} (its first {VOICE_MS} ms)")
                picture = trace(samples[: rate * VOICE_MS // 1000], TILE, card.accent)
            else:
                label(draw, (x, top), f"input: {name}")
                picture = fit(Image.open(INPUTS / file), TILE)
            img.paste(picture, (x, top + 18))
        return
    label(draw, (MARGIN, top), "input: prompt" if len(texts) == 1 else f"input: {len(texts)} prompts, one a line")
    draw.rounded_rectangle([MARGIN, top + 18, W - MARGIN, top + 18 + TILE[1]], radius=6, fill=PANEL)
    if len(texts) == 1:
        for i, line in enumerate(wrap(f'"{texts[0]}"', 20, INNER - 24, 5)):
            draw.text((MARGIN + 12, top + 30 + i * 27), line, font=font(20), fill=TEXT)
    else:
        for i, text in enumerate(texts[:5]):
            draw.text((MARGIN + 12, top + 30 + i * 27), fit_text(f"{i + 1}. {text}", 17, INNER - 24), font=font(17),
                      fill=TEXT)


def compose(name: str, videos: list[pathlib.Path], api: dict) -> Image.Image:
    """The card: title, badge and caption; the template's inputs; four frames and the sound of the run's output;
    the template's settings as shipped (``api``: the run's template; a core card reads its own JSON)."""
    card = CARDS[name]
    if card.source:
        ui = json.loads((EXAMPLES / f"{name}.json").read_text())
        texts, settings = core_prompts(ui), core_shipped(ui)
        made = f"output of the pack's {card.source} run, tiny random model (noise)"
    else:
        texts, settings = prompts(api), shipped(api)
        made = "output of a run with the tiny random model (its frames are noise)"
    img = Image.new("RGB", CARD_SIZE, BG)
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, W, 5], fill=card.accent)
    badge_font = font(18)
    bw = int(badge_font.getlength(card.badge)) + 20
    draw.text((MARGIN, 14), fit_text(card.title, 30, INNER - bw - 12), font=font(30), fill=TEXT)
    draw.rounded_rectangle([W - MARGIN - bw, 16, W - MARGIN, 44], radius=8, fill=card.accent)
    draw.text((W - MARGIN - bw / 2, 30), card.badge, font=badge_font, fill=BG, anchor="mm")
    draw.text((MARGIN, 56), fit_text(card.caption, 17, INNER), font=font(17), fill=DIM)

    y = 88
    draw_inputs(img, card, texts, y)
    y += 18 + TILE[1] + 14
    label(draw, (MARGIN, y), made)
    frames, audio, fps = read_mp4(videos[0])
    if len(videos) > 1:  # a batch: the middle frame of each prompt's video
        shots = []
        for i, video in enumerate(videos[:4]):
            vf = frames if i == 0 else read_mp4(video)[0]
            shots.append((f"{i + 1}", vf[len(vf) // 2]))
    else:
        shots = [(f"{k / fps:.1f} s", frames[k]) for k in (round(j * (len(frames) - 1) / 3) for j in range(4))]
    y += 18
    tag_font = font(13)
    for i, (tag, frame) in enumerate(shots):
        x = MARGIN + i * (FRAME[0] + GAP)
        img.paste(fit(Image.fromarray(frame), FRAME), (x, y))
        draw.rectangle([x, y + FRAME[1] - 17, x + int(tag_font.getlength(tag)) + 8, y + FRAME[1]], fill=BG)
        draw.text((x + 4, y + FRAME[1] - 16), tag, font=tag_font, fill=TEXT)
    y += FRAME[1] + GAP
    img.paste(waveform(audio, (INNER, WAVE_H), card.accent), (MARGIN, y))
    y += WAVE_H + 14
    for i, line in enumerate(settings):
        draw.text((MARGIN, y + i * LINE_H), fit_text(line, 16, INNER), font=font(16), fill=DIM if i else TEXT)
    return img


def jpeg_bytes(img: Image.Image) -> tuple[bytes, int]:
    """The best quality of QUALITIES whose JPEG fits under MAX_BYTES (no metadata: the bytes depend on the pixels)."""
    for q in QUALITIES:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=q, optimize=True)
        if buf.tell() < MAX_BYTES:
            return buf.getvalue(), q
    raise ValueError(f"no quality of {QUALITIES} gets the card under {MAX_BYTES} bytes")


# ------------------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"templates to redo (default: all): {', '.join(CARDS)}")
    ap.add_argument("--out", default=str(EXAMPLES), help="folder for the .jpg files (default: example_workflows/)")
    args = ap.parse_args(argv)
    names = [pathlib.Path(n).stem for n in args.names] or sorted(p.stem for p in EXAMPLES.glob("*.json"))
    unknown = [n for n in names if n not in CARDS or not (EXAMPLES / f"{n}.json").is_file()]
    if unknown:
        ap.error(f"no card for {', '.join(unknown)}; known: {', '.join(CARDS)}")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="h3_thumbs_") as tmp:
            for name in names:
                videos, api = run_template(CARDS[name].source or name, pathlib.Path(tmp) / name)
                if not videos:
                    raise RuntimeError(f"{name}: the run wrote no MP4")
                img = compose(name, videos, api)
                data, quality = jpeg_bytes(img)
                target = out / f"{name}.jpg"
                target.write_bytes(data)
                digest = hashlib.sha256(data).hexdigest()[:12]
                print(f"wrote {target} ({img.width}x{img.height}, {len(data)} bytes, JPEG quality {quality}, "
                      f"sha256 {digest})", flush=True)
    finally:
        if session.CLUSTER.embedded is not None:
            session.CLUSTER.embedded.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
