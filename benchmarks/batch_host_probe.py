"""Host or device: where a batched decode step's time goes (metalgen.batch_step over the paged cache).

    PYTHONPATH=. python3 benchmarks/batch_host_probe.py [MODEL] [B,B,...]

For each batch size, B prompts of 128 tokens are prefilled and joined to a paged cache; then, for the traced
step (BatchStep.hidden) and for the model's layers as they are (model.hidden), 64 steps are timed three
ways: the host building the step's graph (nothing evaluated), the whole step evaluated at once (build and
run), and the step enqueued behind the previous one (mx.async_eval, as the generator runs: the larger of
host and device). Medians, ms a step. Results: benchmarks/results/.
"""

from __future__ import annotations

import statistics
import sys
import time

import mlx.core as mx

import metalgen
from metalgen.batch_cache import BatchKVCache
from metalgen.batch_step import BatchStep
from metalgen.paged_cache import PagedBatchCache

STEPS = 64


def paged(model, B: int) -> PagedBatchCache:
    group = [BatchKVCache.empty([0] * B) for _ in model.layers]
    ids = mx.array([[(7 * i + j) % 1000 + 100 for j in range(128)] for i in range(B)], mx.int32)
    mx.eval(model(ids, cache=group))
    cache = PagedBatchCache(len(model.layers))
    cache.join(group, list(range(B)))
    mx.eval(cache.state)
    return cache


def timings(model, cache: PagedBatchCache, hidden) -> tuple:
    B = cache.size
    tokens = mx.zeros((B,), mx.int32)
    build, whole = [], []
    for _ in range(STEPS):
        cache.begin_step()
        t0 = time.perf_counter()
        logits = model.logits(hidden(tokens, cache)[:, -1, :])
        t1 = time.perf_counter()
        mx.eval(logits, cache.state)
        t2 = time.perf_counter()
        build.append(t1 - t0)
        whole.append(t2 - t0)
    t0 = time.perf_counter()
    pending = None
    for _ in range(STEPS):
        cache.begin_step()
        logits = model.logits(hidden(tokens, cache)[:, -1, :])
        mx.async_eval(logits, cache.state)
        if pending is not None:
            mx.eval(pending)
        pending = logits
    mx.eval(pending)
    piped = (time.perf_counter() - t0) / STEPS
    return statistics.median(build) * 1e3, statistics.median(whole) * 1e3, piped * 1e3


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "dummy:qwen3-0.6b"
    sizes = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "8,32").split(",")]
    model, _ = metalgen.load(name)
    step = BatchStep(model)
    print(f"{name}, backend {mx.default_device()}, {STEPS} steps a case, ms a step (medians)")
    print(f"{'B':>4} {'path':>8} {'build':>8} {'whole':>8} {'pipelined':>10}")
    for B in sizes:
        for label, hidden in (("traced", step.hidden),
                              ("layers", lambda t, c: model.hidden(t[:, None], cache=c.layers))):
            cache = paged(model, B)
            timings(model, cache, hidden)  # traces, kernels built
            b, w, p = timings(model, cache, hidden)
            print(f"{B:>4} {label:>8} {b:>8.2f} {w:>8.2f} {p:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
