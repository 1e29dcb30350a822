"""Voice cloning for the Base model type: a reference clip -> its speaker embedding (ECAPA-TDNN
over log-mel frames) and, for cloning in context, its codes (the speech tokenizer's encoder)."""

from __future__ import annotations

from typing import Optional, Tuple

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from ..models.qwen3_tts.speaker_encoder import log_mel
from .audio import AudioInput, read_reference


def speaker_embedding(model, wav: np.ndarray) -> mx.array:
    """(hidden,) speaker embedding of a clip already at the speaker encoder's sample rate."""
    enc = model.speaker_encoder
    mel = log_mel(wav, sr=enc.args.sample_rate, n_mels=enc.args.mel_dim, fmax=enc.args.sample_rate / 2)
    return enc(mx.array(mel[None]))[0]


def encode_codes(speech, wav: np.ndarray) -> np.ndarray:
    """(frames, 16) codes of a clip at the speech tokenizer's input sample rate."""
    if "encoder" not in speech:
        raise MetalgenError("this checkpoint's speech tokenizer was loaded without its encoder")
    return np.array(speech.encoder(mx.array(wav[None].astype(np.float32)))[0]).astype(np.int32)


def reference_prompt(tts, ref_audio: AudioInput, with_codes: bool) -> Tuple[mx.array, Optional[np.ndarray]]:
    model = tts.model
    if "speaker_encoder" not in model:
        raise MetalgenError(f"this {tts.model_type} checkpoint has no speaker encoder; voice cloning needs a Base model")
    sr = int(model.args.speaker_encoder.sample_rate)
    wav = read_reference(ref_audio, sr)
    embed = speaker_embedding(model, wav)
    codes = None
    if with_codes:
        in_sr = int(tts.speech.args.input_sample_rate)
        codes = encode_codes(tts.speech, wav if in_sr == sr else read_reference(ref_audio, in_sr))
    return embed, codes
