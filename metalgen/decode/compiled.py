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
        """`steps`: `layer_steps(model)`, made once per model (tracing is paid once, not per call)."""
        self.model = model
        self.cache = cache
        self.steps = steps

    def hidden(self, token: mx.array) -> mx.array:
        """token (1,) int32 -> final-norm hidden state (1, 1, hidden); advances every cache."""
        inner = self.model.model
        h = inner.embed_tokens(token[None])  # (1, 1, hidden)
        for (kind, fn), c in zip(self.steps, self.cache):
            if kind == "linear":
                h, c.conv_state, c.recurrent = fn(h, c.conv_state, c.recurrent)
                c.offset += 1
            else:
                layer, ffn = fn
                h = ffn(h + layer.self_attn(layer.input_layernorm(h), None, c))
        return inner.norm(h)

    def step(self, token: mx.array) -> mx.array:
        """token (1,) -> logits (1, vocab)."""
        return self.model.logits(self.hidden(token)[:, -1, :])


def layer_steps(model, cache: List) -> List:
    """Per layer ("linear", compiled step) or ("attention", (layer, compiled feed-forward half)),
    after one uncompiled one-token pass through each kind, its results dropped: a kernel checks
    itself eagerly on its first use (kernels_metal.gpu), which cannot happen inside a trace."""
    inner = model.model
    x = inner.embed_tokens(mx.zeros((1, 1), mx.int32))
    steps, warm = [], set()
    for layer, c in zip(inner.layers, cache):
        if isinstance(c, LinearAttnCache):
            if "linear" not in warm:
                mx.eval(_linear_step(layer)(x, c.conv_state, c.recurrent))
                warm.add("linear")
            steps.append(("linear", mx.compile(_linear_step(layer))))
        else:
            if "attention" not in warm:
                mx.eval(_feed_forward(layer)(x))
                warm.add("attention")
            steps.append(("attention", (layer, mx.compile(_feed_forward(layer)))))
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


def supports(model, cache) -> bool:
    """Whether the compiled path can take over these caches: a hybrid stack, batch 1, every linear
    layer's state already made by prefill (the traced function takes arrays, not None)."""
    spec = getattr(model, "spec", None)
    if spec is None or spec.hybrid is None or cache is None:
        return False
    for c in cache:
        if isinstance(c, LinearAttnCache) and (c.conv_state is None or c.recurrent is None
                                               or c.recurrent.shape[0] != 1):
            return False
    return True
