"""Qwen2 and Qwen2.5 (`model_type: qwen2`): biases on q/k/v, head_dim = hidden / heads."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from .base import BaseModelArgs
from .decoder import CausalLM, DecoderSpec, spec_from_args


@dataclasses.dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    num_key_value_heads: Optional[int] = None
    max_position_embeddings: int = 32768
    rope_theta: float = 10000.0  # transformers' default when a config gives none
    rope_scaling: Optional[Dict[str, Any]] = None
    rope_parameters: Optional[Dict[str, Any]] = None
    tie_word_embeddings: bool = True
    use_sliding_window: bool = False

    def to_spec(self) -> DecoderSpec:
        # head_dim is always hidden / heads here, whatever else a config carries
        return spec_from_args(
            self, head_dim=self.hidden_size // self.num_attention_heads, qkv_bias=True
        )


class Model(CausalLM):
    """A Qwen2 causal LM; `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args.to_spec(), args.tie_word_embeddings)
        self.args = args
