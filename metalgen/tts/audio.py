"""Reading reference clips and writing WAV files (soundfile)."""

from __future__ import annotations

from math import gcd
from pathlib import Path
from typing import Tuple, Union

import numpy as np

from ..errors import MetalgenError

AudioInput = Union[str, Path, Tuple[np.ndarray, int]]


def resample(wav: np.ndarray, sr: int, target: int) -> np.ndarray:
    """Polyphase resampling (scipy when present, else linear interpolation)."""
    if sr == target:
        return wav.astype(np.float32)
    try:
        from scipy.signal import resample_poly

        g = gcd(int(sr), int(target))
        return resample_poly(wav, target // g, sr // g).astype(np.float32)
    except ImportError:  # pragma: no cover - scipy is normally there
        n = int(round(len(wav) * target / sr))
        x = np.linspace(0, len(wav) - 1, n)
        return np.interp(x, np.arange(len(wav)), wav).astype(np.float32)


def read_reference(audio: AudioInput, target_sr: int) -> np.ndarray:
    """A mono float32 clip at `target_sr` from a path or (array, sample_rate); one-line errors
    for a missing, unreadable, empty or silent clip."""
    if isinstance(audio, tuple):
        wav, sr = audio
        wav = np.asarray(wav, dtype=np.float32)
        name = "the reference clip"
    else:
        path = Path(audio).expanduser()
        name = f"reference clip {path}"
        if not path.exists():
            raise MetalgenError(f"{name} does not exist")
        try:
            import soundfile as sf

            wav, sr = sf.read(str(path), dtype="float32", always_2d=False)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MetalgenError(f"could not read {name}: {first}")
    if wav.ndim == 2:
        wav = wav.mean(axis=1)
    if wav.ndim != 1 or wav.size == 0:
        raise MetalgenError(f"{name} holds no audio")
    if not np.all(np.isfinite(wav)):
        raise MetalgenError(f"{name} contains NaN or infinite samples")
    if float(np.max(np.abs(wav))) < 1e-4:
        raise MetalgenError(f"{name} is silent")
    if int(sr) <= 0:
        raise MetalgenError(f"{name} has an invalid sample rate {sr}")
    wav = resample(wav, int(sr), int(target_sr))
    if wav.size < target_sr // 10:
        raise MetalgenError(f"{name} is too short (under 0.1 s)")
    return wav


def write_wav(path: Union[str, Path], wav: np.ndarray, sample_rate: int) -> None:
    import soundfile as sf

    try:
        sf.write(str(path), np.asarray(wav, dtype=np.float32), int(sample_rate), subtype="PCM_16")
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MetalgenError(f"could not write {path}: {first}")
