"""mx.quantized_matmul and mx.matmul at a batched decode step's shapes: x as (B, 1, K) (each row a batch
of one, as a batched model's step hands it to a linear layer) against the same rows as (B, K).

    PYTHONPATH=. python3 benchmarks/qmm_shape_probe.py [--bits 4] [--group-size 64]

Weights of Qwen3-8B's gate projection (12288 x 4096) and down projection (4096 x 12288), random. Prints,
per B: the first call's time (it includes any kernel MLX builds for that shape) and the median of 30
timed calls after it, in microseconds, for both layouts, quantized and bf16. Results: benchmarks/results/.
"""

from __future__ import annotations

import statistics
import sys
import time

import mlx.core as mx


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
        print(f"{'B':>4} {'q (B,1,K)':>20} {'q (B,K)':>20} {'bf16 (B,1,K)':>20} {'bf16 (B,K)':>20}")
        for B in (1, 2, 4, 8, 16, 32, 64):
            x3 = mx.random.normal((B, 1, k)).astype(mx.bfloat16)
            x2 = x3.reshape(B, k)
            mx.eval(x3, x2)
            cells = []
            for x in (x3, x2):
                cells.append(timed(lambda: mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=gs, bits=bits)))
            for x in (x3, x2):
                cells.append(timed(lambda: x @ w.T))
            print(f"{B:>4} " + " ".join(f"{a:10.0f} / {m:7.1f}" for a, m in cells))


if __name__ == "__main__":
    main()
