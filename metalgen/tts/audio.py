"""Reading reference clips and writing WAV files (soundfile)."""

from __future__ import annotations

from pathlib import Path
from typing import Tuple, Union

import numpy as np

from ..errors import MetalgenError

AudioInput = Union[str, Path, Tuple[np.ndarray, int]]


def resample(wav: np.ndarray, sr: int, target: int, zeros: int = 16, beta: float = 8.6) -> np.ndarray:
    """Band-limited resampling by a Kaiser-windowed sinc (the method of the usual audio
    resamplers), written here so that the engine needs no scipy or librosa.

    Each output sample sums the input samples within `zeros` zero crossings of the
    low-pass kernel, whose cut-off is the lower of the two Nyquist frequencies (so downsampling
    does not alias). Returns float32.
    """
    if sr == target:
        return np.asarray(wav, dtype=np.float32)
    wav = np.asarray(wav, dtype=np.float64)
    ratio = target / sr
    cutoff = min(1.0, ratio)  # in units of the input Nyquist frequency
    width = int(np.ceil(zeros / cutoff))  # kernel half-width in input samples
    offsets = np.arange(-width + 1, width + 1)
    n_out = int(round(len(wav) * ratio))
    out = np.empty(n_out, dtype=np.float64)
    block = max(1, (1 << 22) // (2 * width))  # bounds the (outputs x taps) temporaries
    for start in range(0, n_out, block):
        t = np.arange(start, min(start + block, n_out)) / ratio  # output times, input samples
        idx = np.floor(t).astype(np.int64)[:, None] + offsets[None, :]
        x = t[:, None] - idx
        window = np.i0(beta * np.sqrt(np.clip(1.0 - (x / width) ** 2, 0.0, 1.0))) / np.i0(beta)
        kernel = cutoff * np.sinc(cutoff * x) * window
        inside = (idx >= 0) & (idx < len(wav))
        samples = np.where(inside, wav[np.clip(idx, 0, len(wav) - 1)], 0.0)
        out[start : start + len(t)] = (samples * kernel).sum(axis=1)
    return out.astype(np.float32)


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
