"""Qwen3.5-MoE (`model_type: qwen3_5_moe`, or `qwen3_5_moe_text`; Qwen3.5-35B-A3B and larger): the
Qwen3.5 hybrid stack (models/qwen3_5.py) with every layer sparse: `num_experts` experts, the top
`num_experts_per_tok` renormalised, plus a shared expert behind its sigmoid gate. Published image-text
checkpoints load their text decoder as Qwen3.5's do."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from . import qwen3_next
from .hybrid import HybridCausalLM, text_config

TEXT_TYPES = ("qwen3_5_moe_text",)


@dataclasses.dataclass
class ModelArgs(qwen3_next.ModelArgs):
    # defaults as transformers' Qwen3_5MoeTextConfig; no dense layers, the top k always renormalised
    num_hidden_layers: int = 40
    vocab_size: int = 248320
    num_experts: int = 256
    num_experts_per_tok: int = 8
    intermediate_size: int = 0

    layout = "split"  # to_spec is Qwen3-Next's: sparse layers with a shared expert, hybrid layers

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]):
        fixed = {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}
        return super().from_dict({**text_config(params, TEXT_TYPES), **fixed})


class Model(HybridCausalLM):
    """A Qwen3.5-MoE causal LM (text); `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.to_spec(), args.tie_word_embeddings)
        self.args = args
