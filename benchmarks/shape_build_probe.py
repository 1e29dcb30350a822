"""Which GPU kernels MLX builds the first time the batched engine meets a shape, and what that costs.

    PYTHONPATH=. python3 benchmarks/shape_build_probe.py [MODEL] [--gen 16]

MLX's CUDA backend compiles a kernel (NVRTC) the first time it meets it and keeps the result in memory and
under MLX_PTX_CACHE_DIR; this script points that at an empty folder, runs `metalgen.batch.BatchGenerator`
through a sequence of scenarios (batch sizes and prompt lengths, each once cold and once again), and prints
for each: its wall time, the time to the first tokens, ms a decode step after them, and the modules MLX
compiled during it (their count and names, grouped by name without the trailing shape digits).
Results: benchmarks/results/.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections import Counter

CACHE = tempfile.mkdtemp(prefix="mlx_ptx_")
os.environ["MLX_PTX_CACHE_DIR"] = CACHE  # before MLX builds its first kernel

import mlx.core as mx  # noqa: E402

import metalgen  # noqa: E402
from metalgen.batch import BatchGenerator  # noqa: E402


def built() -> set:
    return {f[:-4] for f in os.listdir(CACHE) if f.endswith(".ptx")}


def family(name: str) -> str:
    # a module's name without its shape and dtype suffixes, so that one kernel built at many shapes counts once
    return re.sub(r"(_[0-9a-f]{12})|([_x]?\d+)+", "#", name)[:90]


def run(gen: BatchGenerator, prompts, max_tokens: int):
    """Insert `prompts` and step until all finish: (seconds to every first token, ms a step after that, steps)."""
    uids = [gen.insert(p, max_tokens=max_tokens) for p in prompts]
    first, t0 = {}, time.perf_counter()
    t_all_first, steps_after = None, 0
    while gen.busy:
        for r in gen.step():
            first.setdefault(r.uid, time.perf_counter() - t0)
        if t_all_first is None and len(first) == len(uids):
            t_all_first = time.perf_counter()
        elif t_all_first is not None:
            steps_after += 1
    end = time.perf_counter()
    per_step = (end - t_all_first) / max(steps_after, 1) * 1e3 if t_all_first else float("nan")
    return max(first.values()), per_step, steps_after


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    gen_tokens = int(sys.argv[sys.argv.index("--gen") + 1]) if "--gen" in sys.argv else 16
    name = args[0] if args else "dummy:qwen3-0.6b"
    model, _ = metalgen.load(name)
    mx.eval(model.parameters())
    gen = BatchGenerator(model, max_batch=32)
    vocab = model.spec.vocab_size

    def prompts(lengths, seed):
        return [[(seed * 7919 + i * 104729 + j * 31) % (vocab - 1) + 1 for j in range(n)] for i, n in enumerate(lengths)]

    scenarios = [
        ("1 x 128", [128]), ("1 x 128 again", [128]), ("1 x 131", [131]), ("1 x 300", [300]),
        ("8 x 120..127", list(range(120, 128))), ("8 x 120..127 again", list(range(120, 128))),
        ("8 x 64..449", [64 + 55 * i for i in range(8)]),
        ("32 x 100..131", list(range(100, 132))), ("32 x 100..131 again", list(range(100, 132))),
    ]
    print(f"{name}, backend {mx.default_device()}, {gen_tokens} tokens a request; MLX_PTX_CACHE_DIR={CACHE}")
    print(f"{'scenario':<22} {'wall s':>7} {'first tok s':>11} {'ms/step':>8}  built")
    for k, (label, lengths) in enumerate(scenarios):
        before = built()
        t0 = time.perf_counter()
        ttft, per_step, _ = run(gen, prompts(lengths, k), gen_tokens)
        wall = time.perf_counter() - t0
        new = sorted(built() - before)
        fams = Counter(family(n) for n in new)
        print(f"{label:<22} {wall:7.2f} {ttft:11.3f} {per_step:8.2f}  {len(new)} modules")
        for f, c in fams.most_common(12):
            print(f"{'':<24}{c:3d} x {f}")


if __name__ == "__main__":
    main()
