"""Where a loaded batch's time goes: BatchGenerator in a closed loop, as `metalgen serve` runs it under
serve_load.py's clients, without HTTP.

    PYTHONPATH=. python3 benchmarks/batch_load_probe.py [MODEL] [--streams 32] [--requests 2]
        [--prompt-tokens 128] [--gen-tokens 128] [--runs 3] [--no-prefix-cache] [--cprofile 25]

`--streams` clients each send `--requests` prompts one after the other (distinct random ids, a greedy
sampler of their own, as the server makes one a request); a finished sequence's client inserts its next
prompt before the following step, as a client's next request arrives. Each run uses prompts of its own;
the first run meets shapes nothing was built for, so runs after it are the ones to read. Per run: the
aggregate tokens/s (all tokens over the run's wall time), how many steps ran, and the steps' wall times
split into those that fed a prompt chunk and those that did not (p50, p90, max, and how many took over
50 ms: a kernel built mid-run shows as one). With --cprofile N, the last run again under cProfile: its N
functions of most own time (the host's work: MLX launches its kernels inside `async_eval` and `tolist`).
Results: benchmarks/results/.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time

import metalgen
from metalgen.batch import BatchGenerator
from metalgen.prefix_cache import PrefixCache
from metalgen.sampling import make_sampler


def one_run(model, args, seed: int) -> dict:
    rng = random.Random(seed)
    vocab = min(model.spec.vocab_size, 150000)
    cache = None if args.no_prefix_cache else PrefixCache(2**30)  # the server's default budget, 1 GiB
    gen = BatchGenerator(model, max_batch=args.streams, prefix_cache=cache)
    left = {}  # uid -> requests its client still has to send after this one

    def send(more: int) -> None:
        ids = [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)]
        uid = gen.insert(ids, args.gen_tokens, make_sampler(0.0))
        left[uid] = more

    for _ in range(args.streams):
        send(args.requests - 1)
    plain, fed, tokens = [], [], 0
    t0 = time.perf_counter()
    while gen.busy:
        before = gen.prefilled
        s0 = time.perf_counter()
        out = gen.step()
        (fed if gen.prefilled != before else plain).append(time.perf_counter() - s0)
        tokens += len(out)
        for r in out:
            if r.finish_reason is not None:
                more = left.pop(r.uid)
                if more > 0:
                    send(more - 1)
    wall = time.perf_counter() - t0
    return dict(tok_s=tokens / wall, wall=wall, steps=gen.steps, plain=plain, fed=fed)


def describe(name: str, xs) -> str:
    if not xs:
        return f"{name}: none"
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    slow = sum(x > 0.05 for x in xs)
    return (f"{name}: {len(xs)} steps, p50 {statistics.median(xs) * 1e3:.2f} p90 {p90 * 1e3:.2f} "
            f"max {xs[-1] * 1e3:.1f} ms, {slow} over 50 ms, {sum(xs):.3f} s in all")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="dummy:qwen3-0.6b")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2, help="prompts each client sends, one after the other")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-prefix-cache", action="store_true")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N")
    args = ap.parse_args()
    model, _ = metalgen.load(args.model)
    print(f"{args.model}: {args.streams} streams x {args.requests} requests, prompts {args.prompt_tokens}, "
          f"{args.gen_tokens} tokens each, prefix cache {'off' if args.no_prefix_cache else 'on'}")
    for run in range(args.runs):
        r = one_run(model, args, 1000 + run)
        print(f"run {run}: {r['tok_s']:.1f} tok/s, {r['wall']:.3f} s, {r['steps']} steps")
        print("   " + describe("decode only", r["plain"]))
        print("   " + describe("with a chunk", r["fed"]))
    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        r = one_run(model, args, 2000)
        prof.disable()
        print(f"under cProfile: {r['tok_s']:.1f} tok/s, {r['wall']:.3f} s")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.cprofile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
