"""Qwen3-TTS checkpoints from a folder or a hub id, in their published layout:

    config.json              model_type qwen3_tts, talker_config, speaker_encoder_config,
                             tts_model_type (custom_voice | voice_design | base), tts_model_size
    model.safetensors        talker.* (+ speaker_encoder.* for base)
    generation_config.json   sampling defaults (do_sample, top_k, temperature, subtalker_*...)
    vocab.json, merges.txt, tokenizer_config.json (or tokenizer.json)   the Qwen text tokenizer
    speech_tokenizer/        the 12 Hz tokenizer: config.json, model.safetensors

Loading is strict, through the same checks as the text models (metalgen.loading).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import mlx.core as mx

from ..errors import MetalgenError
from ..loading import (
    load_tokenizer,
    load_weights_strict,
    parse_dtype,
    read_json,
    resolve_model_path,
)
from ..models.qwen3_tts import Model, SpeechTokenizer, SpeechTokenizerArgs, TTSArgs


def load_parts(folder: Path, dtype=None, with_encoder: Optional[bool] = None):
    """(model, speech_tokenizer, text_tokenizer, generate_config) from a checkpoint folder."""
    config = read_json(folder / "config.json", "config.json")
    args = TTSArgs.from_dict(config)
    dtype = parse_dtype(dtype)
    model = Model(args)
    load_weights_strict(model, folder, dtype)

    st_folder = folder / "speech_tokenizer"
    if not (st_folder / "config.json").exists():
        raise MetalgenError(f"{folder} has no speech_tokenizer/config.json (the 12 Hz speech tokenizer)")
    st_args = SpeechTokenizerArgs.from_dict(read_json(st_folder / "config.json", "speech tokenizer config"))
    if with_encoder is None:
        with_encoder = args.tts_model_type == "base"
    speech = SpeechTokenizer(st_args, with_encoder=with_encoder)
    # The speech decoder runs in float32 unless asked otherwise: its output is audio.
    load_weights_strict(speech, st_folder, dtype if dtype is not None else mx.float32)

    gen_path = folder / "generation_config.json"
    generate_config = read_json(gen_path, "generation_config.json") if gen_path.exists() else {}
    tokenizer = load_tokenizer(folder)
    return model, speech, tokenizer, generate_config


def resolve(path_or_id: str, revision: Optional[str] = None) -> Path:
    return resolve_model_path(path_or_id, revision)
