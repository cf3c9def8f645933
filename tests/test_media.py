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
