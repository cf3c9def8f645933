"""Input nodes: keyframes (fl2va), references (ref2va) and a list of prompts for a batch. They check what they get
and hand it on; nothing runs on a model here."""

from __future__ import annotations

import time

import numpy as np

from ..engine.contract import request as rq
from .common import CATEGORY, MAX_BATCH, audio_clip, image_list, local_record, report
from .values import Keyframes, References


class H3Keyframes:
    DESCRIPTION = "First and/or last keyframe for MiniMax-H3's fl2va workflow."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_KEYFRAMES",)
    RETURN_NAMES = ("keyframes",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}, "optional": {"first_image": ("IMAGE",), "last_image": ("IMAGE",)},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def make(self, first_image=None, last_image=None, unique_id=None):
        t0, w0 = time.perf_counter(), time.time()
        if first_image is None and last_image is None:
            raise rq.RequestError("H3Keyframes has no image connected; connect first_image, last_image or both.")
        first = rq.to_pil_rgb(image_list(first_image)[0], "first_image") if first_image is not None else None
        last = rq.to_pil_rgb(image_list(last_image)[0], "last_image") if last_image is not None else None
        rec = local_record("keyframes", t0, w0)
        return {"ui": report("H3Keyframes", unique_id, [rec], "keyframes"), "result": (Keyframes(first, last),)}


class H3References:
    DESCRIPTION = "Image references (a batch; at most 9) and an optional audio reference for the ref2va workflow."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_REFERENCES",)
    RETURN_NAMES = ("references",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",)}, "optional": {"audio": ("AUDIO",)},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def make(self, images, audio=None, unique_id=None):
        t0, w0 = time.perf_counter(), time.time()
        imgs = image_list(images)
        if len(imgs) > rq.MAX_IMAGE_REFERENCES:
            raise rq.RequestError(f"{len(imgs)} image references were given; MiniMax-H3 reads at most "
                                  f"{rq.MAX_IMAGE_REFERENCES}: drop {len(imgs) - rq.MAX_IMAGE_REFERENCES}.")
        pil = [rq.to_pil_rgb(im, f"reference image {i}") for i, im in enumerate(imgs)]
        rec = local_record("references", t0, w0)
        return {"ui": report("H3References", unique_id, [rec], "references"),
                "result": (References(pil, audio_clip(audio)),)}


class H3PromptList:
    DESCRIPTION = ("Several prompts for one graph run, one per line (blank lines skipped), each with a seed: fixed "
                   "(the same for all), increment (seed, seed+1, ...) or random (drawn from the seed). Connect prompt "
                   "to H3TextEncode's prompt and seed to H3RemoteDenoise's seed: the H3 nodes pipeline the requests "
                   "across A and B.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING", "INT")
    RETURN_NAMES = ("prompt", "seed")
    OUTPUT_IS_LIST = (True, True)
    FUNCTION = "make"
    SEED_MODES = ("fixed", "increment", "random")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "prompts": ("STRING", {"multiline": True, "default": "", "tooltip": "one prompt per line"}),
            "seed": ("INT", {"default": 0, "min": 0, "max": rq.MAX_SEED, "control_after_generate": True}),
            "seed_mode": (list(cls.SEED_MODES), {"default": "increment"}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def VALIDATE_INPUTS(cls, prompts=None):
        if prompts is not None:
            try:
                cls.parse(prompts)
            except rq.RequestError as exc:
                return str(exc)
        return True

    @staticmethod
    def parse(text) -> list[str]:
        if not isinstance(text, str):
            raise rq.RequestError(f"prompts is a {type(text).__name__}; give text, one prompt per line.")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not lines:
            raise rq.RequestError("prompts is empty; write one prompt per line.")
        if len(lines) > MAX_BATCH:
            raise rq.RequestError(f"prompts has {len(lines)} lines, over the {MAX_BATCH} of one run; split them.")
        for i, line in enumerate(lines):
            try:
                rq.check_prompt(line)
            except rq.RequestError as exc:
                raise rq.RequestError(f"prompt line {i + 1}: {exc}") from None
        return lines

    def make(self, prompts, seed, seed_mode, unique_id=None):
        t0, w0 = time.perf_counter(), time.time()
        lines = self.parse(prompts)
        seeds = self.seeds(rq.check_seed(seed), seed_mode, len(lines))
        rec = local_record("prompts", t0, w0, note=f"{len(lines)} prompts, seeds {seed_mode}: "
                           + ", ".join(map(str, seeds[:4])) + (", ..." if len(seeds) > 4 else ""))
        ui = report("H3PromptList", unique_id, [rec], "prompts", extra={"prompts": len(lines), "seeds": seeds})
        return {"ui": ui, "result": (lines, seeds)}

    @classmethod
    def seeds(cls, seed: int, mode: str, n: int) -> list[int]:
        if mode == "fixed":
            return [seed] * n
        if mode == "increment":
            return [(seed + i) % (rq.MAX_SEED + 1) for i in range(n)]
        if mode == "random":
            rng = np.random.default_rng(seed)
            return [int(x) for x in rng.integers(0, 2**63 - 1, size=n, dtype=np.int64)]
        raise rq.RequestError(f"seed_mode is {mode!r}; choose one of {list(cls.SEED_MODES)}.")
