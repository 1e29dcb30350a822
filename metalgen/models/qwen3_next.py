"""Qwen3-Next (`model_type: qwen3_next`; Qwen3-Next-80B-A3B): the hybrid stack of models/hybrid.py
with Gated DeltaNet projections packed per key head (`in_proj_qkvz`, `in_proj_ba`), sparse layers of
`num_experts` experts plus a shared expert behind its sigmoid gate (Qwen2-MoE's block), and the
layers listed in `mlp_only_layers` or off the `decoder_sparse_step` grid dense."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from .base import BaseModelArgs
from .decoder import DecoderSpec, spec_from_args
from .hybrid import HybridCausalLM, hybrid_spec_from_args
from .moe import moe_spec_from_args


@dataclasses.dataclass
class ModelArgs(BaseModelArgs):
    # defaults as transformers' Qwen3NextConfig
    model_type: str
    hidden_size: int = 2048
    num_hidden_layers: int = 48
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: Optional[int] = 256
    intermediate_size: int = 5632
    vocab_size: int = 151936
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    rope_parameters: Optional[Dict[str, Any]] = None
    partial_rotary_factor: Optional[float] = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    layer_types: Optional[List[str]] = None
    full_attention_interval: Optional[int] = None
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    num_experts: int = 512
    num_experts_per_tok: int = 10
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    decoder_sparse_step: int = 1
    mlp_only_layers: Optional[List[int]] = None
    norm_topk_prob: bool = True

    layout = "qkvz"  # Gated DeltaNet projections packed per key head (models/gated_delta.py)

    def to_spec(self) -> DecoderSpec:
        return spec_from_args(
            self, qkv_bias=self.attention_bias, qk_norm=True,
            moe=moe_spec_from_args(self, shared_intermediate_size=self.shared_expert_intermediate_size),
            hybrid=hybrid_spec_from_args(self, self.layout))


class Model(HybridCausalLM):
    """A Qwen3-Next causal LM; `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.to_spec(), args.tie_word_embeddings)
        self.args = args
