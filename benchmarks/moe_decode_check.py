"""An MoE model's fast decode paths against its plain path on a GPU: teacher-forced relative logit
error per step (prompt 128, 64 steps), and whether `auto` takes the megakernel.

    python3 benchmarks/moe_decode_check.py dummy:qwen3-30b-a3b [modes...]
"""

from __future__ import annotations

import sys
import time

import kernels_metal
from metalgen.api import load
from metalgen.bench import decode_path_name
from metalgen.decode.check import step_errors


def main():
    source = sys.argv[1]
    modes = sys.argv[2:] or ["megakernel", "fused"]
    kernels_metal.set_verbose(True)
    tic = time.time()
    model, _ = load(source)
    print(f"{source}: loaded in {time.time() - tic:.1f} s; auto takes {decode_path_name(model)}", flush=True)
    for mode in modes:
        tic = time.time()
        errs = step_errors(model, mode, prompt_tokens=128, steps=64)
        print(f"{source} {mode}: max rel logit error vs plain over 64 steps {max(errs):.4f} "
              f"(median {sorted(errs)[32]:.4f}), {time.time() - tic:.1f} s", flush=True)


if __name__ == "__main__":
    main()
