"""The hybrid decoder of Qwen3-Next and Qwen3.5: Gated DeltaNet layers (models/gated_delta.py) and
gated softmax-attention layers, interleaved as the config's `layer_types` says (by default three
linear layers, then one full-attention layer).

The attention layers differ from Qwen3's: q_proj yields, per head, the query and an output gate
(the attention output is multiplied by sigmoid(gate) before o_proj), RoPE turns only the first
`partial_rotary_factor` of each head's dims, and every RMSNorm of the stack (the layers' two, the
final one, q/k norms) scales by (1 + weight). Those weights are kept here as 1 + weight, the form
the RMSNorm kernels take and MLX conversions store; `sanitize` adds the 1 to Hugging Face weights.
The gated norm inside the linear layers scales by its weight as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..cache import KVCache, LinearAttnCache
from ..errors import MetalgenError
from .decoder import CausalLM, DecoderModel, DecoderSpec, attend, rope_offset
from .gated_delta import GatedDeltaNet, LinearAttnSpec
from .layers import MLP, Linear, RMSNorm, fuse_parts, split_last, unfuse_parts
from .moe import SparseMoeBlock
from .rope import RoPE

LINEAR, FULL = "linear_attention", "full_attention"
# the (1 + weight) norms, by the end of their checkpoint names
SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                 ".q_norm.weight", ".k_norm.weight")
# checkpoint entries that are not the text decoder: the vision tower, multi-token prediction
SKIPPED_PREFIXES = ("model.visual.", "visual.", "vision_tower.", "model.vision_tower.", "mtp.", "model.mtp.")


@dataclasses.dataclass(frozen=True)
class HybridSpec:
    """Which layers mix tokens how, and the shapes that differ from a plain Qwen3 stack."""

    layer_types: Tuple[str, ...]
    linear: LinearAttnSpec
    rotary_dims: int  # the first rotary_dims of each attention head turn; the rest pass through
    attention_bias: bool = False

    def is_linear(self, layer: int) -> bool:
        return self.layer_types[layer] == LINEAR


def hybrid_spec_from_args(args, layout: str) -> HybridSpec:
    """The HybridSpec of a ModelArgs with Hugging Face's Qwen3-Next / Qwen3.5 field names."""
    n = args.num_hidden_layers
    types = args.layer_types
    if types is None:  # transformers' default: every `full_attention_interval`-th layer is full
        every = int(args.full_attention_interval or 4)
        types = [FULL if (i + 1) % every == 0 else LINEAR for i in range(n)]
    types = tuple(types)
    if len(types) != n:
        raise MetalgenError(f"config.json: layer_types has {len(types)} entries for num_hidden_layers {n}")
    bad = sorted(set(types) - {LINEAR, FULL})
    if bad:
        raise MetalgenError(f"config.json: unknown layer type '{bad[0]}' in layer_types "
                            f"(known: {LINEAR}, {FULL})")
    linear = LinearAttnSpec(
        num_key_heads=int(args.linear_num_key_heads), num_value_heads=int(args.linear_num_value_heads),
        key_head_dim=int(args.linear_key_head_dim), value_head_dim=int(args.linear_value_head_dim),
        conv_kernel=int(args.linear_conv_kernel_dim), layout=layout)
    linear.check()
    head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
    factor = partial_rotary_factor(args)
    rotary = int(head_dim * factor)
    if not 0 < rotary <= head_dim or rotary % 2:
        raise MetalgenError(f"config.json: partial_rotary_factor {factor} of head_dim {head_dim} "
                            "must turn an even number of dims")
    return HybridSpec(types, linear, rotary, bool(getattr(args, "attention_bias", False)))


def partial_rotary_factor(args) -> float:
    """The config's partial_rotary_factor: top level, else inside rope_parameters / rope_scaling,
    else Qwen3-Next's 0.25 (transformers' default for these configs)."""
    if args.partial_rotary_factor is not None:
        return float(args.partial_rotary_factor)
    for params in (args.rope_parameters, args.rope_scaling):
        if isinstance(params, Mapping) and params.get("partial_rotary_factor") is not None:
            return float(params["partial_rotary_factor"])
    return 0.25


class GatedAttention(nn.Module):
    """Grouped-query attention with a per-head output gate and partial RoPE; K/V heads never repeated."""

    def __init__(self, spec: DecoderSpec, rope: RoPE):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        bias = spec.hybrid.attention_bias
        self.n_heads = spec.num_attention_heads
        self.n_kv_heads = spec.num_key_value_heads
        self.head_dim = d
        self.rotary_dims = spec.hybrid.rotary_dims
        self.scale = d**-0.5
        self.q_proj = Linear(h, self.n_heads * d * 2, bias=bias)  # per head: query, then gate
        self.k_proj = Linear(h, self.n_kv_heads * d, bias=bias)
        self.v_proj = Linear(h, self.n_kv_heads * d, bias=bias)
        self.o_proj = Linear(self.n_heads * d, h, bias=bias)
        self.q_norm = RMSNorm(d, spec.rms_norm_eps)
        self.k_norm = RMSNorm(d, spec.rms_norm_eps)
        self._rope = rope

    def turn(self, x: mx.array, offset) -> mx.array:
        """RoPE on the first rotary_dims of each head of x (B, heads, L, D) at positions offset ..;
        `offset` an int or an int32 scalar array (kernels_metal.rope)."""
        r = self.rotary_dims
        if r == self.head_dim:
            return self._rope(x, offset)
        return mx.concatenate([self._rope(x[..., :r], offset), x[..., r:]], axis=-1)

    def _sizes(self) -> Tuple[int, int, int]:
        d = self.head_dim
        return (self.n_heads * 2 * d, self.n_kv_heads * d, self.n_kv_heads * d)

    def fusions(self):
        """(fused name, the checkpoint's names, their output sizes) of fuse_projections."""
        return [("qkv_proj", ("q_proj", "k_proj", "v_proj"), self._sizes())]

    def fuse_projections(self) -> None:
        """q_proj (queries and gates), k_proj and v_proj as one `qkv_proj`; unchanged where they
        cannot be fused (layers.fuse_linears)."""
        fuse_parts(self, "qkv_proj", ("q_proj", "k_proj", "v_proj"))

    def project(self, x: mx.array) -> Tuple[mx.array, mx.array, mx.array, mx.array]:
        """x (B, L, hidden) -> q, k (normed, not yet turned), v: (B, heads, L, D); gate (B, L, heads * D)."""
        B, L, _ = x.shape
        d = self.head_dim
        # (B, L, heads * 2D) -> (B, L, heads, 2D): each head's query, then its gate
        if "qkv_proj" in self:
            qg, k, v = split_last(self.qkv_proj(x), self._sizes())
        else:
            qg, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        qg = qg.reshape(B, L, self.n_heads, 2 * d)
        gate = qg[..., d:].reshape(B, L, self.n_heads * d)
        q = self.q_norm(qg[..., :d])
        k = self.k_norm(k.reshape(B, L, self.n_kv_heads, d))
        v = v.reshape(B, L, self.n_kv_heads, d)
        # -> (B, heads, L, D)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        return q, k, v, gate

    def output(self, o: mx.array, gate: mx.array) -> mx.array:
        """The attention output o (B, heads, L, D), gated, through o_proj -> (B, L, hidden)."""
        B, _, L, _ = o.shape
        # (B, heads, L, D) -> (B, L, heads * D)
        o = o.transpose(0, 2, 1, 3).reshape(B, L, -1)
        return self.o_proj(o * mx.sigmoid(gate))

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        q, k, v, gate = self.project(x)
        offset = rope_offset(cache)  # a batch's rows each turn at their own position
        q, k = self.turn(q, offset), self.turn(k, offset)
        return self.output(attend(q, k, v, self.scale, mask, cache), gate)


class HybridLayer(nn.Module):
    """Pre-norm block: the layer's token mixer (`linear_attn` or `self_attn`) and its feed-forward
    (a dense MLP or the sparse block with a shared expert), each added back to the residual."""

    def __init__(self, spec: DecoderSpec, rope: RoPE, index: int):
        super().__init__()
        if spec.hybrid.is_linear(index):
            self.linear_attn = GatedDeltaNet(spec.hidden_size, spec.hybrid.linear, spec.rms_norm_eps)
        else:
            self.self_attn = GatedAttention(spec, rope)
        if spec.moe is not None and spec.moe.is_sparse(index):
            self.mlp = SparseMoeBlock(spec.hidden_size, spec.moe)
        else:
            self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        mixer = self.linear_attn if "linear_attn" in self else self.self_attn
        h = x + mixer(self.input_layernorm(x), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class HybridDecoderModel(DecoderModel):
    """Embedding, the hybrid layer stack and the final norm (the checkpoint's `model.*`)."""

    def __init__(self, spec: DecoderSpec):
        super().__init__(spec, rope=RoPE(spec.rope, spec.hybrid.rotary_dims, spec.max_position_embeddings))

    def make_layer(self, spec: DecoderSpec, rope, index: int) -> nn.Module:
        return HybridLayer(spec, rope, index)


class HybridCausalLM(CausalLM):
    """A hybrid decoder plus LM head; `make_cache` gives each layer the cache its kind needs."""

    decoder_class = HybridDecoderModel

    def make_cache(self, max_size: Optional[int] = None):
        return [LinearAttnCache() if t == LINEAR else KVCache(max_size) for t in self.spec.hybrid.layer_types]

    def fuse_projections(self) -> None:
        """After loading: each layer's projections of one input as one matmul (the Gated DeltaNet
        inputs, q/k/v with the gate, the dense MLPs' gate and up). At decode a hybrid stack is bound
        by the number of operations, not by bytes (docs/decode.md); on the H200 this takes 90 of the
        0.8B shape's operations out of every token. The checkpoint's names are gone afterwards."""
        for layer in self.model.layers:
            (layer.linear_attn if "linear_attn" in layer else layer.self_attn).fuse_projections()
            if isinstance(layer.mlp, MLP):
                layer.mlp.fuse_projections()
            # made here, a layer at a time, so that memory never holds more than one layer twice
            mx.eval(layer.parameters())

    def checkpoint_parameters(self) -> dict:
        """The parameters as a flat dict under the checkpoint's names, as an MLX conversion stores
        them: fused projections split back (views, nothing copied)."""
        flat = dict(tree_flatten(self.parameters()))
        for i, layer in enumerate(self.model.layers):
            for name in ("linear_attn", "self_attn", "mlp"):
                part = layer.get(name)
                if part is not None and hasattr(part, "fusions"):
                    for fused, names, sizes in part.fusions():
                        unfuse_parts(flat, f"model.layers.{i}.{name}.", fused, names, sizes)
        return flat

    def sanitize(self, weights: dict) -> dict:
        """Hugging Face, image-text and MLX-converted layouts to ours: the text decoder's entries
        under `model.` (image-text checkpoints nest it as `model.language_model.`, MLX conversions
        of those as `language_model.model.`), the vision tower and multi-token-prediction weights
        dropped, conv weights moved to MLX's (channels, taps, 1), and the (1 + weight) norms given
        their 1 where the checkpoint is in Hugging Face's form (its conv weights say which)."""
        renamed = {}
        for key, value in weights.items():
            if key.startswith(SKIPPED_PREFIXES):
                continue
            for old, new in (("model.language_model.", "model."), ("language_model.model.", "model."),
                             ("language_model.lm_head.", "lm_head.")):
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            renamed[key] = value
        def hf_conv(key, value):  # Hugging Face's (C, 1, taps), not MLX's (C, taps, 1)
            return key.endswith("conv1d.weight") and value.ndim == 3 and value.shape[1] == 1 and value.shape[2] != 1

        hf_form = any(hf_conv(k, v) for k, v in renamed.items())
        for key, value in renamed.items():
            if hf_conv(key, value):
                renamed[key] = value.moveaxis(2, 1)  # (C, 1, taps) -> (C, taps, 1)
            elif hf_form and key.endswith(SHIFTED_NORMS) and value.ndim == 1:
                renamed[key] = value + 1.0
        return super().sanitize(renamed)


def text_config(params: Mapping[str, Any], text_types: Sequence[str]) -> dict:
    """An image-text config's text decoder fields (its `text_config`) over the top level, keeping
    the top level's model_type; a text-only config as it is."""
    inner = params.get("text_config")
    if not isinstance(inner, Mapping):
        return dict(params)
    if inner.get("model_type") not in (None, *text_types):
        raise MetalgenError(f"config.json: text_config has model_type '{inner.get('model_type')}', "
                            f"expected one of {', '.join(text_types)}")
    merged = {**params, **{k: v for k, v in inner.items() if k != "model_type"}}
    return merged
