"""Qwen3-Omni config.json (`model_type: qwen3_omni_moe`) -> the arguments of each sub-model.

The published file nests one config per part, with Hugging Face field names throughout:

    thinker_config.text_config        the Qwen3-MoE text decoder (M-RoPE sections; no shared expert)
    thinker_config.audio_config       the audio encoder (AudioEncoderArgs)
    thinker_config.vision_config      the image encoder (not supported: its weights are skipped)
    talker_config.text_config         the talker's MoE decoder (q/k norms, a shared expert)
    talker_config.code_predictor_config   the dense code predictor (codebooks 1..G-1)
    talker_config.*                   codec control ids, speakers, accept_hidden_layer
    code2wav_config                   the codec decoder (Code2WavArgs)
    top level                         chat and tts control token ids

Unknown keys are ignored at every level.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from ...errors import MetalgenError
from .. import qwen3, qwen3_moe
from ..decoder import DecoderSpec
from ..moe import moe_spec_from_args
from ..qwen3_tts.config import CodePredictorArgs


def _section(config: Mapping[str, Any], key: str) -> Dict[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MetalgenError(f"config.json: '{key}' must be an object, got {type(value).__name__}")
    return dict(value)


@dataclasses.dataclass
class ThinkerTextArgs(qwen3_moe.ModelArgs):
    """`thinker_config.text_config`: a Qwen3-MoE decoder. Its M-RoPE sections only matter for
    image and video positions; text and audio tokens have equal positions on all three axes,
    where M-RoPE is plain RoPE, so the thinker runs the plain rotation."""

    model_type: str = "qwen3_omni_moe_text"
    hidden_size: int = 2048
    num_hidden_layers: int = 48
    intermediate_size: int = 768
    num_attention_heads: int = 32
    vocab_size: int = 152064
    num_key_value_heads: Optional[int] = 4
    head_dim: Optional[int] = 128
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 65536
    shared_expert_intermediate_size: int = 0

    def to_spec(self) -> DecoderSpec:
        if self.shared_expert_intermediate_size:
            raise MetalgenError("config.json: a thinker with a shared expert is not a Qwen3-Omni layout")
        return super().to_spec()


@dataclasses.dataclass
class TalkerTextArgs(qwen3_moe.ModelArgs):
    """`talker_config.text_config`: Qwen3 attention (q/k norms) and sparse layers whose routed
    experts are joined by a shared expert behind a sigmoid gate (the Qwen2-MoE block). Fed
    embeddings, never token ids; its positions are sequential, so plain RoPE as for the thinker."""

    model_type: str = "qwen3_omni_moe_talker_text"
    hidden_size: int = 1024
    num_hidden_layers: int = 20
    intermediate_size: int = 2048
    num_attention_heads: int = 16
    vocab_size: int = 3072
    num_key_value_heads: Optional[int] = 2
    head_dim: Optional[int] = 128
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 384
    shared_expert_intermediate_size: int = 768
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 65536

    def to_spec(self) -> DecoderSpec:
        spec = qwen3.ModelArgs.to_spec(self)  # the attention, without qwen3_moe's MoE
        moe = moe_spec_from_args(self, shared_intermediate_size=int(self.shared_expert_intermediate_size))
        return dataclasses.replace(spec, moe=moe)


@dataclasses.dataclass
class OmniCodePredictorArgs(CodePredictorArgs):
    """`talker_config.code_predictor_config`: Qwen3-TTS's code predictor, whose rope settings the
    Omni config writes as `rope_parameters`."""

    rope_parameters: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class TalkerArgs:
    """`talker_config`: the decoder, the code predictor and the codec control vocabulary."""

    text: TalkerTextArgs
    code_predictor: OmniCodePredictorArgs
    num_code_groups: int = 16
    thinker_hidden_size: int = 2048
    accept_hidden_layer: int = 24
    codec_eos_token_id: int = 2150
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    speaker_id: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        """The codec vocabulary (the frame loop's name for it)."""
        return self.text.vocab_size

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "TalkerArgs":
        fields = {f.name for f in dataclasses.fields(cls)} - {"text", "code_predictor"}
        text = _section(config, "text_config")
        text.setdefault("model_type", "qwen3_omni_moe_talker_text")
        args = cls(
            text=TalkerTextArgs.from_dict(text),
            code_predictor=OmniCodePredictorArgs.from_dict(_section(config, "code_predictor_config")),
            **{k: config[k] for k in fields if k in config},
        )
        args.speaker_id = {str(k).lower(): int(v) for k, v in (args.speaker_id or {}).items()}
        if args.code_predictor.num_code_groups != args.num_code_groups:
            raise MetalgenError(
                f"config.json: talker num_code_groups {args.num_code_groups} differs from the code "
                f"predictor's {args.code_predictor.num_code_groups}"
            )
        return args


@dataclasses.dataclass
class OmniArgs:
    """The whole config.json of a Qwen3-Omni checkpoint."""

    thinker_text: ThinkerTextArgs
    audio: Optional[Dict[str, Any]]
    talker: Optional[TalkerArgs]
    code2wav: Optional[Dict[str, Any]]
    has_vision: bool = False
    enable_audio_output: bool = True
    audio_token_id: int = 151675
    audio_start_token_id: int = 151669
    audio_end_token_id: int = 151670
    image_token_id: int = 151655
    video_token_id: int = 151656
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    system_token_id: int = 8948
    user_token_id: int = 872
    assistant_token_id: int = 77091

    model_type = "qwen3_omni_moe"

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "OmniArgs":
        if config.get("model_type") not in (cls.model_type, None):
            raise MetalgenError(
                f"config.json has model_type '{config.get('model_type')}', expected '{cls.model_type}'"
            )
        thinker = _section(config, "thinker_config")
        text = _section(thinker, "text_config")
        if not text:
            raise MetalgenError("config.json has no thinker_config.text_config: not a Qwen3-Omni checkpoint")
        text.setdefault("model_type", "qwen3_omni_moe_text")
        talker_cfg = _section(config, "talker_config")
        enable_audio = bool(config.get("enable_audio_output", True)) and bool(talker_cfg)
        ids = {f.name for f in dataclasses.fields(cls)} - {
            "thinker_text", "audio", "talker", "code2wav", "has_vision", "enable_audio_output"}
        # the media token ids live in thinker_config; the chat and tts ids at the top level
        values = {k: thinker[k] for k in ids if k in thinker}
        values.update({k: config[k] for k in ids if k in config and k not in values})
        return cls(
            thinker_text=ThinkerTextArgs.from_dict(text),
            audio=_section(thinker, "audio_config") or None,
            talker=TalkerArgs.from_dict(talker_cfg) if enable_audio else None,
            code2wav=_section(config, "code2wav_config") or None if enable_audio else None,
            has_vision=bool(thinker.get("vision_config")),
            enable_audio_output=enable_audio,
            **values,
        )
