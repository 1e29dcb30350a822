"""Magpie voice cloning from a reference clip, as NeMo 3.0.0's inference does it for a decoder_ce
checkpoint that keeps its context encoder (one without baked speakers):

    clip -> mono, resampled to the codec's rate -> a fixed-length context window (tiled when short)
    -> NanoCodec encoder + FSQ -> codes -> context BOS / EOS -> audio embeddings -> context encoder
    -> the speaker context, which the generation loop prepends to the decoder input exactly like a
       baked speaker's rows (stream_codes / generate_codes take it as `speaker`).

docs/magpie.md section 1.4 lists the NeMo facts this follows and where metalgen departs from them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Tuple, Union

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from ..tts.audio import read_reference
from .codec_file import load_encoder

ClipInput = Union[str, Path, np.ndarray, Tuple[np.ndarray, int]]

# NeMo's inference runner fixes the context at 5 s when the configured range straddles 5 s.
NEMO_FIXED_CONTEXT = 5.0


def context_seconds(context_duration: Tuple[float, float], available: float) -> float:
    """The context length NeMo's inference cuts from a clip of `available` seconds, given the
    checkpoint's (context_duration_min, context_duration_max). With min == max (the published
    configs) this is NeMo's value. With min < max NeMo draws uniformly from [min, the clip's length
    clamped to [min, max]]; metalgen takes the top of that range, to keep as much of the clip as
    allowed, deterministically."""
    lo, hi = context_duration
    if lo < NEMO_FIXED_CONTEXT < hi:
        lo = hi = NEMO_FIXED_CONTEXT
    return max(lo, min(hi, available))


def context_window(wav: np.ndarray, seconds: float, sample_rate: int, samples_per_frame: int) -> np.ndarray:
    """What NeMo's dataset feeds the codec for a context of `seconds`: a whole number of codec frames
    of audio, the clip repeated end to end when it is shorter. For a longer clip NeMo takes a window
    at a random offset; metalgen takes the first one, so the same clip always gives the same voice."""
    n = int(seconds * sample_rate / samples_per_frame) * samples_per_frame
    if n <= 0:
        raise MetalgenError(f"the checkpoint's context of {seconds:g} s is shorter than one codec frame")
    if n <= len(wav):
        return wav[:n]
    return np.tile(wav, math.ceil(n / len(wav)))[:n]


def _clip_seconds(audio: ClipInput, sample_rate: Optional[int], target_sr: int) -> Optional[float]:
    """The clip's length in seconds before reading it in full, or None when it cannot be told (then
    read_reference raises its own error for an unreadable file)."""
    if isinstance(audio, (str, Path)):
        try:
            import soundfile as sf

            info = sf.info(str(Path(audio).expanduser()))
            return info.frames / info.samplerate if info.samplerate > 0 else None
        except Exception:
            return None
    wav, sr = audio if isinstance(audio, tuple) else (audio, sample_rate or target_sr)
    wav = np.asarray(wav)
    if int(sr) <= 0 or wav.ndim not in (1, 2):
        return None
    return wav.shape[0] / int(sr)


def reference_context(
    model,
    codec,
    audio: ClipInput,
    sample_rate: Optional[int] = None,
    min_seconds: float = 1.0,
) -> mx.array:
    """The speaker context (1, T_ctx, d) of a reference clip, for `stream_codes` / `generate_codes`'s
    `speaker` argument in place of a baked speaker index.

    `model`: metalgen.models.magpie.model.Model of a checkpoint with a context encoder (no baked
    speakers). `codec`: its NanoCodec (metalgen.magpie.codec_file.load_codec); the encoder's weights
    are read from the codec's file here when it was loaded without them. `audio`: a path to an audio
    file (anything soundfile reads; channels are averaged), a float array (mono (N,) or (N,
    channels)) at `sample_rate` (None: already at the codec's rate), or an (array, sample_rate)
    pair. The clip is resampled to the codec's rate, cut to the checkpoint's context length (the
    first window; a shorter clip is repeated, as NeMo does: see `context_window`), encoded to codes,
    and run through the context encoder.

    Raises a one-line MetalgenError for a checkpoint without a context encoder (the published one
    bakes its speakers), and for a clip that is missing, unreadable, empty, silent, or shorter than
    `min_seconds` (or than the context, when that is shorter)."""
    a = model.args
    if "context_encoder" not in model:
        if a.n_speakers:
            raise MetalgenError(
                "voice cloning needs a Magpie checkpoint with a context encoder; this one has only baked "
                f"speakers: use one of its {a.n_speakers} (speaker=0..{a.n_speakers - 1} or a speaker name)"
            )
        raise MetalgenError("this Magpie checkpoint has no context encoder, so it cannot clone a voice")
    c = codec.args
    if (c.num_codebooks, c.codebook_size) != (a.num_codebooks, a.codebook_size):
        raise MetalgenError(
            f"the codec has {c.num_codebooks} codebooks of {c.codebook_size} codes, the Magpie checkpoint "
            f"expects {a.num_codebooks} of {a.codebook_size}"
        )
    sr, spf = int(c.sample_rate), int(c.samples_per_frame)

    name = f"reference clip {audio}" if isinstance(audio, (str, Path)) else "the reference clip"
    minimum = min(float(min_seconds), max(a.context_duration))
    seconds = _clip_seconds(audio, sample_rate, sr)
    if seconds is not None and seconds < minimum:
        raise MetalgenError(f"{name} is too short: {seconds:.2f} s, the minimum is {minimum:g} s")
    if isinstance(audio, (str, Path, tuple)):
        wav = read_reference(audio, sr)
    else:
        wav = read_reference((np.asarray(audio, dtype=np.float32), int(sample_rate or sr)), sr)

    window = context_window(wav, context_seconds(a.context_duration, len(wav) / sr), sr, spf)
    load_encoder(codec)
    codes = codec.encode(mx.array(window[None]))  # (1, C, frames)

    rows = None
    if a.text_conditioning:
        # NeMo pads the audio context rows with zeros to the padded "no text context" length
        # (int(max seconds * rate / spf) + 2 tokens for decoder_ce), then keeps as many rows as there
        # are context codes (frames + BOS + EOS, before frame stacking), all of them valid.
        hi = context_seconds(a.context_duration, float("inf"))
        codes_len = codes.shape[2] + 2
        stacked = -(-codes_len // a.frame_stacking_factor)
        rows = min(max(stacked, int(hi * sr / spf) + 2), codes_len)
    ctx = model.encode_context(codes, rows)  # (1, T_ctx, d)
    mx.eval(ctx)
    return ctx
