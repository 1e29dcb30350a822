"""Qwen3-MoE (`model_type: qwen3_moe`; Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B):
Qwen3's attention (per-head q/k norms, explicit head_dim) with sparse feed-forward layers: a
router over `num_experts` experts, the top `num_experts_per_tok` of them run and summed with their
softmax weights (renormalised over the chosen ones when `norm_topk_prob`). Layers listed in
`mlp_only_layers`, or not on the `decoder_sparse_step` grid, keep a dense MLP of
`intermediate_size`. No shared expert."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from . import qwen3
from .decoder import CausalLM, DecoderSpec
from .moe import moe_spec_from_args


@dataclasses.dataclass
class ModelArgs(qwen3.ModelArgs):
    # defaults as transformers' Qwen3MoeConfig
    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    decoder_sparse_step: int = 1
    mlp_only_layers: Optional[List[int]] = None
    norm_topk_prob: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    # transformers 5 writes num_experts under this name (its config's attribute_map)
    num_local_experts: Optional[int] = None

    def __post_init__(self):
        if self.num_local_experts is not None:
            self.num_experts = self.num_local_experts

    def to_spec(self) -> DecoderSpec:
        return dataclasses.replace(super().to_spec(), moe=moe_spec_from_args(self))


class Model(CausalLM):
    """A Qwen3-MoE causal LM; `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.to_spec(), args.tie_word_embeddings)
        self.args = args
