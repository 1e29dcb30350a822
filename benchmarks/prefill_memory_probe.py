"""Where a model's memory goes past its weights during generation, and what the MoE prefill path
costs: active memory after load and after the decode path is built, then for each prompt length the
peak over prefill alone and over a whole generation, and the prefill time, per grouped-expert
formulation (kernels_metal.gpu.MOE_GROUPED).

    python3 benchmarks/prefill_memory_probe.py dummy:qwen3-30b-a3b [--prompts 128,2048,4096] [--modes gemm,blocks]
"""

from __future__ import annotations

import argparse
import gc
import time

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from kernels_metal import gpu
from metalgen.api import load
from metalgen.cache import make_prompt_cache
from metalgen.decode import decoder_for
from metalgen.generate import generate_step, prefill

GB = 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompts", default="128,2048,4096")
    ap.add_argument("--modes", default="gemm,blocks")
    ap.add_argument("--chunk", type=int, default=2048)
    args = ap.parse_args()
    model, _ = load(args.model)
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    gc.collect()
    print(f"{args.model}: parameters {weights / GB:.2f} GB, active after load {mx.get_active_memory() / GB:.2f} GB")
    decoder_for(model)
    gc.collect()
    mx.clear_cache()
    base = mx.get_active_memory()
    print(f"active after the decode path is built {base / GB:.2f} GB")
    vocab = model.spec.vocab_size
    for mode in args.modes.split(","):
        gpu.MOE_GROUPED = mode
        for n in (int(p) for p in args.prompts.split(",")):
            prompt = mx.array(np.random.default_rng(n).integers(0, vocab, n), mx.int32)
            for rep in range(2):  # the first is a warm-up
                cache = make_prompt_cache(model)
                mx.synchronize()
                mx.reset_peak_memory()
                tic = time.perf_counter()
                rest = prefill(model, prompt, cache, args.chunk)
                logits = model.logits(model.hidden(rest[None], cache=cache, layer_by_layer=True)[:, -1, :])
                mx.eval(logits)
                dt = time.perf_counter() - tic
                pre_peak = mx.get_peak_memory()
                del cache, logits, rest
                gc.collect()
            mx.reset_peak_memory()
            for _ in generate_step(prompt, model, max_tokens=16, prefill_step_size=args.chunk):
                pass
            gen_peak = mx.get_peak_memory()
            print(f"{mode:<7} prompt {n:>5}: prefill {dt * 1e3:8.1f} ms ({n / dt:8.0f} tok/s), prefill peak "
                  f"+{(pre_peak - base) / GB:.2f} GB, generation peak +{(gen_peak - base) / GB:.2f} GB "
                  f"({gen_peak / weights * 100 - 100:.1f}% over the parameters)", flush=True)
            gc.collect()
            mx.clear_cache()


if __name__ == "__main__":
    main()
