"""Per-token cost of the sampler and the repetition penalty on one row of logits (the decode loop's tail).

    PYTHONPATH=. python3 benchmarks/sample_probe.py [VOCAB [GROUPS_PER_SM MIN_SLICE]]

Times N chained calls (each draw advances the device-side generator, so they run in order) after a
warm-up and prints microseconds per call for each setting, the penalty as generation runs it (folded
into the sampler's launch). The calls are queued 50 at a time, so that the figure is the device's time
wherever that exceeds the host's. GROUPS_PER_SM and MIN_SLICE sweep the kernel's grid
(kernels_metal.gpu.SAMPLE_GROUPS_PER_SM, SAMPLE_MIN_SLICE). Results: benchmarks/results/.
"""

from __future__ import annotations

import sys
import time

import mlx.core as mx

import kernels_metal as K
from kernels_metal import gpu
from metalgen.sampling import make_repetition_penalty, make_sampler, sample_processed

N = 200
SETTINGS = [  # (name, temperature, top_k, top_p, min_p, penalty)
    ("greedy", 0.0, 0, 1.0, 0.0, None),
    ("temp 0.7", 0.7, 0, 1.0, 0.0, None),
    ("temp 0.7 top-p 0.9", 0.7, 0, 0.9, 0.0, None),
    ("temp 0.7 top-k 50", 0.7, 50, 1.0, 0.0, None),
    ("temp 0.7 min-p 0.05", 0.7, 0, 1.0, 0.05, None),
    ("greedy + penalty 1.1", 0.0, 0, 1.0, 0.0, 1.1),
    ("temp 0.7 top-p 0.9 + penalty 1.1", 0.7, 0, 0.9, 0.0, 1.1),
]


def per_call_us(logits, history, temperature, top_k, top_p, min_p, penalty) -> float:
    sampler = make_sampler(temperature, top_k, top_p, min_p, seed=1)
    proc = make_repetition_penalty(penalty) if penalty else None
    for n in (8, N):
        mx.synchronize()
        tic = time.perf_counter()
        hist = history
        for i in range(n):
            tok, lp = sample_processed(logits, sampler, [proc] if proc else [], hist)
            hist = mx.concatenate([hist, tok])
            if i % 50 == 49:
                mx.async_eval(tok, lp)
        mx.eval(tok, lp)
        elapsed = time.perf_counter() - tic
    return elapsed / N * 1e6


def main() -> int:
    V = int(sys.argv[1]) if len(sys.argv) > 1 else 151936
    if len(sys.argv) > 3:
        gpu.SAMPLE_GROUPS_PER_SM, gpu.SAMPLE_MIN_SLICE = int(sys.argv[2]), int(sys.argv[3])
    logits = (2.5 * mx.random.normal((1, V), key=mx.random.key(0))).astype(mx.bfloat16)
    history = mx.random.randint(0, V, (128,), key=mx.random.key(1)).astype(mx.int32)
    mx.eval(logits, history)
    print(f"backend {K.backend()}, vocab {V}, {N} chained calls, {gpu.sample_groups(1, V)} groups a row "
          f"({gpu.SAMPLE_GROUPS_PER_SM} a multiprocessor, slices of >= {gpu.SAMPLE_MIN_SLICE})")
    for name, *args in SETTINGS:
        print(f"{name:<34} {per_call_us(logits, history, *args):8.1f} us/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
