"""Which part of a prefill holds memory past the weights: the peak over each piece of one layer (the
embedding, attention, the router, the experts, the dense MLP) for a T-token chunk, then a whole
prefill evaluated at once and layer by layer. Each figure is the peak active memory above what was
live before the piece ran.

    python3 benchmarks/layer_memory_probe.py dummy:qwen3-30b-a3b-4bit [--tokens 128,2048] [--layer 0]
"""

from __future__ import annotations

import argparse
import gc

import mlx.core as mx
import numpy as np

from metalgen.api import load
from metalgen.cache import make_prompt_cache
from metalgen.models.decoder import causal_mask_for

MB = 1e6


def peak(fn):
    """(result, peak MB above the memory live before fn ran)."""
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    out = fn()
    mx.eval(out)
    mx.synchronize()
    return out, (mx.get_peak_memory() - base) / MB


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", default="128,2048")
    ap.add_argument("--layer", type=int, default=0)
    args = ap.parse_args()
    model, _ = load(args.model)
    inner = model.model
    layer = inner.layers[args.layer]
    vocab = model.spec.vocab_size
    for T in (int(t) for t in args.tokens.split(",")):
        ids = mx.array(np.random.default_rng(T).integers(0, vocab, (1, T)), mx.int32)
        mask = causal_mask_for(T)
        rows = []
        h, p = peak(lambda: inner.embed_tokens(ids))
        rows.append(("embedding", p, h.nbytes / MB))
        x, _ = peak(lambda: layer.input_layernorm(h))
        cache = make_prompt_cache(model)
        a, p = peak(lambda: layer.self_attn(x, mask, cache[args.layer]))
        rows.append(("attention", p, a.nbytes / MB))
        x2, _ = peak(lambda: layer.post_attention_layernorm(h + a))
        if "gate" in layer.mlp and "switch_mlp" in layer.mlp:
            r, p = peak(lambda: layer.mlp.gate(x2))
            rows.append(("router logits", p, r.nbytes / MB))
        m, p = peak(lambda: layer.mlp(x2))
        rows.append(("mlp", p, m.nbytes / MB))
        del a, x, x2, m, cache
        cache = make_prompt_cache(model)
        _, p = peak(lambda: [model.hidden(ids, cache=cache)] + [c.state for c in cache])
        rows.append(("prefill, one graph", p, 0.0))
        del cache
        cache = make_prompt_cache(model)

        def by_layer():
            y = inner.embed_tokens(ids)
            for lyr, c in zip(inner.layers, cache):
                y = lyr(y, mask, c)
                mx.eval(y, c.state)
            return y

        _, p = peak(by_layer)
        rows.append(("prefill, layer by layer", p, 0.0))
        del cache
        for name, p, out in rows:
            print(f"T {T:>5}  {name:<24} peak +{p:9.1f} MB  (output {out:7.1f} MB)", flush=True)


if __name__ == "__main__":
    main()
