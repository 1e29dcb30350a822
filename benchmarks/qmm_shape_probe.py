"""mx.quantized_matmul and mx.matmul at a batched decode step's shapes: x as (B, 1, K) (each row a batch
of one, as a batched model's step hands it to a linear layer) against the same rows as (B, K), and the
quantized GEMV kernel (kernels_metal.gpu.gemv_quantized, forced at every B) with its largest relative
difference from mx.quantized_matmul.

    PYTHONPATH=. python3 benchmarks/qmm_shape_probe.py [--bits 4] [--group-size 64]

Weights of Qwen3-8B's gate projection (12288 x 4096) and down projection (4096 x 12288), random. Prints,
per B: the first call's time (it includes any kernel MLX builds for that shape) and the median of 30
timed calls after it, in microseconds. Results: benchmarks/results/.
"""

from __future__ import annotations

import statistics
import sys
import time

import mlx.core as mx

from kernels_metal import gpu


def timed(fn, reps: int = 30):
    t0 = time.perf_counter()
    mx.eval(fn())
    first = time.perf_counter() - t0
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t0)
    return first * 1e6, statistics.median(ts) * 1e6


def main():
    bits = int(sys.argv[sys.argv.index("--bits") + 1]) if "--bits" in sys.argv else 4
    gs = int(sys.argv[sys.argv.index("--group-size") + 1]) if "--group-size" in sys.argv else 64
    mx.random.seed(0)
    print(f"backend {mx.default_device()}, {bits}-bit, group {gs}; us: first call / median of 30")
    for name, (n, k) in {"gate 12288x4096": (12288, 4096), "down 4096x12288": (4096, 12288)}.items():
        w = (mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16)
        wq, s, b = mx.quantize(w, group_size=gs, bits=bits)
        mx.eval(w, wq, s, b)
        print(f"\n{name}")
        print(f"{'B':>4} {'q (B,1,K)':>20} {'q (B,K)':>20} {'GEMV (B,K)':>20} {'bf16 (B,1,K)':>20} {'bf16 (B,K)':>20}"
              f"  GEMV vs qmm")
        for B in (1, 2, 4, 8, 16, 32):
            x3 = mx.random.normal((B, 1, k)).astype(mx.bfloat16)
            x2 = x3.reshape(B, k)
            mx.eval(x3, x2)
            cells = []
            for x in (x3, x2):
                cells.append(timed(lambda: mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=gs, bits=bits)))
            cells.append(timed(lambda: gpu.gemv_quantized(x2, wq, s, b, gs, bits)))
            for x in (x3, x2):
                cells.append(timed(lambda: x @ w.T))
            ref = mx.quantized_matmul(x2, wq, s, b, transpose=True, group_size=gs, bits=bits).astype(mx.float32)
            got = gpu.gemv_quantized(x2, wq, s, b, gs, bits).astype(mx.float32)
            err = (mx.abs(got - ref).max() / mx.abs(ref).max()).item()
            print(f"{B:>4} " + " ".join(f"{a:10.0f} / {m:7.1f}" for a, m in cells) + f"  {err:.2e}")


if __name__ == "__main__":
    main()
