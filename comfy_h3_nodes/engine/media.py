"""MP4 writing with PyAV: H.264 video + AAC stereo audio, the prompt and workflow JSON in the container metadata."""

from __future__ import annotations

import json
import logging
import pathlib
import re

import numpy as np

log = logging.getLogger("comfy_h3.video")

AAC_MIN_RATE = 8000
AAC_FALLBACK_RATE = 16000


def next_path(out_dir: pathlib.Path, prefix: str) -> tuple[pathlib.Path, str]:
    """``out_dir/<subfolder>/<name>_00001_.mp4`` with the next free counter; refuses prefixes leaving out_dir."""
    prefix = (prefix or "h3/video").strip().replace("\\", "/")
    target = (out_dir / prefix).resolve()
    out_dir = out_dir.resolve()
    if out_dir != target and out_dir not in target.parents:
        raise ValueError(f"filename_prefix {prefix!r} points outside the output folder {out_dir}; use a relative name.")
    folder, name = target.parent, target.name or "video"
    folder.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(rf"^{re.escape(name)}_(\d+)_\.mp4$")
    used = [int(m.group(1)) for p in folder.iterdir() if (m := pattern.match(p.name))]
    path = folder / f"{name}_{max(used, default=0) + 1:05d}_.mp4"
    return path, str(folder.relative_to(out_dir)) if folder != out_dir else ""


def _frames(images):
    """The video ``[frames, H, W, 3]`` as it came (a tensor or an array): :func:`_uint8` converts one frame at a
    time as it is encoded, never a float copy of the whole video (124 frames of 640x384 at once: 2 s and three
    float copies of 365 MB on one core; a frame at a time: 0.17 s in all, no whole-video copy)."""
    arr = images if hasattr(images, "detach") else np.asarray(images)
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"images have shape {tuple(arr.shape)}; expected [frames, H, W, 3].")
    return arr


def _uint8(frame) -> np.ndarray:
    """One frame in 0..1 (a tensor of any float dtype, or an array) as 8-bit RGB: clipped, scaled, rounded."""
    arr = frame.detach().cpu().float().numpy() if hasattr(frame, "detach") else np.asarray(frame)
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    return np.round(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8)


def _audio_planar(audio) -> tuple[np.ndarray, int]:
    wf = audio["waveform"]
    wf = wf.detach().cpu().float().numpy() if hasattr(wf, "detach") else np.asarray(wf, dtype=np.float32)
    if wf.ndim == 3:
        wf = wf[0]
    if wf.ndim == 1:
        wf = wf[None]
    if wf.shape[0] == 1:
        wf = np.repeat(wf, 2, axis=0)
    rate = int(audio["sample_rate"])
    if rate < AAC_MIN_RATE:
        # AAC cannot carry such a low rate (only the tiny test model makes one): resampled, said once per process
        wf = resample_audio(wf, rate, AAC_FALLBACK_RATE)
        if rate not in _SAID:
            _SAID.add(rate)
            log.info("audio at %d Hz (tiny-random's rate) is written at %d Hz: AAC carries no lower rate", rate,
                     AAC_FALLBACK_RATE)
        rate = AAC_FALLBACK_RATE
    return np.ascontiguousarray(np.clip(wf, -1.0, 1.0), dtype=np.float32), rate


_SAID: set[int] = set()


def resample_audio(waveform: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``[channels, samples]`` float audio (mono or stereo) from ``rate`` to ``target`` Hz with FFmpeg's resampler
    (PyAV), the library the pack writes its MP4s with."""
    import av  # noqa: PLC0415 - PyAV loads when audio is resampled or written, not when ComfyUI loads the pack

    wf = np.ascontiguousarray(waveform, dtype=np.float32)
    if rate == target:
        return wf
    if wf.ndim != 2 or wf.shape[0] not in (1, 2):
        raise ValueError(f"audio has shape {wf.shape}; expected [1 or 2 channels, samples].")
    layout = "stereo" if wf.shape[0] == 2 else "mono"
    frame = av.AudioFrame.from_ndarray(wf, format="fltp", layout=layout)
    frame.sample_rate = int(rate)
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=int(target))
    parts = [f.to_ndarray() for f in (*resampler.resample(frame), *resampler.resample(None))]
    return np.concatenate(parts, axis=1).astype(np.float32) if parts else np.zeros((wf.shape[0], 0), np.float32)


def write_mp4(path: pathlib.Path, images, audio, fps: int, metadata: dict | None = None) -> pathlib.Path:
    import av  # noqa: PLC0415 - PyAV loads when a video is written, not when ComfyUI loads the pack

    frames = _frames(images)
    wf, rate = _audio_planar(audio)
    f, h, w, _ = frames.shape
    if h % 2 or w % 2:
        frames = frames[:, : h - h % 2, : w - w % 2]
        f, h, w, _ = frames.shape
    with av.open(str(path), mode="w", options={"movflags": "use_metadata_tags"}) as container:
        for key, value in (metadata or {}).items():
            container.metadata[key] = value if isinstance(value, str) else json.dumps(value)
        vs = container.add_stream("libx264", rate=int(fps), options={"crf": "18", "preset": "veryfast"})
        vs.width, vs.height, vs.pix_fmt = w, h, "yuv420p"
        as_ = container.add_stream("aac", rate=rate, layout="stereo")
        for i in range(f):
            frame = av.VideoFrame.from_ndarray(_uint8(frames[i]), format="rgb24")
            frame.pts = i
            for pkt in vs.encode(frame):
                container.mux(pkt)
        for pkt in vs.encode():
            container.mux(pkt)
        chunk = 1024
        for start in range(0, wf.shape[1], chunk):
            part = np.ascontiguousarray(wf[:, start:start + chunk])
            aframe = av.AudioFrame.from_ndarray(part, format="fltp", layout="stereo")
            aframe.sample_rate = rate
            aframe.pts = start
            for pkt in as_.encode(aframe):
                container.mux(pkt)
        for pkt in as_.encode():
            container.mux(pkt)
    return path
