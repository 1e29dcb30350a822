"""The running batch's decode step (metalgen.batch): the model's own layers over the paged cache, each
attention layer as two traced halves around the cache.

Why traced: a batched step is bound by the number of MLX operations, not by bytes (qwen3-0.6b: about 8 ms
a step at 1 to 64 rows on the H200, against 0.5 ms to read its weights; MLX's CUDA backend pays ~10 us an
operation). `mx.compile` makes each half one replayed trace, its elementwise chains single kernels, and
spares the Python of every module call. Before the cache: the norm, q/k/v projections, q/k norms and RoPE
at each row's position (an int32 array: one trace serves every step of a batch size). Then the paged
cache's write and attention kernel, as they are. After: o_proj, the residual, the norm and the MLP.

Fewer launches a layer, since each costs the host ~10 us whatever its size: on CUDA a dense stack's layers
read their q/k/v and gate/up projections as one product each, through views of the stacked weights (the
rows of a layer's q, k and v are consecutive there: metalgen.decode.stacked, the single-sequence paths'
own layout, built once for both), and qk_rope_store reads q, k and v in place from the one projection;
each residual add goes with the norm after it (kernels_metal.add_rms_norm: one launch for two), the MLP's
add deferred to the next layer's input norm (or the final norm). 15 launches a layer become 9.

The halves are traced for each batch size met (MLX keys a trace by its input shapes), so the step runs
its rows padded up to a multiple of ROW_BUCKET (`rows`; the padding rows are the paged
cache's, PagedBatchCache.begin_step): a batch whose size moves as requests come and go meets 4 sizes up to
32 rows rather than 28, each traced, and its kernels built, the first time it occurs (seconds for a size new
to the machine, measured mid-traffic: benchmarks/results/batch_step_h200_2026-11-26), and the server can
warm them all at start-up (metalgen.serve.warmup.warm_batch). Padding rows cost the device little: the
step's products read each weight once for any rows; a hybrid stack's Gated DeltaNet states are padded
where the batch's size changes, not every step (paged_cache.LinearRowStates.pad). The halves run only above
kernels_metal.GEMV_MAX_ROWS rows: at fewer rows the products may be custom GEMV kernels, which check
themselves eagerly on first use, which a trace cannot do; those steps run the layers as they are. A
sparse (MoE) layer's feed-forward half stays untraced for the same reason (its routing kernels).

A hybrid stack's layers are chained the same way: a Gated DeltaNet layer around its conv-and-delta-rule
step (one kernels_metal.gated_delta_conv_step launch over the rows' states, untraced: it checks itself
eagerly too), a gated attention layer around the paged cache; the output gate (z, or the attention's gate)
goes from the first half to the second, and each residual add goes with the norm after it as in a dense
layer (2 launches a layer fewer than adding apart; not measured on a GPU yet).
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K

from .decode.compiled import attention_project
from .decode.path import AUTO_MEGAKERNEL, stacked_weights
from .decode.stacked import unsupported_reason
from .models.decoder import DecoderLayer
from .models.hybrid import HybridLayer
from .models.layers import MLP, linear_like, split_last
from .models.rope import RoPE
from .paged_cache import PagedBatchCache


class _Chained(NamedTuple):
    """A decoder layer's halves passing its residual on: `first(h, positions)` or, with the previous layer's
    MLP output still to add, `next(h, delta, positions)` -> (h, what `middle` takes); `middle(cache, ...)`;
    `after(h, ...)` -> (h, its MLP output, to add in the next layer)."""

    first: Callable
    next: Callable
    middle: Callable
    after: Callable


ROW_BUCKET = 8  # a traced step's rows are padded up to a multiple of this (see the module doc)


class BatchStep:
    """One decode step of the batch: tokens (B,) over a PagedBatchCache -> final-norm hidden states."""

    def __init__(self, model, fuse: Optional[bool] = None):
        """fuse: read a dense stack's q/k/v and gate/up as one product each (_fused_projections). None: where
        the single-sequence paths stack the weights anyway (decode.path.AUTO_MEGAKERNEL: CUDA, where a
        launch costs the host ~10 us); elsewhere stacking would hold a second copy of the largest weights while it runs (an 8B bf16
        model: ~10 GB more at its peak), for a launch cost not measured there."""
        self.model = model
        if fuse is None:
            fuse = K.backend() in AUTO_MEGAKERNEL
        # per layer (q/k/v, gate/up) as one product each (a dense stack), else None
        self.fused = _fused_projections(model) if fuse else None
        self.halves: List[Optional[_Chained]] = [_halves(layer, self.fused[i] if self.fused else None)
                                              for i, layer in enumerate(model.model.layers)]
        if any(isinstance(hv, _Chained) for hv in self.halves):
            _prime_add_rms_norm(model.model)

    def rows(self, batch: int) -> int:
        """The rows a step of `batch` rows runs, padding included: for cache.begin_step(rows)."""
        if batch <= K.GEMV_MAX_ROWS:
            return batch
        return -(-batch // ROW_BUCKET) * ROW_BUCKET

    def hidden(self, tokens: mx.array, cache: PagedBatchCache) -> mx.array:
        """tokens (B,) int32 -> (B, 1, hidden); writes each row's next position (cache.begin_step first, its
        rows padded or not: the padding rows' tokens are id 0 and their states are dropped)."""
        B = tokens.shape[0]
        padded = cache.positions.shape[0]
        if padded > B:
            tokens = mx.concatenate([tokens, mx.zeros((padded - B,), mx.int32)])
        h = self._hidden(tokens, cache)
        return h[:B] if padded > B else h

    def _hidden(self, tokens: mx.array, cache: PagedBatchCache) -> mx.array:
        inner = self.model.model
        h = inner.embed_tokens(tokens[:, None])  # (B, 1, hidden)
        traced = tokens.shape[0] > K.GEMV_MAX_ROWS
        positions = cache.positions
        delta = None  # the last chained layer's MLP output, not yet added to h
        for layer, halves, c in zip(inner.layers, self.halves, cache.layers):
            if isinstance(halves, _Chained) and traced:
                h, *mid = halves.first(h, positions) if delta is None else halves.next(h, delta, positions)
                h, delta = halves.after(h, *halves.middle(c, *mid))
                continue
            if delta is not None:
                h, delta = h + delta, None
            h = layer(h, None, c)
        if delta is None:
            return inner.norm(h)
        return K.add_rms_norm(delta, h, inner.norm.weight, inner.norm.eps)[0]


def _fused_rope(attn) -> bool:
    """Whether an attention layer's norms, RoPE and cache write can be one qk_rope_store launch: a plain
    rotary table over the whole head (not M-RoPE, not a partial rotation) of a multiple of 64 dims."""
    rope = attn._rope
    return isinstance(rope, RoPE) and rope.table.dims == attn.head_dim and attn.head_dim % 64 == 0


def _fused_projections(model) -> Optional[List[Tuple]]:
    """Per layer (its q/k/v projection, its gate/up projection) as single layers over views of the stacked
    weights (metalgen.decode.path.stacked_weights, which also points the model's own q/k/v and gate/up at
    views of the same arrays: nothing is held twice), for a dense stack the stacked paths take; else None."""
    spec = model.spec
    if spec.moe is not None or spec.hybrid is not None or unsupported_reason(model) is not None:
        return None
    w = stacked_weights(model)
    like = model.model.layers[0].self_attn.q_proj
    out = []
    for i in range(w.layers):
        # a layer's slice of a stack: `[i, ...]` is a view, where a bare integer index would gather a copy
        qkv = {"weight": w.wqkv[i, ...]}
        gate_up = {"weight": w.wgu[i, ...].reshape(-1, w.wgu.shape[-1])}  # (2, I, H') -> (2I, H'): gate rows, up rows
        if w.quant is not None:
            for name, key in (("scales", 0), ("biases", 1)):
                qkv[name] = w.quant.params["wqkv"][key][i, ...]
                gu = w.quant.params["wgu"][key]
                gate_up[name] = gu[i, ...].reshape(-1, gu.shape[-1])
        if w.has_bias:
            qkv["bias"] = w.bqkv[i, ...]
        out.append((linear_like(like, qkv), linear_like(like, gate_up)))
    return out


def _prime_add_rms_norm(inner) -> None:
    """kernels_metal.add_rms_norm's first use, eagerly: a kernel checks itself then, which a trace cannot do."""
    norm = inner.norm
    x = mx.zeros((1, 1, norm.weight.shape[0]), inner.layers[0].input_layernorm.weight.dtype)
    mx.eval(K.add_rms_norm(x, x, norm.weight, norm.eps))


def _halves(layer, fused: Optional[Tuple]) -> Optional[_Chained]:
    """The chained halves of a layer (None for a layer of another kind: it runs as it is): a decoder
    layer's (_dense_halves), a hybrid stack's (_hybrid_halves)."""
    if type(layer) is HybridLayer:
        return _hybrid_halves(layer)
    if type(layer) is not DecoderLayer:
        return None
    return _dense_halves(layer, fused)


def _chain(layer, project: Callable, middle: Callable, output: Callable, feed_forward: Callable) -> _Chained:
    """A layer's chained halves from its parts: project(x, positions), the entry's work on the input norm's
    output; middle(cache, ...) around the cache; output(*what middle gives) -> the mixer's output (B, 1, hidden),
    added to the residual with the post-attention norm in one add_rms_norm launch; feed_forward(y) -> the
    MLP's output, added by the next layer's input norm. The entries and `after` are traced (`after` only
    where the feed-forward is a dense MLP: a sparse block's routing kernels check themselves eagerly)."""

    def first(h, positions):
        return (h, *project(layer.input_layernorm(h), positions))

    def next_(h, delta, positions):
        norm = layer.input_layernorm
        x, h = K.add_rms_norm(delta, h, norm.weight, norm.eps)  # h + delta, and its norm
        return (h, *project(x, positions))

    def after(h, *mixed):
        norm = layer.post_attention_layernorm
        y, h = K.add_rms_norm(output(*mixed), h, norm.weight, norm.eps)
        return h, feed_forward(y)

    traced_after = mx.compile(after) if isinstance(layer.mlp, MLP) else after
    return _Chained(mx.compile(first), mx.compile(next_), middle, traced_after)


def _dense_halves(layer, fused: Optional[Tuple]) -> _Chained:
    """A decoder layer's halves, `first`/`next` and `after` traced. Where the layer allows it (_fused_rope),
    the entry ends at the q/k/v projection(s) and `middle` is the paged cache's qk_rope_store + attention
    (two launches for the norms, RoPE, the cache write and attention); otherwise the entry runs through RoPE
    and `middle` is the cache's own attend. `fused`: (qkv, gate_up) single products (_fused_projections)."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = fused if fused is not None else (None, None)
    d = attn.head_dim
    sizes = (attn.n_heads * d, attn.n_kv_heads * d, attn.n_kv_heads * d)
    rope_store = _fused_rope(attn)

    def project(x, positions):
        if rope_store:
            # x (B, 1, hidden) -> the q, k, v projections (B, 1, heads * D), or one (B, 1, (Hq + 2 Hkv) D)
            return (qkv(x),) if qkv is not None else attn.projections(x)
        # -> q, k turned at each row's position, v: (B, heads, 1, D)
        return attn.heads(*(split_last(qkv(x), sizes) if qkv is not None else attn.projections(x)), positions)

    if rope_store:
        norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps) if "q_norm" in attn else (None, None, 0.0)

        def middle(c, *proj):
            q, k, v = proj if qkv is None else (proj[0], None, None)  # one projection: read in place
            return (c.attend_projected(q, k, v, *norms, attn._rope.table, attn.scale),)
    else:
        def middle(c, q, k, v):
            return (c.attend(q, k, v, attn.scale),)

    def feed_forward(y):
        if gate_up is None:
            return mlp(y)
        g, u = mx.split(gate_up(y), 2, axis=-1)  # (B, 1, 2I) -> two halves of I
        return mlp.down_proj(nn.silu(g) * u)

    return _chain(layer, project, middle, attn.output, feed_forward)


def _hybrid_halves(layer) -> _Chained:
    """A hybrid stack's layer chained as a dense one's (_Chained): a Gated DeltaNet layer around its step over
    the rows' states, a gated attention layer around the paged cache, each carrying its output gate through
    `middle`; the residual add before the post-attention norm is one add_rms_norm launch, and the MLP's
    output is added by the next layer's input norm."""
    if "linear_attn" in layer:
        lin = layer.linear_attn

        def project(x, positions):
            # x (B, 1, hidden) -> mixed q|k|v (B, 1, conv_dim), z (B, 1, Hv, Dv), b, a (B, 1, Hv)
            return lin.project(x)

        def middle(c, mixed, z, b, a):
            return lin.step(mixed, b, a, c), z

        output = lin.output  # (o, z)
    else:
        attn = layer.self_attn
        # the compiled single-sequence path's: positions (B,) turn each row at its own
        project = attention_project(layer)

        def middle(c, q, k, v, gate):
            return c.attend(q, k, v, attn.scale), gate

        output = attn.output  # (o, gate)

    return _chain(layer, project, middle, output, layer.mlp)
