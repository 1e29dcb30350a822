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
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import mlx.core as mx

import kernels_metal as K

from .models.decoder import DecoderLayer
from .models.layers import MLP
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
            before, after = halves
            q, k, v = before(h, cache.positions)
            h = after(h, c.attend(q, k, v, layer.self_attn.scale))
        return inner.norm(h)


def _halves(layer) -> Optional[Tuple]:
    """The traced halves of a decoder layer (None for a layer of another kind: it runs as it is)."""
    if type(layer) is not DecoderLayer:
        return None
    attn = layer.self_attn

    def before(h, positions):
        # h (B, 1, hidden), positions (B,) int32 -> q, k turned, v: (B, heads, 1, D)
        return attn.project(layer.input_layernorm(h), positions)

    def after(h, o):
        h = h + attn.output(o)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return mx.compile(before), (mx.compile(after) if isinstance(layer.mlp, MLP) else after)
