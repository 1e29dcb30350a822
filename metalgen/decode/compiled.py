"""The "compiled" decode path: the model's own layers, traced once per layer by `mx.compile`.

For stacks the stacked paths do not carry yet (the hybrid Gated DeltaNet decoders). A Gated DeltaNet
layer's state has a fixed size, so its whole step (norms, projections, the conv and delta-rule
updates, the gated norm, the MLP or sparse block) compiles to one function of (x, conv state,
recurrent state). A full-attention layer's KV cache grows, so its step is two compiled functions
around the cache: before it, the norm, projections, q/k norms and RoPE (the position an array, so
one trace serves every position); after it, the gate, o_proj and the feed-forward half. Between them
the plain path's cache append and decode-attention kernel run as they are. MLX's CUDA backend pays
about 12 us a dispatched operation (H200), which is what this saves: every elementwise chain is one
kernel. The per-layer caches are the ones prefill filled, updated in place, so generation can hand
them back as a prompt cache.
"""

from __future__ import annotations

from typing import List

import mlx.core as mx

import kernels_metal as K

from ..cache import LinearAttnCache


class CompiledDecoder:
    """One token's step over per-layer caches, layer functions compiled (see the module doc)."""

    def __init__(self, model, cache: List, steps: List):
        """`steps`: `layer_steps(model, cache)`, made once per model (tracing is paid once, not per call)."""
        self.model = model
        self.cache = cache
        self.steps = steps

    def hidden(self, token: mx.array) -> mx.array:
        """token (1,) int32 -> final-norm hidden state (1, 1, hidden); advances every cache."""
        inner = self.model.model
        h = inner.embed_tokens(token[None])  # (1, 1, hidden)
        for layer, fn, c in zip(inner.layers, self.steps, self.cache):
            if isinstance(c, LinearAttnCache):
                h, c.conv_state, c.recurrent = fn(h, c.conv_state, c.recurrent)
                c.offset += 1
            else:  # fn: the two halves around the KV cache
                before, after = fn
                q, k, v, gate = before(h, mx.array(c.offset, mx.int32))
                c.update(k, v)
                o = K.decode_attention(q, c.keys, c.values, c.offset, layer.self_attn.scale)
                h = after(h, o, gate)
        return inner.norm(h)

    def step(self, token: mx.array) -> mx.array:
        """token (1,) -> logits (1, vocab)."""
        return self.model.logits(self.hidden(token)[:, -1, :])


def layer_steps(model, cache: List) -> List:
    """Per layer, compiled: a linear layer's whole step, an attention layer's two halves. Each kind
    first runs one uncompiled one-token pass, its results dropped: a kernel checks itself eagerly
    on its first use (kernels_metal.gpu), which cannot happen inside a trace."""
    x = model.model.embed_tokens(mx.zeros((1, 1), mx.int32))
    steps, warm = [], set()
    for layer, c in zip(model.model.layers, cache):
        linear = isinstance(c, LinearAttnCache)
        if linear:
            fn = _linear_step(layer)
            if linear not in warm:
                mx.eval(fn(x, c.conv_state, c.recurrent))
            steps.append(mx.compile(fn))
        else:
            before, after = _attention_halves(layer)
            if linear not in warm:
                q, _, _, gate = before(x, mx.array(0, mx.int32))
                mx.eval(after(x, q, gate))
            steps.append((mx.compile(before), mx.compile(after)))
        warm.add(linear)
    return steps


def _linear_step(layer):
    def step(x, conv_state, recurrent):
        cache = LinearAttnCache()
        cache.conv_state, cache.recurrent = conv_state, recurrent
        out = layer(x, None, cache)
        return out, cache.conv_state, cache.recurrent

    return step


def _attention_halves(layer):
    """A hybrid stack's gated attention layer around its cache: before(h, position) -> q, k turned at
    `position` (an int32 scalar), v, the output gate; after(h, o, gate) -> h. (The batch's step chains these
    layers from the same projections, attention_project: metalgen.batch_step.)"""
    attn = layer.self_attn
    project = attention_project(layer)

    def before(h, position):
        # h (1, 1, hidden), position () int32 -> q, k turned, v (1, heads, 1, D), gate (1, 1, heads * D)
        return project(layer.input_layernorm(h), position)

    def after(h, o, gate):
        h = h + attn.output(o, gate)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return before, after


def attention_project(layer):
    """A gated attention layer's projections of its normed input: (x (B, 1, hidden), position: an int32
    scalar, or one a row (B,)) -> q, k turned at the position, v (B, heads, 1, D), the output gate
    (B, 1, heads * D)."""
    attn = layer.self_attn

    def project(x, position):
        q, k, v, gate = attn.project(x)
        return attn.turn(q, position), attn.turn(k, position), v, gate

    return project


def supports(cache) -> bool:
    """Whether the compiled path can take over these caches (of a hybrid stack): batch 1, every
    linear layer's state already made by prefill (the traced function takes arrays, not None)."""
    return all(c.conv_state is not None and c.recurrent is not None and c.recurrent.shape[0] == 1
               for c in cache if isinstance(c, LinearAttnCache))
