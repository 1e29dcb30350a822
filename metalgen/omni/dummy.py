"""`dummy:qwen3-omni-*`: Qwen3-Omni with seeded random weights, made in memory.

`qwen3-omni-30b-a3b` has the shapes of the published Qwen3-Omni-30B-A3B-Instruct config.json
(thinker 48 layers, 128 experts top 8; talker 20 layers, 128 experts top 6 and a shared expert;
5-layer code predictor; 32-layer audio encoder; Code2Wav); `qwen3-omni-tiny` is small enough for
tests and a look on any machine, with head_dim 64, the smallest the decode kernels take. A
`-4bit` / `-8bit` suffix quantizes the two decoders and the code predictor as mlx_lm.convert
would (routers at 8 bits); the audio encoder and Code2Wav stay in floating point. The text
tokenizer is the Qwen tokenizer shipped in metalgen/assets; the speech is noise.
"""

from __future__ import annotations

import re

from typing import Any, Dict, Iterable

import mlx.core as mx
import mlx.nn as nn

from ..dummy import QUANT_GROUP_SIZE, random_weight_dict, tokenizer_folder
from ..errors import MetalgenError
from ..loading import finish_loading, load_tokenizer, parse_dtype
from ..models.qwen3_omni.config import OmniArgs
from ..models.qwen3_omni.model import PARTS, Model

SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
CODEC_IDS = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155,
                 codec_think_bos_id=2156, codec_think_eos_id=2157)
MEDIA_IDS = dict(audio_token_id=151675, image_token_id=151655, video_token_id=151656,
                 audio_start_token_id=151669, audio_end_token_id=151670, vision_start_token_id=151652)
TOKEN_IDS = dict(im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
                 tts_bos_token_id=151672, tts_eos_token_id=151673, system_token_id=8948, user_token_id=872,
                 assistant_token_id=77091)
_MROPE = {"rope_type": "default", "rope_theta": 1000000, "mrope_section": [24, 20, 20], "interleaved": True,
          "mrope_interleaved": True}


def _omni(thinker: dict, audio: dict, talker: dict, predictor: dict, code2wav: dict, speakers=SPEAKERS) -> dict:
    return dict(
        model_type="qwen3_omni_moe", enable_audio_output=True, **TOKEN_IDS,
        thinker_config=dict(text_config=dict(model_type="qwen3_omni_moe_text", rms_norm_eps=1e-6,
                                             rope_parameters=dict(_MROPE), **thinker),
                            audio_config=dict(num_mel_bins=128, max_source_positions=1500, n_window=50,
                                              n_window_infer=800, conv_chunksize=500, **audio),
                            user_token_id=872, **MEDIA_IDS),
        talker_config=dict(text_config=dict(model_type="qwen3_omni_moe_talker_text", rms_norm_eps=1e-6,
                                            rope_parameters=dict(_MROPE), vocab_size=3072, **talker),
                           code_predictor_config=dict(vocab_size=2048, num_code_groups=16, rms_norm_eps=1e-6,
                                                      rope_parameters={"rope_type": "default",
                                                                       "rope_theta": 1000000},
                                                      **predictor),
                           num_code_groups=16, thinker_hidden_size=thinker["hidden_size"], speaker_id=dict(speakers),
                           spatial_merge_size=2, position_id_per_seconds=13,
                           **CODEC_IDS, **MEDIA_IDS),
        code2wav_config=dict(codebook_size=2048, num_quantizers=16, upsample_rates=[8, 5, 4, 3],
                             upsampling_ratios=[2, 2], max_position_embeddings=8000, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000}, **code2wav),
    )


SHAPES: Dict[str, Dict[str, Any]] = {
    # Qwen/Qwen3-Omni-30B-A3B-Instruct's config.json
    "qwen3-omni-30b-a3b": _omni(
        thinker=dict(vocab_size=152064, hidden_size=2048, intermediate_size=768, num_hidden_layers=48,
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                     max_position_embeddings=65536),
        audio=dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                   output_dim=2048, downsample_hidden_size=480),
        talker=dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=20, num_attention_heads=16,
                    num_key_value_heads=2, head_dim=128, num_local_experts=128, num_experts_per_tok=6,
                    moe_intermediate_size=384, shared_expert_intermediate_size=768, norm_topk_prob=True,
                    max_position_embeddings=65536, accept_hidden_layer=24),
        predictor=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, max_position_embeddings=32768),
        code2wav=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=16, sliding_window=72, decoder_dim=1536),
    ),
    "qwen3-omni-tiny": _omni(
        thinker=dict(vocab_size=152064, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                     max_position_embeddings=8192),
        audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=128,
                   downsample_hidden_size=32),
        talker=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=64, shared_expert_intermediate_size=128, norm_topk_prob=True,
                    max_position_embeddings=8192),
        predictor=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64, max_position_embeddings=8192),
        code2wav=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, sliding_window=72, decoder_dim=64),
    ),
}
# accept_hidden_layer is a talker_config field, not the talker text config's
for _shape in SHAPES.values():
    _text = _shape["talker_config"]["text_config"]
    _shape["talker_config"]["accept_hidden_layer"] = _text.pop("accept_hidden_layer", 2)
del _shape, _text


def dummy_config(shape: str) -> Dict[str, Any]:
    """The config.json of `dummy:<shape>`, with an MLX `quantization` entry for -4bit / -8bit."""
    m = re.fullmatch(r"(.+?)(?:-(4|8)bit)?", shape)
    base, bits = m.group(1), int(m.group(2) or 0)
    if base not in SHAPES:
        raise MetalgenError(f"unknown Qwen3-Omni dummy shape '{shape}' (known: {', '.join(SHAPES)}, "
                            "each with -4bit or -8bit)")
    config = dict(SHAPES[base], eos_token_ids=[TOKEN_IDS["im_end_token_id"], 151643])
    if bits:
        config["quantization"] = {"group_size": QUANT_GROUP_SIZE, "bits": bits}
    return config


def quantize_decoders(model: Model, quantization: Dict[str, Any]) -> None:
    """The thinker's and talker's decoders, heads and the code predictor quantized as mlx_lm.convert
    quantizes a MoE model (routers at 8 bits); the audio encoder and Code2Wav stay floating."""
    gs, bits = quantization["group_size"], quantization["bits"]

    def predicate(path: str, module: nn.Module):
        if path.startswith(("thinker.audio_tower", "code2wav")) or "projection" in path:
            return False
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % gs:
            return False
        if path.endswith(("mlp.gate", "shared_expert_gate")):
            return {"group_size": gs, "bits": 8}
        return True

    nn.quantize(model, gs, bits, class_predicate=predicate)


def load_dummy(shape: str, dtype=None, parts: Iterable[str] = PARTS):
    """Build `dummy:<shape>` (bf16 unless `dtype` says otherwise) as metalgen.omni.loading.OmniParts."""
    from .loading import OmniParts, keep_audio_float32

    config = dummy_config(shape)
    args = OmniArgs.from_dict(config)
    model = Model(args, parts)
    if "quantization" in config:
        quantize_decoders(model, config["quantization"])
    weights = random_weight_dict(model, dtype=parse_dtype(dtype) or mx.bfloat16)
    weights = model.pack_weights(weights)
    model.load_weights(list(weights.items()), strict=True)
    finish_loading(model)
    keep_audio_float32(model)
    tokenizer = load_tokenizer(tokenizer_folder(), config["eos_token_ids"])
    return OmniParts(model, tokenizer, {}, f"dummy:{shape}")
