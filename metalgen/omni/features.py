"""Qwen3-Omni's audio input: a clip -> 16 kHz mono -> the 128-bin log-mel frames its audio encoder reads.

The features are those of transformers' `WhisperFeatureExtractor` as Qwen3-Omni's processor
calls it (128 mel bins, 16 kHz, n_fft 400, hop 160, padding to the longest clip of the call, no
truncation, an attention mask over the frames), in numpy:

    wav (L,) -> reflect-pad 200 each side -> periodic Hann frames of 400 every 160 samples
    -> |rfft|^2 (201 bins) -> Slaney mel filters (128) -> log10(max(., 1e-10))
    -> the last STFT frame dropped (L // 160 frames remain) -> max(., max - 8) -> (x + 4) / 4

The encoder receives only the frames the processor's `feature_attention_mask` marks valid. For
one clip there is no padding, so those are all L // 160 frames, and the clamp's maximum is the
clip's own. (A clip padded in a batch beside a longer one gets different last frames: its STFT
windows at the end see zeros instead of the reflected signal. Running clips one at a time, as
here, is what the model sees when it is given a single clip.)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ..errors import MetalgenError
from ..tts.audio import resample

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 128
# Whisper's dynamic range: everything more than 8 decades (80 dB) under the loudest bin is clamped.
LOG_RANGE = 8.0
MEL_FLOOR = 1e-10
# frames per rfft batch in log_mel: bounds the complex temporaries of an hour-long clip
_BLOCK = 4096


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = 3.0 * hz / 200.0
    # 27 mels per factor 6.4 above 1 kHz, which joins the linear part at 15 mels
    log = 15.0 + np.log(np.maximum(hz, 1e-300) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(hz >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    """The inverse of `_hz_to_mel`."""
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 * mel / 3.0
    log = 1000.0 * np.exp((mel - 15.0) * (np.log(6.4) / 27.0))
    return np.where(mel >= 15.0, log, linear)


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The (n_fft // 2 + 1, n_mels) Slaney filter bank (Slaney mel scale, Slaney area norm) from
    0 Hz to 8 kHz, float64: triangles between consecutive points spaced evenly in mels, each
    scaled by 2 / its width in Hz so that every filter carries about the same energy."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), n_mels + 2))  # (n_mels + 2,)
    bins = np.linspace(0.0, sample_rate // 2, n_fft // 2 + 1)  # centre frequency of each rfft bin
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bins[:, None] - lower[None, :]) / (centre - lower)[None, :]
    falling = (upper[None, :] - bins[:, None]) / (upper - centre)[None, :]
    tri = np.maximum(0.0, np.minimum(rising, falling))  # (bins, n_mels)
    out = tri * (2.0 / (upper - lower))[None, :]
    out.flags.writeable = False  # cached and shared between calls
    return out


@functools.lru_cache(maxsize=4)
def _hann(n: int) -> np.ndarray:
    """The periodic Hann window (as torch.hann_window and the extractor's numpy path use)."""
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)
    w.flags.writeable = False
    return w


def log_mel(wav: np.ndarray) -> np.ndarray:
    """The log-mel features Qwen3-Omni's audio encoder receives for one clip.

    wav: float mono samples at 16 kHz (`load_audio_16k` makes them). Returns (128, len(wav) // 160)
    float32: exactly the frames the processor's feature_attention_mask keeps. Raises MetalgenError
    for a clip that is not 1-D, holds non-finite samples or is shorter than one hop (10 ms).
    """
    wav = np.asarray(wav)
    if wav.ndim != 1:
        raise MetalgenError(f"log_mel takes mono samples (1-D), got shape {wav.shape}; use load_audio_16k")
    if wav.dtype.kind != "f":
        raise MetalgenError(f"log_mel takes float samples in [-1, 1], got dtype {wav.dtype}; use load_audio_16k")
    frames = wav.shape[0] // HOP
    if frames == 0:
        raise MetalgenError(f"audio clip too short: {wav.shape[0]} samples, at least {HOP} (10 ms at 16 kHz) needed")
    wav = wav.astype(np.float64)
    if not np.all(np.isfinite(wav)):
        raise MetalgenError("audio clip contains NaN or infinite samples")

    # STFT centred on t * hop: half a window of reflection each side. The STFT has frames + 1
    # columns; the extractor drops the last, so only the first `frames` windows are taken.
    half = N_FFT // 2
    padded = np.pad(wav, (half, half), mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:frames]  # (frames, 400) view
    filters = mel_filters()
    window = _hann(N_FFT)
    mel = np.empty((N_MELS, frames), dtype=np.float64)
    for start in range(0, frames, _BLOCK):
        spec = np.fft.rfft(windows[start : start + _BLOCK] * window, axis=-1)  # (block, 201)
        power = spec.real**2 + spec.imag**2
        mel[:, start : start + _BLOCK] = filters.T @ power.T  # (128, 201) @ (201, block)
    log = np.log10(np.maximum(mel, MEL_FLOOR))
    log = np.maximum(log, log.max() - LOG_RANGE)  # the clip's own maximum: over the kept frames only
    return ((log + 4.0) / 4.0).astype(np.float32)


def audio_token_count(frames: int, n_window: int = 50) -> int:
    """The number of audio tokens (encoder outputs) for `frames` mel frames.

    The encoder cuts the frames into chunks of 2 * n_window and halves each chunk three times
    (stride-2 convolutions, length -> (length - 1) // 2 + 1); the tokens are the sum over the
    chunks. This equals transformers' `_get_feat_extract_output_lengths` for the published
    n_window = 50 (which hard-codes 13 tokens a full chunk; for any other n_window that formula
    and its own encoder disagree, and this counts what the encoder yields).
    """
    frames = int(frames)
    chunk = 2 * n_window
    return (frames // chunk) * conv_output_length(chunk) + conv_output_length(frames % chunk)


def conv_output_length(length: int) -> int:
    """Frames left after the encoder's three 3x3 stride-2 convolutions (padding 1) of `length`
    frames; 0 for 0."""
    for _ in range(3):
        length = (length - 1) // 2 + 1 if length > 0 else 0
    return length


def load_audio_16k(path_or_array: Union[str, Path, np.ndarray], sample_rate: Optional[int] = None) -> np.ndarray:
    """A mono float32 clip at 16 kHz, from an audio file (anything soundfile reads: WAV, FLAC,
    OGG...) or an array.

    For an array, `sample_rate` is its rate (None: already 16 kHz); a 2-D array is (samples,
    channels) or (channels, samples), the shorter axis taken as the channels. Integer samples are
    scaled to [-1, 1). For a file, its own rate is used and `sample_rate` is ignored. Channels
    are averaged; the rate is changed with metalgen.tts.audio.resample. Raises MetalgenError
    (one line) for a missing or unreadable file, an empty clip or non-finite samples.
    """
    if isinstance(path_or_array, (str, Path)):
        path = Path(path_or_array).expanduser()
        name = f"audio file {path}"
        if not path.is_file():
            raise MetalgenError(f"{name} does not exist")
        try:
            import soundfile as sf

            wav, sr = sf.read(str(path), dtype="float32", always_2d=True)  # (samples, channels)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MetalgenError(f"could not read {name}: {first}")
    else:
        name = "the audio clip"
        wav = np.asarray(path_or_array)
        sr = SAMPLE_RATE if sample_rate is None else sample_rate
        # PCM integers: full scale -> [-1, 1) (unsigned PCM is centred on half its range)
        if wav.dtype.kind == "i":
            wav = wav.astype(np.float64) / (np.iinfo(wav.dtype).max + 1)
        elif wav.dtype.kind == "u":
            half = (np.iinfo(wav.dtype).max + 1) / 2
            wav = (wav.astype(np.float64) - half) / half
        elif wav.dtype.kind != "f":
            raise MetalgenError(f"{name} must hold real numbers, got dtype {wav.dtype}")
        if wav.ndim == 2 and wav.shape[0] < wav.shape[1]:
            wav = wav.T  # (channels, samples) -> (samples, channels)
        elif wav.ndim not in (1, 2):
            raise MetalgenError(f"{name} must be 1-D (mono) or 2-D (channels), got shape {wav.shape}")
    if int(sr) <= 0:
        raise MetalgenError(f"{name} has an invalid sample rate {sr}")
    if wav.ndim == 2:
        wav = wav.mean(axis=1)
    if wav.size == 0:
        raise MetalgenError(f"{name} holds no audio")
    if not np.all(np.isfinite(wav)):
        raise MetalgenError(f"{name} contains NaN or infinite samples")
    return resample(np.asarray(wav, dtype=np.float32), int(sr), SAMPLE_RATE)
