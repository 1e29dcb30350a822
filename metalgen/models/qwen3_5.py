"""Qwen3.5 dense (`model_type: qwen3_5`, or `qwen3_5_text` for a text-only config): the hybrid stack
of models/hybrid.py with Qwen3.5's separate Gated DeltaNet projections (`in_proj_qkv`, `in_proj_z`,
`in_proj_b`, `in_proj_a`) and dense MLPs. The released checkpoints are image-text models: their
config nests the decoder under `text_config` and their weights under `model.language_model.`; the
text decoder loads and the vision tower is skipped, with one line saying so. Text positions make
Qwen3.5's multimodal RoPE the plain (partial) RoPE."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from . import qwen3_next
from .decoder import DecoderSpec, spec_from_args
from .hybrid import HybridCausalLM, hybrid_spec_from_args, text_config

TEXT_TYPES = ("qwen3_5_text",)


@dataclasses.dataclass
class ModelArgs(qwen3_next.ModelArgs):
    # defaults as transformers' Qwen3_5TextConfig
    hidden_size: int = 4096
    num_hidden_layers: int = 32
    num_key_value_heads: int = 4
    intermediate_size: int = 12288
    vocab_size: int = 248320
    num_experts: int = 0

    layout = "split"

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]):
        return super().from_dict(text_config(params, TEXT_TYPES))

    def to_spec(self) -> DecoderSpec:
        return spec_from_args(self, qkv_bias=self.attention_bias, qk_norm=True,
                              hybrid=hybrid_spec_from_args(self, self.layout))


class Model(HybridCausalLM):
    """A Qwen3.5 causal LM (text); `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.to_spec(), args.tie_word_embeddings)
        self.args = args
