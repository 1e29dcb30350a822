"""The Magpie decoder kernel (kernels_metal.magpie_decoder_step) on the 357M shapes with random weights:
kernel against its reference (and the model's own MLX decoder) over several steps and positions, in
float32 and bfloat16, then milliseconds per step of the kernel against the eager MLX path the frame loop
runs (StepGraph.decode: Model.decoder_hidden over StaticKVCaches). llm.c dev/cuda style: one file, it
prints everything.

    PYTHONPATH=.:tests python3 benchmarks/magpie_decoder_check.py [--out DIR] [--quick]

float32 checks run with MLX_ENABLE_TF32=0 (MLX's CUDA float32 matmuls otherwise run in TF32, ~1e-3), so
the float32 eager timing is that of exact float32 matmuls. Results: benchmarks/results/magpie_decoder_*.
"""

from __future__ import annotations

import os

os.environ.setdefault("MLX_ENABLE_TF32", "0")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

import kernels_metal as K  # noqa: E402
from kernels_metal import gpu  # noqa: E402
from kernels_metal import reference as ref  # noqa: E402
from metalgen.cache import StaticKVCache  # noqa: E402
from metalgen.magpie.decoder_kernel import StackedMemory, pack_decoder, stack_caches  # noqa: E402
from metalgen.magpie.dummy import _model_init, _randomize, dummy_args  # noqa: E402
from metalgen.magpie.frames import alignment_scores  # noqa: E402
from metalgen.models.magpie.model import Model  # noqa: E402

EST = [4, 5, 8, 9]  # the 357M checkpoint's estimate_alignment_from_layers
PRIOR_LAYERS = list(range(2, 11))  # and apply_prior_to_layers
CONTEXT = 218  # 217 baked context frames + the BOS block
TEXT = 120  # text positions
LINES = []


def say(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LINES.append(s)


def build(dtype):
    args = dummy_args("magpie-357m")
    m = Model(args)
    _randomize(m, 0, mx.float32, _model_init(217))
    # LayerNorm weights away from 1, so that a wrong norm shows
    from mlx.utils import tree_flatten, tree_unflatten

    new = []
    key = mx.random.key(3)
    for name, p in tree_flatten(m.decoder.parameters()):
        if ".norm_" in name or name.startswith("norm_out"):
            key, sub = mx.random.split(key)
            new.append((name, 1.0 + 0.1 * mx.random.normal(p.shape, key=sub)))
    m.decoder.update(tree_unflatten(new))
    if dtype != mx.float32:
        m.set_dtype(dtype)
    m.eval()
    mx.eval(m.parameters())
    return m


def setup(m, rows, seed):
    context = CONTEXT
    rng = np.random.default_rng(seed)
    d = m.args.d_model
    dt = m.decoder.layers[0].self_attention.qkv_net.weight.dtype
    text = mx.array(rng.standard_normal((1, TEXT, d)).astype(np.float32)).astype(dt)
    if rows == 2:
        memory = mx.concatenate([text, mx.zeros_like(text)], axis=0)
        mask = mx.array(np.stack([np.ones(TEXT, bool), np.arange(TEXT) == 0]))
    else:
        memory, mask = text, mx.ones((1, TEXT), dtype=mx.bool_)
    memory_kv = m.decoder_memory(memory)
    cache = m.decoder.make_cache()
    x0 = mx.array(rng.standard_normal((rows, context, d)).astype(np.float32)).astype(dt)
    m.decoder_hidden(x0, memory_kv, memory_mask=mask, cache=cache)
    mx.eval([c.state for c in cache])
    return rng, memory_kv, mask, cache


def prior_rows(rows, rng):
    p = np.full((rows, TEXT), 0.1, np.float32)
    a = int(rng.integers(2, TEXT - 8))
    p[0, a - 1:a + 7] = 1.0
    return mx.array(p)


def err(a, b):
    a = np.array(a.astype(mx.float32), dtype=np.float64)
    b = np.array(b.astype(mx.float32), dtype=np.float64)
    ab = float(np.max(np.abs(a - b)))
    return ab, ab / max(float(np.max(np.abs(b))), 1e-30)


def check(m, dtype, rows, steps, mega):
    """Kernel vs reference (and vs the model's decoder) over `steps` steps from the prompt's end, and at
    a long position over caches of random rows."""
    w = pack_decoder(m)
    rng, memory_kv, mask, cache = setup(m, rows, 1)
    mem = StackedMemory.make(w, memory_kv, mask)
    C = 1100
    kc, vc = stack_caches(cache, C)
    kr, vr = mx.array(kc), mx.array(vc)
    mx.eval(kr, vr)
    statics = [StaticKVCache.from_cache(c, C) for c in cache]
    worst = {}

    def note(name, e):
        a, r = worst.get(name, (0.0, 0.0))
        worst[name] = (max(a, e[0]), max(r, e[1]))

    for n in range(steps):
        x = mx.array(rng.standard_normal((rows, 1, m.args.d_model)).astype(np.float32)).astype(dtype)
        prior = prior_rows(rows, rng) if n % 3 != 0 else None
        pos = mx.array(CONTEXT + n, dtype=mx.int32)
        hk, sk = gpu.magpie_decoder_launch(x, pos, kc, vc, mem.keys, mem.values, mem.mask, prior, w, PRIOR_LAYERS, EST,
                                           mem.scratch, megakernel=mega)
        hr, sr = ref.magpie_decoder_step(x, pos, kr, vr, mem.keys, mem.values, mask, prior, w, PRIOR_LAYERS, EST)
        lp = None if prior is None else [prior[:, None] if i in PRIOR_LAYERS else None for i in range(w.layers)]
        hm, probs = m.decoder_hidden(x, memory_kv, memory_mask=mask, attn_prior=lp, return_attention=True,
                                     cache=statics)
        sm = alignment_scores(probs, EST)
        mx.eval(hk, sk, hr, sr, hm, sm, kc, vc, kr, vr)
        note("h kernel-ref", err(hk, hr))
        note("scores kernel-ref", err(sk, sr))
        note("cache kernel-ref", err(kc[:, :, :, CONTEXT + n], kr[:, :, :, CONTEXT + n]))
        note("h kernel-model", err(hk, hm[:, -1]))
        note("scores kernel-model", err(sk, sm))
        note("h ref-model", err(hr, hm[:, -1]))
    # a long position: random cache rows up to 1000
    P = 1000
    fill = (0.5 * mx.random.normal(kc.shape, key=mx.random.key(5))).astype(dtype)
    fillv = (0.5 * mx.random.normal(kc.shape, key=mx.random.key(6))).astype(dtype)
    kc2, vc2, kr2, vr2 = mx.array(fill), mx.array(fillv), mx.array(fill), mx.array(fillv)
    mx.eval(kc2, vc2, kr2, vr2)
    for pos in (P, 1099):
        x = mx.array(rng.standard_normal((rows, 1, m.args.d_model)).astype(np.float32)).astype(dtype)
        prior = prior_rows(rows, rng)
        hk, sk = gpu.magpie_decoder_launch(x, pos, kc2, vc2, mem.keys, mem.values, mem.mask, prior, w, PRIOR_LAYERS,
                                           EST, mem.scratch, megakernel=mega)
        hr, sr = ref.magpie_decoder_step(x, pos, kr2, vr2, mem.keys, mem.values, mask, prior, w, PRIOR_LAYERS, EST)
        mx.eval(hk, sk, hr, sr)
        note("h kernel-ref (pos 1000, 1099)", err(hk, hr))
        note("scores kernel-ref (pos 1000, 1099)", err(sk, sr))
    tag = f"{str(dtype).split('.')[-1]} rows={rows} {'megakernel' if mega else 'per-phase'}"
    for name, (a, r) in worst.items():
        say(f"  check {tag:34s} {name:36s} max abs {a:.3e}  max rel {r:.3e}")
    return worst


def timing(m, dtype, rows, n, mega=True, start=None):
    """ms per step: the kernel (each step's input its previous output, so launches run in order) and the
    eager MLX decoder step the frame loop runs, both queued `n` steps at a time."""
    start = CONTEXT if start is None else start
    w = pack_decoder(m)
    rng, memory_kv, mask, cache = setup(m, rows, 2)
    mem = StackedMemory.make(w, memory_kv, mask)
    C = 1100
    kc, vc = stack_caches(cache, C)
    prior = prior_rows(rows, rng)
    x0 = mx.array(rng.standard_normal((rows, 1, m.args.d_model)).astype(np.float32)).astype(dtype)

    def run_kernel(k):
        x = x0
        for i in range(k):
            h, s = gpu.magpie_decoder_launch(x, mx.array(start + i, dtype=mx.int32), kc, vc, mem.keys, mem.values,
                                             mem.mask, prior, w, PRIOR_LAYERS, EST, mem.scratch, megakernel=mega)
            x = h[:, None]
        mx.eval(x, s)

    statics = [StaticKVCache.from_cache(c, C) for c in cache]
    lp = [prior[:, None] if i in PRIOR_LAYERS else None for i in range(w.layers)]

    def run_mlx(k):
        x = x0
        for i in range(k):
            for c in statics:
                c.offset = mx.array(start + i, dtype=mx.int32)
            h, probs = m.decoder_hidden(x, memory_kv, memory_mask=mask, attn_prior=lp, return_attention=True,
                                        cache=statics)
            s = alignment_scores(probs, EST)
            x = h[:, -1:].astype(dtype)
        mx.eval(x, s)

    out = {}
    for name, fn in (("kernel", run_kernel), ("mlx", run_mlx)):
        fn(3)
        mx.synchronize()
        t = time.perf_counter()
        fn(n)
        mx.synchronize()
        out[name] = (time.perf_counter() - t) / n * 1e3
    tag = f"{str(dtype).split('.')[-1]} rows={rows} pos {start}.. {'megakernel' if mega else 'per-phase'}"
    say(f"  time  {tag:44s} kernel {out['kernel']:.3f} ms/step   eager MLX {out['mlx']:.3f} ms/step   "
        f"x{out['mlx'] / out['kernel']:.1f}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="check,time")
    a = ap.parse_args()
    say(f"backend {K.backend()}  device {mx.device_info().get('device_name', '?') if hasattr(mx, 'device_info') else '?'}"
        f"  multiprocessors {gpu.multiprocessors()}  grid {gpu.magpie_decoder_blocks()} groups"
        f"  MLX_ENABLE_TF32={os.environ.get('MLX_ENABLE_TF32')}")
    steps = 3 if a.quick else 8
    ok = True
    for dtype in (mx.float32, mx.bfloat16):
        m = build(dtype)
        say(f"== {dtype}: decoder {m.args.decoder.n_layers} layers, d {m.args.d_model}, text {TEXT}, context {CONTEXT}")
        if "check" in a.only:
            for rows in (2, 1):
                for mega in ((True, False) if rows == 2 else (True,)):
                    try:
                        check(m, dtype, rows, steps, mega)
                    except Exception as e:  # noqa: BLE001 - show the compile log / error in full
                        ok = False
                        say(f"  check {dtype} rows={rows} mega={mega} FAILED: {type(e).__name__}: {e}")
                        say(traceback.format_exc())
        if "time" in a.only and ok:
            n = 20 if a.quick else 50
            for rows in (2, 1):
                timing(m, dtype, rows, n)
            if dtype == mx.bfloat16:
                timing(m, dtype, 2, n, start=900)
                timing(m, dtype, 2, n // 2, mega=False)
        del m
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "magpie_decoder_check.txt"), "w") as f:
            f.write("\n".join(LINES) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
