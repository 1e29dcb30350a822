"""Where a hybrid (Gated DeltaNet) decode token's time goes on the compiled path.

    PYTHONPATH=. python3 benchmarks/hybrid_step_probe.py [dummy:qwen3.5-0.8b] [--iters 64]

After a 128-token prefill, each piece runs `--iters` times chained (its output feeds its next input,
one eval at the end, as pipelined decode enqueues them) and reports microseconds per call: a whole
token, one Gated DeltaNet layer's compiled step and its parts, one attention layer (its attention half
as the plain path runs it, and the compiled path's whole layer), the LM head. A part's figure includes MLX's per-operation dispatch, which is what decode pays.
"""

from __future__ import annotations

import argparse
import copy
import time

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K
from metalgen.api import load
from metalgen.cache import LinearAttnCache
from metalgen.decode.check import prefill_random
from metalgen.decode.compiled import CompiledDecoder, layer_steps


def per_call_us(fn, x, iters: int) -> float:
    """fn: x -> x-shaped array; chained `iters` times, evaluated once. Median of 3."""
    mx.eval(fn(x))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        y = x
        for _ in range(iters):
            y = fn(y)
        mx.eval(y)
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return sorted(times)[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="dummy:qwen3.5-0.8b")
    ap.add_argument("--iters", type=int, default=64)
    a = ap.parse_args()
    model, _ = load(a.model)
    logits, cache = prefill_random(model, 128)
    steps = layer_steps(model, cache)
    layers = model.model.layers
    lin = next(i for i, c in enumerate(cache) if isinstance(c, LinearAttnCache))
    att = next(i for i, c in enumerate(cache) if not isinstance(c, LinearAttnCache))
    n_lin = sum(isinstance(c, LinearAttnCache) for c in cache)
    print(f"{a.model}: {len(layers)} layers ({n_lin} Gated DeltaNet), backend {K.backend()}")

    dec = CompiledDecoder(model, [copy.copy(c) for c in cache], steps)
    tok = mx.argmax(logits, axis=-1).astype(mx.int32)
    whole = per_call_us(lambda t: mx.argmax(dec.step(t), axis=-1).astype(mx.int32), tok, a.iters)
    print(f"  whole token (compiled path, argmax)      {whole:9.1f} us  ({1e6 / whole:.1f} tok/s)")

    x = model.model.embed_tokens(tok[None])
    c = cache[lin]
    fn = steps[lin]
    print(f"  linear layer, compiled step              {per_call_us(lambda h: fn(h, c.conv_state, c.recurrent)[0], x, a.iters):9.1f} us")
    layer = layers[lin]
    gdn = layer.linear_attn
    xn = layer.input_layernorm(x)
    parts = {
        "input norm": lambda h: layer.input_layernorm(h),
        "projections": lambda h: h + gdn._project(h)[0][..., :h.shape[-1]],
        "conv (mx.conv1d)": lambda h: h + gdn._conv(mx.concatenate([h] * (gdn.spec.conv_dim // h.shape[-1] + 1), -1)[..., :gdn.spec.conv_dim], c)[..., :h.shape[-1]],
        "mixer (uncompiled)": lambda h: gdn(h, None, copy.copy(c)),
        "mixer (compiled)": mx.compile(lambda h: gdn(h, None, copy.copy(c))),
        "mlp (compiled)": mx.compile(lambda h: h + layer.mlp(layer.post_attention_layernorm(h))),
    }
    for name, f in parts.items():
        try:
            print(f"    {name:36s} {per_call_us(f, xn, a.iters):9.1f} us")
        except Exception as e:  # a part that does not chain is reported, not fatal
            print(f"    {name:36s} failed: {type(e).__name__}: {str(e)[:80]}")

    s = gdn.spec
    B = 1
    q = mx.random.normal((B, 1, s.num_key_heads, s.key_head_dim)).astype(x.dtype)
    v = mx.random.normal((B, 1, s.num_value_heads, s.value_head_dim)).astype(x.dtype)
    g = -mx.random.uniform(shape=(B, 1, s.num_value_heads))
    beta = mx.random.uniform(shape=(B, 1, s.num_value_heads))
    print(f"    {'gated delta kernel':36s} {per_call_us(lambda st: K.gated_delta(q, q, v, g, beta, st)[1], c.recurrent, a.iters):9.1f} us")

    ac = cache[att]
    attn = layers[att]
    half = lambda h: h + attn.self_attn(attn.input_layernorm(h), None, copy.copy(ac))
    print(f"  attention layer, attention half (plain)  {per_call_us(half, x, a.iters):9.1f} us")
    before, after = steps[att]

    def compiled_layer(h):
        kc = copy.copy(ac)
        q, k, v, gate = before(h, mx.array(kc.offset, mx.int32))
        kc.update(k, v)
        return after(h, K.decode_attention(q, kc.keys, kc.values, kc.offset, attn.self_attn.scale), gate)

    print(f"  attention layer, compiled halves         {per_call_us(compiled_layer, x, a.iters):9.1f} us")
    hid = model.model.norm(x)
    print(f"  LM head + argmax                         {per_call_us(lambda h: h + 0 * model.logits(h[:, -1, :]).max(), hid, a.iters):9.1f} us")
    print(f"  eval of one tiny op (sync floor)         {per_call_us(lambda h: h + 1, x, 1):9.1f} us")


if __name__ == "__main__":
    main()
