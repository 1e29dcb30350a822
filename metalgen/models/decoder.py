"""The Qwen decoder stack, shared by every Qwen text model file and the speech talkers.

Qwen2/Qwen2.5 and Qwen3 differ only in their attention (q/k/v biases versus per-head q/k
norms, and whether head_dim is explicit), their MoE variants in the feed-forward of the sparse
layers (models/moe.py); the model files state those differences through `DecoderSpec` and keep
their own `ModelArgs`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K

from ..errors import MetalgenError
from .base import mask_for
from .layers import MLP, Linear, RMSNorm
from .moe import ExpertStacks, MoeSpec, SparseMoeBlock, sanitize_experts, stack_problem, stack_sparse_layers
from .rope import RoPE, RopeConfig


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    """The architecture of one decoder, resolved from a ModelArgs."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    qkv_bias: bool = False
    qk_norm: bool = False
    moe: Optional[MoeSpec] = None  # the sparse layers (MoE models); None: every layer is dense
    # hybrid stacks (Qwen3-Next, Qwen3.5: models/hybrid.py): which layers are Gated DeltaNet linear
    # attention and how those are shaped; None: every layer is softmax attention
    hybrid: Optional[Any] = None


def spec_from_args(args, **overrides) -> DecoderSpec:
    """The DecoderSpec of any ModelArgs that carries Hugging Face's field names; `overrides`
    state what the architecture fixes (biases, q/k norms...)."""
    if getattr(args, "use_sliding_window", False):
        # Released Qwen2.5/Qwen3 configs all say false; a true one would need masks we lack.
        raise MetalgenError("sliding-window attention (use_sliding_window: true) is not supported")
    heads = args.num_attention_heads
    spec = DecoderSpec(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        intermediate_size=args.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=args.num_key_value_heads or heads,
        head_dim=getattr(args, "head_dim", None) or args.hidden_size // heads,
        vocab_size=getattr(args, "vocab_size", 0),
        rms_norm_eps=args.rms_norm_eps,
        max_position_embeddings=args.max_position_embeddings,
        rope=RopeConfig.from_config(dataclasses.asdict(args)),
    )
    return dataclasses.replace(spec, **overrides)


def attend(q: mx.array, k: mx.array, v: mx.array, scale: float, mask=None, cache=None) -> mx.array:
    """Attention of q (B, Hq, L, D) over the new k, v (B, Hkv, L, D) appended to `cache` (if any):
    the decode kernel reads the cache in place for one unmasked token, SDPA takes the rest, among them
    a batch's prefill, whose array mask hides each row's left padding; a cache that attends itself (a
    batch's paged cache, metalgen.paged_cache: each row its own blocks and length) takes its decode step.
    -> (B, Hq, L, D)"""
    if cache is None:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    own = getattr(cache, "attend", None)
    if own is not None:
        return own(q, k, v, scale)
    if q.shape[2] == 1 and mask is None:
        cache.update(k, v)
        return K.decode_attention(q, cache.keys, cache.values, cache.offset, scale)
    keys, values = cache.update_and_fetch(k, v)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)


def rope_offset(cache):
    """Where RoPE turns the new tokens: the cache's length (0 without one), or for a batched cache
    (metalgen.batch_cache) each row's own position, a (B,) int32 array (rows are left-padded)."""
    if cache is None:
        return 0
    positions = getattr(cache, "positions", None)
    return cache.offset if positions is None else positions


class Attention(nn.Module):
    """Grouped-query attention; K/V heads are never repeated to match the query heads."""

    def __init__(self, spec: DecoderSpec, rope: RoPE):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.n_heads = spec.num_attention_heads
        self.n_kv_heads = spec.num_key_value_heads
        self.head_dim = d
        self.scale = d**-0.5
        self.q_proj = Linear(h, self.n_heads * d, bias=spec.qkv_bias)
        self.k_proj = Linear(h, self.n_kv_heads * d, bias=spec.qkv_bias)
        self.v_proj = Linear(h, self.n_kv_heads * d, bias=spec.qkv_bias)
        self.o_proj = Linear(self.n_heads * d, h, bias=False)
        if spec.qk_norm:
            self.q_norm = RMSNorm(d, spec.rms_norm_eps)
            self.k_norm = RMSNorm(d, spec.rms_norm_eps)
        self._rope = rope

    def projections(self, x: mx.array):
        """x (B, L, hidden) -> the q, k, v projections (B, L, heads * D), as they come out of the layers."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def project(self, x: mx.array, offset, position_ids=None):
        """x (B, L, hidden) -> q, k turned at positions offset .. (an int, or an int32 array: a scalar or
        one start a row), v: each (B, heads, L, D)."""
        return self.heads(*self.projections(x), offset, position_ids)

    def heads(self, q: mx.array, k: mx.array, v: mx.array, offset, position_ids=None):
        """The projections q, k, v (B, L, heads * D) -> per head (B, heads, L, D), q and k normed (Qwen3)
        and turned at positions offset .. (as `project`)."""
        B, L, _ = q.shape
        # (B, L, heads * D) -> (B, L, heads, D); per-head norms act on D before RoPE
        q = q.reshape(B, L, self.n_heads, self.head_dim)
        k = k.reshape(B, L, self.n_kv_heads, self.head_dim)
        v = v.reshape(B, L, self.n_kv_heads, self.head_dim)
        if "q_norm" in self:
            q = self.q_norm(q)
            k = self.k_norm(k)
        # -> (B, heads, L, D)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        if position_ids is None:
            return self._rope(q, offset), self._rope(k, offset), v
        # explicit positions (M-RoPE: (3, B, L)); only rope objects that take them get them
        return self._rope(q, offset, position_ids), self._rope(k, offset, position_ids), v

    def output(self, o: mx.array) -> mx.array:
        """The attention output o (B, heads, L, D) through o_proj -> (B, L, hidden)."""
        B, _, L, _ = o.shape
        # (B, heads, L, D) -> (B, L, heads * D)
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def __call__(self, x: mx.array, mask=None, cache=None, position_ids=None) -> mx.array:
        q, k, v = self.project(x, rope_offset(cache), position_ids)
        return self.output(attend(q, k, v, self.scale, mask, cache))


class DecoderLayer(nn.Module):
    """Pre-norm block: attention and the feed-forward (a dense MLP, or in the sparse layers of an
    MoE model the SparseMoeBlock), each added back to the residual stream."""

    def __init__(self, spec: DecoderSpec, rope: RoPE, sparse: bool = False):
        super().__init__()
        self.self_attn = Attention(spec, rope)
        if sparse:
            self.mlp = SparseMoeBlock(spec.hidden_size, spec.moe)
        else:
            self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def __call__(self, x: mx.array, mask=None, cache=None, position_ids=None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache, position_ids)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderModel(nn.Module):
    """Embedding, the layer stack and the final norm: the checkpoint's `model.*` subtree.

    `rope` replaces the plain RoPE the spec describes (the speech talker passes an M-RoPE);
    `embed_tokens=False` leaves out the token embedding for stacks that are only ever fed
    `input_embeddings` (the speech talker and code predictor keep their own embeddings).
    """

    def __init__(self, spec: DecoderSpec, rope=None, embed_tokens: bool = True):
        super().__init__()
        self.spec = spec
        # the sparse layers' experts stacked across layers (MoE models, `pack_experts`); the layers
        # hold views of these arrays. Underscored: not parameters of their own.
        self._expert_stacks: Optional[ExpertStacks] = None
        if rope is None:
            rope = RoPE(spec.rope, spec.head_dim, spec.max_position_embeddings)
        if embed_tokens:
            self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = [self.make_layer(spec, rope, i) for i in range(spec.num_hidden_layers)]
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def make_layer(self, spec: DecoderSpec, rope, index: int) -> nn.Module:
        """Layer `index` of the stack (hybrid stacks choose their token mixer per layer)."""
        return DecoderLayer(spec, rope, spec.moe is not None and spec.moe.is_sparse(index))

    def __call__(
        self,
        inputs: Optional[mx.array] = None,
        cache: Optional[List[Any]] = None,
        input_embeddings: Optional[mx.array] = None,
        position_ids: Optional[mx.array] = None,
        layer_by_layer: bool = False,
    ) -> mx.array:
        """Final-norm hidden states.

        layer_by_layer: evaluate as the stack goes, one layer queued behind the one running, instead
            of building one graph for the whole stack. For prompt chunks: a whole-stack graph keeps
            every layer's temporaries until the device reaches them (Qwen3-30B-A3B 4-bit, 2048
            tokens, H200: 5.8 GB past the weights, against 0.4 GB a layer at a time).
        """
        # inputs: (B, L) token ids, or input_embeddings: (B, L, hidden) given directly;
        # position_ids: only for a rope that takes explicit positions (M-RoPE: (3, B, L))
        h = self.embed_tokens(inputs) if input_embeddings is None else input_embeddings
        mask = mask_for(h.shape[1], cache)
        if cache is None:
            cache = [None] * len(self.layers)
        queued = None
        for layer, layer_cache in zip(self.layers, cache):
            if position_ids is None:
                h = layer(h, mask, layer_cache)
            else:
                h = layer(h, mask, layer_cache, position_ids)
            if layer_by_layer:
                # the cache's new state with the output: a state left lazy would keep its inputs
                mx.async_eval(h, [] if layer_cache is None else layer_cache.state)
                if queued is not None:
                    mx.eval(queued)
                queued = h
        return self.norm(h)

    def pack_experts(self, weights: dict, prefix: str = "") -> dict:
        """Stack the sparse layers' experts in `weights` (`{prefix}layers.{i}.mlp.switch_mlp...`)
        across layers (moe.stack_sparse_layers, a layer at a time) and return `weights` with those
        entries replaced by views of the stacks, which `expert_stacks` then gives. Weights whose
        sparse layers differ in layout (shapes, quantization) are returned unchanged."""
        moe = self.spec.moe
        self._expert_stacks = None
        if moe is None:
            return weights

        def name(layer, key):
            return f"{prefix}layers.{layer}.mlp.switch_mlp.{key}"

        def shape_of(layer, key):
            a = weights.get(name(layer, key))
            return None if a is None else (tuple(a.shape), a.dtype)

        if stack_problem(self, moe, shape_of) is not None:
            return weights
        stacks = stack_sparse_layers(self, moe, lambda layer, key: weights.pop(name(layer, key)))
        for views, layer in zip(stacks.views, moe.sparse_layers):
            for key, view in zip(stacks.keys, views):
                weights[name(layer, key)] = view
        self._expert_stacks = stacks
        return weights

    def expert_stacks(self) -> Optional[ExpertStacks]:
        """The stacks that `pack_experts` made, if the layers still hold their views (None otherwise,
        and for dense models)."""
        moe = self.spec.moe
        st = self._expert_stacks
        if moe is None or st is None or not st.valid_for(self, moe.sparse_layers):
            return None
        return st


class CausalLM(nn.Module):
    """Decoder plus LM head (tied to the embedding or its own `lm_head`). Returns logits."""

    decoder_class = DecoderModel  # the `model.*` subtree (hybrid stacks: models/hybrid.py)

    def __init__(self, spec: DecoderSpec, tie_word_embeddings: bool):
        super().__init__()
        self.model = self.decoder_class(spec)
        if not tie_word_embeddings:
            self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)

    @property
    def spec(self) -> DecoderSpec:
        return self.model.spec

    @property
    def layers(self):
        return self.model.layers

    def __call__(self, inputs=None, cache=None, input_embeddings=None) -> mx.array:
        """Logits (B, L, vocab) for token ids (B, L) or embeddings (B, L, hidden)."""
        return self.logits(self.hidden(inputs, cache, input_embeddings))

    def hidden(self, inputs=None, cache=None, input_embeddings=None, layer_by_layer: bool = False) -> mx.array:
        """Final-norm hidden states (B, L, hidden), before the LM head (`layer_by_layer`: see
        DecoderModel.__call__; generation sets it for prompt chunks)."""
        return self.model(inputs, cache, input_embeddings, layer_by_layer=layer_by_layer)

    def logits(self, h: mx.array) -> mx.array:
        """The LM head. Generation applies it to the last position only, which spares the
        head's (vocab x hidden) product for every other prompt token."""
        if "lm_head" in self:
            return self.lm_head(h)
        # the tied head through the kernel library, as an untied lm_head goes (MLX's own as_linear would
        # bypass it: on the CPU a 4-bit tied head so took 1.1 s a token for qwen3-0.6b, 2026-11-27)
        emb = self.model.embed_tokens
        if isinstance(emb, nn.QuantizedEmbedding):
            return K.quantized_linear(h, emb["weight"], emb["scales"], emb.get("biases"), emb.group_size, emb.bits)
        return K.linear(h, emb.weight)

    def sanitize(self, weights: dict) -> dict:
        """Drop checkpoint entries that carry no parameters of ours; MoE experts in any published
        layout become the stacked `switch_mlp` tensors (models/moe.py)."""
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if "lm_head" not in self:
            # Tied checkpoints sometimes also store the head; it equals the embedding.
            weights.pop("lm_head.weight", None)
        if self.spec.moe is not None:
            weights = sanitize_experts(weights, self.spec.moe.num_experts)
        return weights

    def pack_weights(self, weights: dict) -> dict:
        """The loader's last step before the weights go in: the experts of MoE models stacked
        across layers (DecoderModel.pack_experts)."""
        return self.model.pack_experts(weights, prefix="model.")
