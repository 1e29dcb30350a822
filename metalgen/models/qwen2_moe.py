"""Qwen2-MoE (`model_type: qwen2_moe`; Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention
(q/k/v biases unless `qkv_bias` is false) with sparse feed-forward layers whose routed experts are
joined by a dense shared expert of `shared_expert_intermediate_size`, scaled by
sigmoid(shared_expert_gate(x)) and added to the routed sum: the block that Qwen3-Next, Qwen3.5-MoE
and the Qwen3-Omni talker reuse."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from . import qwen2
from .decoder import CausalLM, DecoderSpec, spec_from_args
from .moe import moe_spec_from_args


@dataclasses.dataclass
class ModelArgs(qwen2.ModelArgs):
    # defaults as transformers' Qwen2MoeConfig
    head_dim: Optional[int] = None
    qkv_bias: bool = True
    num_experts: int = 60
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 1408
    shared_expert_intermediate_size: int = 5632
    decoder_sparse_step: int = 1
    mlp_only_layers: Optional[List[int]] = None
    norm_topk_prob: bool = False
    tie_word_embeddings: bool = False

    def to_spec(self) -> DecoderSpec:
        # head_dim as transformers takes it: the config's when it has one, else hidden / heads
        return spec_from_args(
            self, qkv_bias=self.qkv_bias,
            moe=moe_spec_from_args(self, shared_intermediate_size=self.shared_expert_intermediate_size))


class Model(CausalLM):
    """A Qwen2-MoE causal LM; `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.to_spec(), args.tie_word_embeddings)
        self.args = args
