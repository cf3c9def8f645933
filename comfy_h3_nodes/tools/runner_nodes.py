"""The two ComfyUI core loaders the example workflows use (``LoadImage``, ``LoadAudio``), for the headless runner only.

They read from the runner's input folders (``--input``, the workflow's own ``inputs/`` folder, then
``example_workflows/inputs``) and return ComfyUI's standard values: IMAGE ``[1,H,W,3]`` float in 0..1 (+ MASK) and
AUDIO ``{"waveform": [1,C,L], "sample_rate"}``. Inside ComfyUI the real core nodes run instead.
"""

from __future__ import annotations

import os
import pathlib

import av
import numpy as np
import torch
from PIL import Image

INPUT_DIRS: list[pathlib.Path] = []


def find_input(name: str) -> pathlib.Path:
    if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in pathlib.PurePath(name).parts:
        raise ValueError(f"input file {name!r} must be a plain file name inside an input folder.")
    for folder in INPUT_DIRS:
        p = folder / name
        if p.is_file():
            return p
    raise FileNotFoundError(
        f"input file {name!r} is in none of the input folders ({', '.join(map(str, INPUT_DIRS)) or 'none'}); "
        "put it there or pass --input DIR."
    )


class LoadImage:
    CATEGORY = "image"
    RETURN_TYPES = ("IMAGE", "MASK")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("STRING", {"image_upload": True})}}

    def load(self, image):
        with Image.open(find_input(image)) as im:
            rgb = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
            alpha = np.asarray(im.getchannel("A"), dtype=np.float32) / 255.0 if "A" in im.getbands() else None
        mask = torch.from_numpy(1.0 - alpha)[None] if alpha is not None else torch.zeros((1, *rgb.shape[:2]))
        return torch.from_numpy(rgb)[None], mask


class LoadAudio:
    CATEGORY = "audio"
    RETURN_TYPES = ("AUDIO",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"audio": ("STRING", {"audio_upload": True})}}

    def load(self, audio):
        chunks, rate = [], None
        with av.open(str(find_input(audio))) as container:
            stream = container.streams.audio[0]
            rate = stream.rate
            for frame in container.decode(stream):
                arr = frame.to_ndarray()
                if frame.format.is_packed:
                    arr = arr.reshape(-1, len(frame.layout.channels)).T
                chunks.append(arr.astype(np.float32) / (32768.0 if arr.dtype == np.int16 else 1.0))
        wave = np.concatenate(chunks, axis=1)
        return ({"waveform": torch.from_numpy(np.ascontiguousarray(wave))[None], "sample_rate": int(rate)},)


CORE_NODES = {"LoadImage": LoadImage, "LoadAudio": LoadAudio}
