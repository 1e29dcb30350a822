"""The running batch's decode step (metalgen.batch): the model's own layers over the paged cache, each
attention layer as two traced halves around the cache.

Why traced: a batched step is bound by the number of MLX operations, not by bytes (qwen3-0.6b: about 8 ms
a step at 1 to 64 rows on the H200, against 0.5 ms to read its weights; MLX's CUDA backend pays ~10 us an
operation). `mx.compile` makes each half one replayed trace, its elementwise chains single kernels, and
spares the Python of every module call. Before the cache: the norm, q/k/v projections, q/k norms and RoPE
at each row's position (an int32 array: one trace serves every step of a batch size). Then the paged
cache's write and attention kernel, as they are. After: o_proj, the residual, the norm and the MLP.

The halves are traced for each batch size met (MLX keys a trace by its input shapes) and only above
kernels_metal.GEMV_MAX_ROWS rows: at fewer rows the products may be custom GEMV kernels, which check
themselves eagerly on first use, which a trace cannot do; those steps run the layers as they are. A
sparse (MoE) layer's feed-forward half stays untraced for the same reason (its routing kernels).

A hybrid stack's layers split the same way: a Gated DeltaNet layer around its conv-and-delta-rule step
(one kernels_metal.gated_delta_conv_step launch over the rows' states, untraced: it checks itself eagerly
too), a gated attention layer around the paged cache; the output gate (z, or the attention's gate) goes
from the first half to the second.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import mlx.core as mx

import kernels_metal as K

from .models.decoder import DecoderLayer
from .models.hybrid import HybridLayer
from .models.layers import MLP
from .models.rope import RoPE
from .paged_cache import PagedBatchCache


class BatchStep:
    """One decode step of the batch: tokens (B,) over a PagedBatchCache -> final-norm hidden states."""

    def __init__(self, model):
        self.model = model
        self.halves: List[Optional[Tuple]] = [_halves(layer) for layer in model.model.layers]

    def hidden(self, tokens: mx.array, cache: PagedBatchCache) -> mx.array:
        """tokens (B,) int32 -> (B, 1, hidden); writes each row's next position (cache.begin_step first)."""
        inner = self.model.model
        h = inner.embed_tokens(tokens[:, None])  # (B, 1, hidden)
        traced = tokens.shape[0] > K.GEMV_MAX_ROWS
        for layer, halves, c in zip(inner.layers, self.halves, cache.layers):
            if halves is None or not traced:
                h = layer(h, None, c)
                continue
            before, middle, after = halves
            h = after(h, *middle(c, *before(h, cache.positions)))
        return inner.norm(h)


def _fused_rope(attn) -> bool:
    """Whether an attention layer's norms, RoPE and cache write can be one qk_rope_store launch: a plain
    rotary table over the whole head (not M-RoPE, not a partial rotation) of a multiple of 64 dims."""
    rope = attn._rope
    return isinstance(rope, RoPE) and rope.table.dims == attn.head_dim and attn.head_dim % 64 == 0


def _halves(layer) -> Optional[Tuple]:
    """(before, middle, after) of a decoder layer, before and after traced (None for a layer of another kind:
    it runs as it is); `middle` returns what `after` takes past h. Where the layer allows it (_fused_rope),
    `before` ends at the q/k/v projections and `middle` is the paged cache's qk_rope_store + attention (two
    launches for the norms, RoPE, the cache write and attention); otherwise `before` runs through RoPE and
    `middle` is the cache's own attend."""
    if type(layer) is HybridLayer:
        return _hybrid_halves(layer)
    if type(layer) is not DecoderLayer:
        return None
    attn = layer.self_attn
    if _fused_rope(attn):
        norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps) if "q_norm" in attn else (None, None, 0.0)

        def before(h, positions):
            # h (B, 1, hidden) -> the q, k, v projections (B, 1, heads * D)
            return attn.projections(layer.input_layernorm(h))

        def middle(c, q, k, v):
            return (c.attend_projected(q, k, v, *norms, attn._rope.table, attn.scale),)
    else:
        def before(h, positions):
            # h (B, 1, hidden), positions (B,) int32 -> q, k turned, v: (B, heads, 1, D)
            return attn.project(layer.input_layernorm(h), positions)

        def middle(c, q, k, v):
            return (c.attend(q, k, v, attn.scale),)

    def after(h, o):
        h = h + attn.output(o)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return _traced(layer, before, middle, after)


def _hybrid_halves(layer) -> Tuple:
    """(before, middle, after) of a hybrid stack's layer: a Gated DeltaNet layer around its step over the
    rows' states, a gated attention layer around the paged cache; each carries its output gate through."""
    if "linear_attn" in layer:
        lin = layer.linear_attn

        def before(h, positions):
            # h (B, 1, hidden) -> mixed q|k|v (B, 1, conv_dim), z (B, 1, Hv, Dv), b, a (B, 1, Hv)
            return lin.project(layer.input_layernorm(h))

        def middle(c, mixed, z, b, a):
            return lin.step(mixed, b, a, c), z

        def mix(o, z):
            return lin.output(o, z)
    else:
        attn = layer.self_attn

        def before(h, positions):
            # h (B, 1, hidden), positions (B,) -> q, k turned, v (B, heads, 1, D), gate (B, 1, heads * D)
            q, k, v, gate = attn.project(layer.input_layernorm(h))
            return attn.turn(q, positions), attn.turn(k, positions), v, gate

        def middle(c, q, k, v, gate):
            return c.attend(q, k, v, attn.scale), gate

        def mix(o, gate):
            return attn.output(o, gate)

    def after(h, o, gate):
        h = h + mix(o, gate)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return _traced(layer, before, middle, after)


def _traced(layer, before, middle, after) -> Tuple:
    """The halves with `before` traced, and `after` where the feed-forward is a dense MLP."""
    return mx.compile(before), middle, (mx.compile(after) if isinstance(layer.mlp, MLP) else after)
