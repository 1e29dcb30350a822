"""Megakernel time per token against the grid size (diagnoses the grid-barrier cost)."""
import os, sys, time
import mlx.core as mx
from metalgen.api import load
from metalgen.decode.path import stacked_weights
from metalgen.decode.gpu import MegakernelDecoder
from metalgen.decode.stacked import DecodeState

m, _ = load("dummy:qwen2.5-0.5b")
w = stacked_weights(m)
for nb in [int(x) for x in sys.argv[1:]]:
    dec = MegakernelDecoder(w, blocks=nb)
    z = mx.zeros((w.layers, w.kv_heads, 512, w.head_dim), w.dtype)
    st = dec.prepare(DecodeState(z, mx.array(z) + 0, 0, 512))
    tok = mx.array([5], mx.int32)
    mx.eval(dec.step(st, tok))
    tic = time.perf_counter()
    for _ in range(20):
        h = dec.step(st, tok)
    mx.eval(h)
    print(f"blocks {nb}: {(time.perf_counter() - tic) / 20 * 1e3:.3f} ms/token", flush=True)
