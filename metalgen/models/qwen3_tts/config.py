"""Qwen3-TTS config.json (`model_type: qwen3_tts`) -> the arguments of each sub-model.

Field names are those of the published config.json (`talker_config`, its
`code_predictor_config`, `speaker_encoder_config`, and `speech_tokenizer/config.json`'s
`decoder_config` / `encoder_config`); unknown keys are ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from ...errors import MetalgenError
from ..base import BaseModelArgs
from ..decoder import DecoderSpec, spec_from_args
from ..rope import RopeConfig

MODEL_TYPES = ("custom_voice", "voice_design", "base")


@dataclasses.dataclass
class DecoderArgs(BaseModelArgs):
    """The Qwen3 decoder fields the talker and the code predictor share."""

    hidden_size: int = 1024
    num_hidden_layers: int = 20
    intermediate_size: int = 2048
    num_attention_heads: int = 16
    vocab_size: int = 3072
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    attention_bias: bool = False
    hidden_act: str = "silu"
    num_code_groups: int = 16

    def to_spec(self) -> DecoderSpec:
        if self.attention_bias:
            raise MetalgenError("Qwen3-TTS checkpoints with attention_bias=true are not supported")
        if self.hidden_act != "silu":
            raise MetalgenError(f"Qwen3-TTS decoder activation '{self.hidden_act}' is not supported (only silu)")
        return spec_from_args(self, qk_norm=True)


@dataclasses.dataclass
class CodePredictorArgs(DecoderArgs):
    vocab_size: int = 2048
    num_hidden_layers: int = 5
    intermediate_size: int = 3072
    num_key_value_heads: Optional[int] = 8
    head_dim: Optional[int] = 128


@dataclasses.dataclass
class TalkerArgs(DecoderArgs):
    vocab_size: int = 3072
    text_hidden_size: int = 2048
    text_vocab_size: int = 151936
    codec_eos_token_id: int = 4198
    codec_think_id: int = 4202
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    spk_id: Optional[Dict[str, Any]] = None
    spk_is_dialect: Optional[Dict[str, Any]] = None
    codec_language_id: Optional[Dict[str, int]] = None
    code_predictor_config: Optional[Dict[str, Any]] = None

    @property
    def mrope_section(self):
        return (self.rope_scaling or {}).get("mrope_section")

    def code_predictor(self) -> CodePredictorArgs:
        return CodePredictorArgs.from_dict(dict(self.code_predictor_config or {}))


@dataclasses.dataclass
class SpeakerEncoderArgs(BaseModelArgs):
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple = (5, 3, 3, 3, 1)
    enc_dilations: tuple = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000


@dataclasses.dataclass
class TTSArgs:
    """The whole config.json of a Qwen3-TTS checkpoint."""

    talker: TalkerArgs
    speaker_encoder: SpeakerEncoderArgs
    tts_model_type: str
    tts_model_size: str = ""
    tokenizer_type: str = "qwen3_tts_tokenizer_12hz"
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "TTSArgs":
        if config.get("model_type") != "qwen3_tts":
            raise MetalgenError(
                f"not a Qwen3-TTS checkpoint: config.json has model_type "
                f"'{config.get('model_type')}', expected 'qwen3_tts'"
            )
        if "talker_config" not in config:
            raise MetalgenError("Qwen3-TTS config.json has no 'talker_config'")
        kind = config.get("tts_model_type")
        if kind not in MODEL_TYPES:
            raise MetalgenError(
                f"unknown tts_model_type '{kind}' in config.json (supported: {', '.join(MODEL_TYPES)})"
            )
        tokenizer_type = config.get("tokenizer_type") or "qwen3_tts_tokenizer_12hz"
        if tokenizer_type != "qwen3_tts_tokenizer_12hz":
            raise MetalgenError(
                f"speech tokenizer '{tokenizer_type}' is not supported (only the 12 Hz tokenizer, "
                "qwen3_tts_tokenizer_12hz)"
            )
        talker = TalkerArgs.from_dict(config["talker_config"])
        if not talker.mrope_section:
            raise MetalgenError("talker_config.rope_scaling has no 'mrope_section'")
        fields = {f.name for f in dataclasses.fields(cls)} - {"talker", "speaker_encoder"}
        return cls(
            talker=talker,
            speaker_encoder=SpeakerEncoderArgs.from_dict(config.get("speaker_encoder_config") or {}),
            tokenizer_type=tokenizer_type,
            **{k: config[k] for k in fields if k in config and k != "tokenizer_type" and config[k] is not None},
        )


@dataclasses.dataclass
class SpeechDecoderArgs(BaseModelArgs):
    """`speech_tokenizer/config.json` -> `decoder_config` (the 12 Hz tokenizer's decoder)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: Optional[int] = None
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple = (8, 5, 4, 3)
    upsampling_ratios: tuple = (2, 2)
    decoder_dim: int = 1536

    def to_spec(self) -> DecoderSpec:
        if self.attention_bias:
            raise MetalgenError("speech decoders with attention_bias=true are not supported")
        # plain RoPE from rope_theta alone, as the reference builds it
        return spec_from_args(self, vocab_size=0, rope=RopeConfig(theta=float(self.rope_theta)))

    @property
    def total_upsample(self) -> int:
        n = 1
        for r in tuple(self.upsample_rates) + tuple(self.upsampling_ratios):
            n *= int(r)
        return n


@dataclasses.dataclass
class SpeechTokenizerArgs:
    decoder: SpeechDecoderArgs
    encoder: Dict[str, Any]
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "SpeechTokenizerArgs":
        if config.get("model_type") not in ("qwen3_tts_tokenizer_12hz", None, ""):
            raise MetalgenError(
                f"speech_tokenizer/config.json has model_type '{config.get('model_type')}', "
                "expected 'qwen3_tts_tokenizer_12hz'"
            )
        fields = {f.name for f in dataclasses.fields(cls)} - {"decoder", "encoder"}
        return cls(
            decoder=SpeechDecoderArgs.from_dict(config.get("decoder_config") or {}),
            encoder=dict(config.get("encoder_config") or {}),
            **{k: config[k] for k in fields if k in config},
        )
