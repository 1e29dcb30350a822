"""A/B of the hybrid stacks' fused projections (HybridCausalLM.fuse_projections): the same dummy
shape loaded twice, once as users get it (fused) and once with the checkpoint's separate layers,
decode timed in alternation in one process so that the machine's drift hits both alike.

    PYTHONPATH=. python3 benchmarks/fusion_ab.py qwen3.5-0.8b qwen3.5-35b-a3b-4bit
"""

from __future__ import annotations

import statistics
import sys

import mlx.core as mx
import numpy as np

from metalgen.bench import metalgen_steps, ops_per_token, time_generation
from metalgen.dummy import load_dummy
from metalgen.models.hybrid import HybridCausalLM


def load(shape: str, fused: bool):
    original = HybridCausalLM.fuse_projections
    if not fused:
        HybridCausalLM.fuse_projections = lambda self: None
    try:
        return load_dummy(shape)[0]
    finally:
        HybridCausalLM.fuse_projections = original


def main(shapes, rounds: int = 3, prompt_tokens: int = 128, gen_tokens: int = 256) -> None:
    for shape in shapes:
        models = {"separate": load(shape, False), "fused": load(shape, True)}
        prompt = mx.array(np.random.default_rng(0).integers(0, 150000, prompt_tokens), mx.int32)
        rates = {k: [] for k in models}
        for _ in range(rounds):
            for name, model in models.items():
                rates[name].append(time_generation(metalgen_steps(model), prompt, gen_tokens, 1)[1])
        for name, model in models.items():
            print(f"{shape:24s} {name:9s} ops/token {ops_per_token(model):5d}  decode tok/s "
                  f"median {statistics.median(rates[name]):7.1f}  runs " + " ".join(f"{r:.1f}" for r in rates[name]))
        del models
        mx.clear_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["qwen3.5-0.8b"])
