"""The "compiled" decode path: the model's own layers, traced once per layer by `mx.compile`.

For stacks the stacked paths do not carry yet (the hybrid Gated DeltaNet decoders). A Gated DeltaNet
layer's state has a fixed size, so its whole step (norms, projections, the conv and delta-rule
updates, the gated norm, the MLP or sparse block) compiles to one function of (x, conv state,
recurrent state); a full-attention layer's KV cache grows, so its attention stays as the plain path
runs it and only its feed-forward half is compiled. Either way the per-layer caches are the ones
prefill filled, updated in place, so generation can hand them back as a prompt cache.
"""

from __future__ import annotations

from typing import List

import mlx.core as mx

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
            else:  # fn: the feed-forward half
                h = fn(h + layer.self_attn(layer.input_layernorm(h), None, c))
        return inner.norm(h)

    def step(self, token: mx.array) -> mx.array:
        """token (1,) -> logits (1, vocab)."""
        return self.model.logits(self.hidden(token)[:, -1, :])


def layer_steps(model, cache: List) -> List:
    """Per layer, compiled: a linear layer's whole step, an attention layer's feed-forward half. Each
    kind first runs one uncompiled one-token pass, its results dropped: a kernel checks itself eagerly
    on its first use (kernels_metal.gpu), which cannot happen inside a trace."""
    x = model.model.embed_tokens(mx.zeros((1, 1), mx.int32))
    steps, warm = [], set()
    for layer, c in zip(model.model.layers, cache):
        linear = isinstance(c, LinearAttnCache)
        fn = _linear_step(layer) if linear else _feed_forward(layer)
        if linear not in warm:
            mx.eval(fn(x, c.conv_state, c.recurrent) if linear else fn(x))
            warm.add(linear)
        steps.append(mx.compile(fn))
    return steps


def _linear_step(layer):
    def step(x, conv_state, recurrent):
        cache = LinearAttnCache()
        cache.conv_state, cache.recurrent = conv_state, recurrent
        out = layer(x, None, cache)
        return out, cache.conv_state, cache.recurrent

    return step


def _feed_forward(layer):
    def ffn(h):
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return ffn


def supports(cache) -> bool:
    """Whether the compiled path can take over these caches (of a hybrid stack): batch 1, every
    linear layer's state already made by prefill (the traced function takes arrays, not None)."""
    return all(c.conv_state is not None and c.recurrent is not None and c.recurrent.shape[0] == 1
               for c in cache if isinstance(c, LinearAttnCache))
