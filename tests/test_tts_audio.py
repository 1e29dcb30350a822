"""metalgen.tts.audio.resample: band-limited, accurate, no aliasing."""

from __future__ import annotations

import numpy as np
import pytest

from metalgen.tts.audio import resample


def tones(t):
    return np.sin(2 * np.pi * 440 * t) + 0.3 * np.sin(2 * np.pi * 3000 * t)


@pytest.mark.parametrize("sr", [8000, 16000, 44100, 48000])
def test_tones_survive_resampling_to_24k(sr):
    wav = tones(np.arange(2 * sr) / sr)
    out = resample(wav, sr, 24000)
    assert out.dtype == np.float32 and len(out) == 48000
    ref = tones(np.arange(48000) / 24000)
    inner = slice(2400, -2400)  # away from the edges, where the kernel sees zeros
    assert np.abs(out[inner] - ref[inner]).max() < 1e-3


def test_content_above_the_new_nyquist_is_removed():
    wav = np.sin(2 * np.pi * 20000 * np.arange(48000) / 48000)
    assert np.abs(resample(wav, 48000, 24000)[2400:-2400]).max() < 1e-3


def test_same_rate_is_identity():
    wav = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    np.testing.assert_array_equal(resample(wav, 24000, 24000), wav)
