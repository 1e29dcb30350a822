"""Qwen3 dense (`model_type: qwen3`): per-head RMSNorm on q and k before RoPE, explicit
head_dim (128 for every released size, which differs from hidden / heads for most), no
q/k/v biases unless `attention_bias` says so."""

from __future__ import annotations

import dataclasses
from typing import Optional

from . import qwen2
from .decoder import CausalLM, DecoderSpec, spec_from_args


@dataclasses.dataclass
class ModelArgs(qwen2.ModelArgs):
    head_dim: Optional[int] = None
    attention_bias: bool = False
    max_position_embeddings: int = 40960

    def to_spec(self) -> DecoderSpec:
        return spec_from_args(self, qkv_bias=self.attention_bias, qk_norm=True)


class Model(CausalLM):
    """A Qwen3 causal LM; `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.to_spec(), args.tie_word_embeddings)
        self.args = args
