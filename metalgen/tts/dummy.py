"""`dummy:qwen3-tts-*`: Qwen3-TTS architectures with seeded random weights, made in memory.

Real shapes (the published 12 Hz checkpoints' config.json and speech_tokenizer/config.json)
for the offline demo and benchmarks; `qwen3-tts-tiny` for tests. The text tokenizer is the
Qwen tokenizer shipped in metalgen/assets. The speech is noise: the weights are random.
"""

from __future__ import annotations

from typing import Any, Dict

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..dummy import tokenizer_folder
from ..errors import MetalgenError
from ..loading import parse_dtype

CODEC_IDS = dict(
    codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
    codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
)
# The published speakers; their ids (and the dialects' language ids) are placeholders in the
# codec's control range (2048..3071). The ten languages' ids are the published ones.
SPEAKERS = ["vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee"]
DIALECT = {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}
LANGUAGE_IDS = {"english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055, "japanese": 2058,
                "french": 2061, "korean": 2064, "russian": 2069, "italian": 2070, "portuguese": 2071,
                "beijing_dialect": 2074, "sichuan_dialect": 2075}


def _talker(hidden, inter, layers=28, heads=16, kv=8, head_dim=128, text_hidden=2048, section=(24, 20, 20),
            cp_hidden=1024, cp_inter=3072, cp_layers=5, cp_heads=16, cp_kv=8, cp_head_dim=128, text_vocab=151936):
    return dict(
        hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, vocab_size=3072, rms_norm_eps=1e-6,
        rope_theta=1000000.0, max_position_embeddings=32768, hidden_act="silu",
        rope_scaling={"rope_type": "default", "mrope_section": list(section), "interleaved": True},
        num_code_groups=16, text_hidden_size=text_hidden, text_vocab_size=text_vocab,
        spk_id={name: 3000 + i for i, name in enumerate(SPEAKERS)},
        spk_is_dialect={name: DIALECT.get(name, False) for name in SPEAKERS},
        codec_language_id=dict(LANGUAGE_IDS),
        code_predictor_config=dict(
            hidden_size=cp_hidden, intermediate_size=cp_inter, num_hidden_layers=cp_layers,
            num_attention_heads=cp_heads, num_key_value_heads=cp_kv, head_dim=cp_head_dim, vocab_size=2048,
            rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=65536, num_code_groups=16,
        ),
        **CODEC_IDS,
    )


SPEECH_DECODER_12HZ = dict(
    codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024, intermediate_size=1024,
    num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16, head_dim=64, sliding_window=72,
    rms_norm_eps=1e-5, rope_theta=10000, max_position_embeddings=8000, num_quantizers=16,
    upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=1536,
)
SPEECH_DECODER_TINY = dict(
    codebook_size=2048, codebook_dim=16, hidden_size=32, latent_dim=32, intermediate_size=64,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, sliding_window=8,
    rms_norm_eps=1e-5, rope_theta=10000, max_position_embeddings=8000, num_quantizers=16,
    upsample_rates=[5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=32,
)


def _shape(talker, size, decoder, kind="custom_voice"):
    return dict(
        config=dict(model_type="qwen3_tts", tts_model_type=kind, tts_model_size=size,
                    tokenizer_type="qwen3_tts_tokenizer_12hz", talker_config=talker,
                    speaker_encoder_config=dict(enc_dim=talker["hidden_size"])),
        speech=dict(model_type="qwen3_tts_tokenizer_12hz", decoder_config=decoder,
                    output_sample_rate=24000, input_sample_rate=24000),
    )


SHAPES: Dict[str, Dict[str, Any]] = {
    "qwen3-tts-0.6b": _shape(_talker(1024, 3072), "0b6", SPEECH_DECODER_12HZ),
    "qwen3-tts-1.7b": _shape(_talker(2048, 6144), "1b7", SPEECH_DECODER_12HZ),
    "qwen3-tts-1.7b-voicedesign": _shape(_talker(2048, 6144), "1b7", SPEECH_DECODER_12HZ, "voice_design"),
    # Small enough for tests (the 12 Hz frame: 5*4*3*2*2 = 240 samples at 24 kHz would be 100 Hz,
    # so the tiny decoder's sample rate is 3 kHz: 240 samples a frame, 12.5 frames a second).
    "qwen3-tts-tiny": _shape(
        _talker(64, 96, layers=2, heads=4, kv=2, head_dim=32, text_hidden=32, section=(8, 4, 4), cp_hidden=48,
                cp_inter=64, cp_layers=2, cp_heads=4, cp_kv=2, cp_head_dim=16),
        "1b7", SPEECH_DECODER_TINY,
    ),
}
SHAPES["qwen3-tts-tiny"]["speech"].update(output_sample_rate=3000, input_sample_rate=3000)
SHAPES["qwen3-tts-tiny"]["speech_std"] = 0.08  # audible rather than ~1e-7
SHAPES["qwen3-tts-tiny-voicedesign"] = {**SHAPES["qwen3-tts-tiny"], "config": {
    **SHAPES["qwen3-tts-tiny"]["config"], "tts_model_type": "voice_design"}}
SHAPES["qwen3-tts-tiny-base"] = {
    **SHAPES["qwen3-tts-tiny"],
    "config": {**SHAPES["qwen3-tts-tiny"]["config"], "tts_model_type": "base",
               "talker_config": {**SHAPES["qwen3-tts-tiny"]["config"]["talker_config"], "spk_id": {},
                                 "spk_is_dialect": {}},
               "speaker_encoder_config": dict(mel_dim=128, enc_dim=64, enc_channels=[32, 32, 32, 32, 96],
                                              enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                                              enc_attention_channels=16, enc_res2net_scale=4,
                                              enc_se_channels=16, sample_rate=3000)},
    "speech": {**SHAPES["qwen3-tts-tiny"]["speech"], "encode_downsample_rate": 240, "encoder_config": dict(
        sampling_rate=3000, frame_rate=12.5, hidden_size=32, num_filters=4, upsampling_ratios=[4, 3, 2],
        codebook_size=2048, codebook_dim=16, vector_quantization_hidden_dimension=16, num_quantizers=16,
        num_hidden_layers=1, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=16)},
}
SHAPES["qwen3-tts-tiny-0b6"] = {**SHAPES["qwen3-tts-tiny"], "config": {
    **SHAPES["qwen3-tts-tiny"]["config"], "tts_model_size": "0b6"}}

# Sampling defaults as the published generation_config.json, with a short frame limit: random
# weights almost never draw the codec EOS.
DUMMY_GENERATE_CONFIG = dict(
    do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05, subtalker_dosample=True,
    subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9, max_new_tokens=48,
)


_BLOCK = 1 << 20


def _normal(shape, key) -> mx.array:
    """N(0, 1) of `shape`; past a million entries a seeded million-entry block is tiled (drawing
    hundreds of millions of normals on the CPU takes a minute; a dummy needs no more entropy)."""
    n = 1
    for d in shape:
        n *= int(d)
    if n <= _BLOCK:
        return mx.random.normal(shape, key=key)
    block = mx.random.normal((_BLOCK + 7,), key=key)  # +7: rows do not repeat in step
    reps = -(-n // block.size)
    return mx.tile(block, (reps,))[:n].reshape(shape)


def _randomize(module, seed: int, dtype, std: float = 0.02) -> None:
    """Seeded weights that keep every block in its working range: N(0, 0.02) matrices, unit norm
    scales, zero biases, codebooks N(0, 1) with unit usage, SnakeBeta exponents 0, layer
    scales 0.01."""
    params = tree_flatten(module.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    new = []
    for (name, p), k in zip(params, keys):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("alpha", "beta") or name.endswith(("bias",)):
            v = mx.zeros(p.shape)
        elif leaf == "cluster_usage" or name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            v = mx.ones(p.shape)
        elif leaf == "embedding_sum":
            v = _normal(p.shape, k)
        elif leaf == "scale":
            v = mx.full(p.shape, 0.01)
        elif leaf == "gamma":
            v = mx.full(p.shape, 0.1)
        else:
            v = std * _normal(p.shape, k)
        new.append((name, v.astype(dtype)))
    module.update(tree_unflatten(new))
    module.eval()
    mx.eval(module.parameters())


def load_dummy(shape: str, dtype=None):
    from ..loading import load_tokenizer
    from ..models.qwen3_tts import Model, SpeechTokenizer, SpeechTokenizerArgs, TTSArgs
    from .api import TTSModel

    if shape not in SHAPES:
        raise MetalgenError(f"unknown dummy TTS shape '{shape}' (known: {', '.join(SHAPES)})")
    spec = SHAPES[shape]
    model = Model(TTSArgs.from_dict(spec["config"]))
    _randomize(model, 0, parse_dtype(dtype) or mx.bfloat16)
    speech = SpeechTokenizer(SpeechTokenizerArgs.from_dict(spec["speech"]),
                             with_encoder=spec["config"]["tts_model_type"] == "base")
    _randomize(speech, 1, parse_dtype(dtype) or mx.float32, std=spec.get("speech_std", 0.02))
    tokenizer = load_tokenizer(tokenizer_folder())
    return TTSModel(model, speech, tokenizer, DUMMY_GENERATE_CONFIG, name=f"dummy:{shape}")
