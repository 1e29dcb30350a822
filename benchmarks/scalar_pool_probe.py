"""Whether the megakernel pays for reading arrays of 8 bytes or less (MLX's CUDA allocator keeps them in
unified memory, a pool that the CPU's token readback touches every step).

    PYTHONPATH=.:tests python3 benchmarks/scalar_pool_probe.py [shape ...] [--tokens 128] [--prompt 128]

Times pipelined tokens (as decode_step_probe.py) with the decoder's float parameters as 2 floats (8 bytes:
the scalar pool) or 4 (16 bytes: device memory), and the token the kernel reads as the sampler's (1,) array
or copied into a (4,) int32 array by an add, alternately, each twice; and the kernel's own stamps of layer 0's
phase 0 in each.
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from metalgen.api import load
from metalgen.sampling import make_sampler

from decode_step_probe import fresh, pipelined


def configure(step, pad_params: bool):
    dec = step.decoder
    eps, scale = (float(v) for v in dec.fparams.tolist()[:2])
    dec.fparams = mx.array([eps, scale] + ([0.0, 0.0] if pad_params else []), mx.float32)
    mx.eval(dec.fparams)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["qwen3-0.6b", "qwen2.5-0.5b"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128)
    args = ap.parse_args()
    n = args.tokens
    zero4 = mx.zeros((4,), mx.int32)
    mx.eval(zero4)
    modes = [("as now", False, False), ("params 16 B", True, False), ("token copied", False, True),
             ("both", True, True)]
    for shape in args.shapes:
        model, _ = load(f"dummy:{shape}")
        print(f"\n== {shape}: microseconds per token, pipelined, {n} tokens, prompt {args.prompt}")
        for rnd in range(2):
            for label, pad, copy in modes:
                step, tok = fresh(model, n, args.prompt)
                configure(step, pad)
                sampler = make_sampler()

                def full(t, step=step, sampler=sampler, copy=copy):
                    return sampler(step(t.reshape(1) + zero4 if copy else t))[0]
                us = pipelined(full, tok, n)
                step, tok = fresh(model, n, args.prompt)
                configure(step, pad)
                dec, state = step.decoder, step.state
                fixed = tok.reshape(1) + zero4 if copy else tok
                mx.eval(fixed)
                def kern(t, dec=dec, state=state, fixed=fixed, tok=tok):
                    return (dec.step(state, fixed)[0, :1] * 0).astype(mx.int32) + tok
                dec.stamp_steps = True
                ku = pipelined(kern, tok, n)
                mx.synchronize()
                times, marks = dec.step_times(state), dec.step_marks(state)
                print(f"  {label:<14} run {rnd}: full greedy {us:7.1f}   kernel only {ku:7.1f}   layer 0 phase 0 "
                      f"{times[0]:5.1f} us (input ready {marks[0, 0]:5.1f}), later phase 0s "
                      f"{times[5:-1:5].mean():5.2f}")


if __name__ == "__main__":
    main()
