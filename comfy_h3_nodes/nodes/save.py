"""Saving: ``H3SaveVideo`` writes an MP4 (H.264 + AAC) with the prompt and workflow JSON in its metadata."""

from __future__ import annotations

import time

from ..engine.media import next_path, write_mp4
from ..host import host
from .common import CATEGORY, local_record, report


class H3SaveVideo:
    DESCRIPTION = "Writes an MP4 (H.264 + AAC) with the prompt and workflow JSON in its metadata, and previews it."
    CATEGORY = CATEGORY
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images": ("IMAGE",),
            "audio": ("AUDIO",),
            "fps": ("INT", {"default": 24, "min": 1, "max": 120}),
            "filename_prefix": ("STRING", {"default": "h3/video"}),
        }, "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}

    def save(self, images, audio, fps, filename_prefix, unique_id=None, prompt=None, extra_pnginfo=None):
        t0, w0 = time.perf_counter(), time.time()
        path, subfolder = next_path(host().output_dir(), filename_prefix)
        metadata = {**({"prompt": prompt} if prompt is not None else {}), **(extra_pnginfo or {})}
        write_mp4(path, images, audio, int(fps), metadata)
        rec = local_record("save", t0, w0, bytes={"mp4": path.stat().st_size}, note=str(path))
        ui = report("H3SaveVideo", unique_id, [rec], "save",
                    ui={"images": [{"filename": path.name, "subfolder": subfolder, "type": "output"}],
                        "animated": [True]})
        return {"ui": ui, "result": ()}


def save_partial(videos: list) -> list:
    """The finished videos of a batch that failed part-way (``(images, audio, fps)`` each), written before the
    error is raised: nothing is lost."""
    paths = []
    for images, audio, fps in videos:
        path, _ = next_path(host().output_dir(), "h3/batch_partial")
        write_mp4(path, images, audio, int(fps), {})
        paths.append(path)
    return paths
