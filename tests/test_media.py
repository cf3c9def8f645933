"""Audio resampling with PyAV (a reference voice onto the audio VAE's rate, tiny-random's 160 Hz into AAC)."""

from __future__ import annotations

import numpy as np
import pytest

from comfy_h3_nodes.engine.media import resample_audio


def _tone(rate: int, hz: float = 440.0, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.stack([np.sin(2 * np.pi * hz * t), 0.5 * np.sin(2 * np.pi * hz * t)]).astype(np.float32)


@pytest.mark.parametrize("rate, target", [(32000, 16000), (44100, 32000), (160, 16000)])
def test_resample_keeps_length_pitch_and_channels(rate, target):
    hz = min(440.0, rate / 8)
    out = resample_audio(_tone(rate, hz), rate, target)
    assert out.dtype == np.float32 and out.shape[0] == 2 and abs(out.shape[1] - target) <= 2
    spectrum = np.abs(np.fft.rfft(out[0, target // 10: -target // 10]))
    peak = np.argmax(spectrum) * target / (2 * (len(spectrum) - 1))
    assert abs(peak - hz) < 0.02 * hz + 2
    assert np.allclose(out[1, target // 10: -target // 10], 0.5 * out[0, target // 10: -target // 10], atol=1e-3)


def test_resample_mono_same_rate_and_bad_shape():
    mono = _tone(32000)[:1]
    assert resample_audio(mono, 32000, 32000) is not None and resample_audio(mono, 32000, 32000).shape == mono.shape
    assert resample_audio(mono, 32000, 16000).shape[0] == 1
    with pytest.raises(ValueError, match=r"expected \[1 or 2 channels, samples\]"):
        resample_audio(np.zeros((3, 100), np.float32), 32000, 16000)


# ---------------------------------------------------------------------------------------------------- MP4 frames
def test_mp4_frames_become_8_bit_one_at_a_time(tmp_path):
    """The video is made 8-bit frame by frame as it is encoded (the whole video at once held three float copies of
    it: 2 s and 1 GB for 124 frames of 640x384): the same values as clipping, scaling and rounding the whole video,
    and no float copy of the whole video while the MP4 is written."""
    import tracemalloc

    import av
    import torch

    from comfy_h3_nodes.engine.media import _uint8, write_mp4

    g = np.random.default_rng(0)
    ramp = np.linspace(-0.2, 1.2, 128, dtype=np.float32)  # smooth (H.264 keeps it), out of range at both ends
    video = (ramp[None, None, :, None] + np.arange(24, dtype=np.float32)[:, None, None, None] / 100
             + g.normal(0, 0.002, size=(24, 96, 128, 3))).astype(np.float32)
    video[0, 0, :8, 0] = [0.5 / 255, 1.5 / 255, 254.5 / 255, 0.0, 1.0, -1.0, 2.0, 0.49999]
    whole = np.round(np.clip(video, 0.0, 1.0) * 255.0).astype(np.uint8)
    assert np.array_equal(np.stack([_uint8(f) for f in video]), whole)
    assert np.array_equal(np.stack([_uint8(f) for f in torch.from_numpy(video).to(torch.bfloat16)]),
                          np.round(np.clip(torch.from_numpy(video).to(torch.bfloat16).float().numpy(), 0, 1) * 255)
                          .astype(np.uint8))  # bf16 frames (NumPy has no bf16) go through float32
    audio = {"waveform": np.zeros((2, 4000), np.float32), "sample_rate": 16000}
    tracemalloc.start()
    try:
        write_mp4(tmp_path / "v.mp4", video, audio, 24)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < video.nbytes / 4, (peak, video.nbytes)
    with av.open(str(tmp_path / "v.mp4")) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 24 and frames[5].shape == (96, 128, 3)
    assert np.abs(frames[5].astype(int) - whole[5]).mean() < 3  # H.264 at crf 18: near, not equal
    with pytest.raises(ValueError, match=r"images have shape \(24, 96, 128\); expected \[frames, H, W, 3\]"):
        write_mp4(tmp_path / "w.mp4", video[..., 0], audio, 24)


def test_decoded_frames_are_diffusers_np_frames():
    """A takes diffusers' ``pt`` video and lays out the frames itself: the same array as diffusers' ``np`` output."""
    import torch
    from diffusers.video_processor import VideoProcessor

    from comfy_h3_nodes.engine.a_side.side import frames_hwc

    video = torch.rand(1, 3, 9, 16, 24)  # (1, C, F, H, W) as the decode block's pixels before postprocess_video
    vp = VideoProcessor(vae_scale_factor=16, do_normalize=False)
    want = vp.postprocess_video(video, output_type="np")[0]
    got = frames_hwc(vp.postprocess_video(video, output_type="pt"))
    assert got.shape == (9, 16, 24, 3) and got.dtype == np.float32 and got.flags["C_CONTIGUOUS"]
    assert np.array_equal(got, want)
