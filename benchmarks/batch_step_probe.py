"""Where a batched decode step's time goes (metalgen.batch.BatchGenerator), at a few batch sizes.

    PYTHONPATH=. python3 benchmarks/batch_step_probe.py [MODEL] [B,B,...]

For each batch size: B prompts of 128 tokens join, then 64 steps are timed (no joins or leaves among
them) with (a) one greedy sampler shared by every row, (b) a sampler per row (greedy), (c) a sampler per
row at temperature 0.7, top-p 0.9. Also the forward pass alone (hidden states and logits of the batch,
evaluated each step), and (d) the steps of B rows while 8 more prompts of 128 tokens arrive at once and
are prefilled together (a chunk of `prefill_step_size` tokens a step, ahead of the decode) until they join:
ms a step and how many steps. Prints ms a step and aggregate tokens/s. Results: benchmarks/results/.
"""

from __future__ import annotations

import sys
import time

import mlx.core as mx

import metalgen
from metalgen.batch import BatchGenerator
from metalgen.sampling import make_sampler

STEPS = 64


ARRIVALS = 8


def prompt(i: int):
    return [(7 * i + j) % 1000 + 100 for j in range(128)]


def joined(gen: BatchGenerator) -> None:
    """Step until every inserted prompt is in the batch (prompts join a group of chunks at a time)."""
    while gen.joining:
        gen.step()


def timed_steps(gen: BatchGenerator, n: int) -> float:
    joined(gen)
    gen.step()
    t0 = time.perf_counter()
    for _ in range(n):
        gen.step()
    return (time.perf_counter() - t0) / n


def run(model, B: int, samplers) -> float:
    gen = BatchGenerator(model, max_batch=B)
    for i in range(B):
        gen.insert(prompt(i), max_tokens=STEPS + 24, sampler=samplers(i))
    return timed_steps(gen, STEPS)


def forward_only(model, B: int) -> float:
    gen = BatchGenerator(model, max_batch=B)
    for i in range(B):
        gen.insert(prompt(i), max_tokens=STEPS + 24)
    joined(gen)
    tokens = mx.zeros((B,), mx.int32)
    t0 = time.perf_counter()
    # the running batch's cache: paged (metalgen.paged_cache), or per-layer left-padded caches in a tree from
    # before 2026-11-26 (so that one script times both in an A/B: PYTHONPATH=<old tree>)
    paged = hasattr(gen.cache, "begin_step")
    layers = gen.cache.layers if paged else gen.cache
    for _ in range(STEPS):
        if paged:
            gen.cache.begin_step()
        h = model.hidden(tokens[:, None], cache=layers)
        logits = model.logits(h[:, -1, :])
        mx.eval(logits, [c.state for c in layers])
    return (time.perf_counter() - t0) / STEPS


def with_arrivals(model, B: int):
    """(ms a step, steps) of B running rows while ARRIVALS prompts of 128 tokens are prefilled and join."""
    gen = BatchGenerator(model, max_batch=B + ARRIVALS)
    for i in range(B):
        gen.insert(prompt(i), max_tokens=STEPS + 24)
    joined(gen)
    gen.step()
    for i in range(ARRIVALS):
        gen.insert(prompt(B + i), max_tokens=8)
    t0 = time.perf_counter()
    n = 0
    while gen.joining:
        gen.step()
        n += 1
    return (time.perf_counter() - t0) / n, n


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "dummy:qwen3-0.6b"
    sizes = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32").split(",")]
    model, _ = metalgen.load(name)
    print(f"{name}, backend {mx.default_device()}, {STEPS} steps a case")
    print(f"{'B':>4} {'forward':>10} {'shared greedy':>14} {'greedy/row':>11} {'top-p/row':>10} "
          f"{f'+{ARRIVALS} arrive':>14}   (ms a step)")
    for B in sizes:
        fwd = forward_only(model, B)
        shared = make_sampler()
        a = run(model, B, lambda i: shared)
        b = run(model, B, lambda i: make_sampler(0.0))
        c = run(model, B, lambda i: make_sampler(0.7, top_p=0.9, seed=i))
        d, n = with_arrivals(model, B)
        print(f"{B:>4} {fwd * 1e3:>10.2f} {a * 1e3:>14.2f} {b * 1e3:>11.2f} {c * 1e3:>10.2f} "
              f"{f'{d * 1e3:.2f} x{n}':>14}   (shared greedy {B / a:.0f} tok/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
