"""Whether the megakernel pays for reading arrays of 8 bytes or less (MLX's CUDA allocator keeps them in
unified memory, a pool that the CPU's token readback touches every step).

    PYTHONPATH=.:tests python3 benchmarks/scalar_pool_probe.py [shape ...] [--tokens 128] [--prompt 128] [--sampler]

Times pipelined tokens (as decode_step_probe.py) with the decoder's float parameters as 2 floats (8 bytes:
the scalar pool) or 4 (16 bytes: device memory), and the token the kernel reads as the sampler's (1,) array
or copied into a (4,) int32 array by an add, alternately, each twice; and the kernel's own stamps of layer 0's
phase 0 in each. With --sampler instead: the loop as generate_step runs it (the token history grown by a
concatenation, the repetition penalty folded into the sampler's launch), greedy and sampled, with the sampler's
state of 2 words ([seed, counter], 8 bytes) or as made (4 words; the kernel reads the first two). With --plain:
generate_step on the plain path, the kernels' parameter arrays (kernels_metal.gpu's _i32, _f32) as made or padded
to 16 bytes (the 2026-11-27 run compared them the other way round, the padding then in gpu.py; the same two arrays).
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from metalgen.api import load
from metalgen.sampling import make_logits_processors, make_sampler, sample_processed

from decode_step_probe import fresh, pipelined


def configure(step, pad_params: bool):
    dec = step.decoder
    eps, scale = (float(v) for v in dec.fparams.tolist()[:2])
    dec.fparams = mx.array([eps, scale] + ([0.0, 0.0] if pad_params else []), mx.float32)
    mx.eval(dec.fparams)


def sampler_loop(model, n, prompt, settings, penalty, pad_state):
    """us a pipelined token of the generate_step loop with `settings` for make_sampler and a repetition penalty."""
    step, tok = fresh(model, n, prompt)
    sampler = make_sampler(**settings, seed=1)
    # as made: 4 words (16 bytes); the kernel reads the first two, so 2 words is the state as it was
    sampler.state = sampler.state if pad_state else sampler.state[:2]
    mx.eval(sampler.state)
    procs = make_logits_processors(penalty)
    hist = [mx.zeros((prompt,), mx.int32)] if procs else [None]
    mx.eval(*[h for h in hist if h is not None])

    def fn(t):
        if procs:
            hist[0] = mx.concatenate([hist[0], t.reshape(1)])
        return sample_processed(step(t), sampler, procs, hist[0])[0]
    return pipelined(fn, tok, n)


def plain_loop(model, n, prompt, padded):
    """us a token of generate_step on the plain path (the model's own layers and kernels), with the kernels'
    parameter arrays as kernels_metal.gpu makes them or padded to 16 bytes (4 values, the kernels reading the first)."""
    import functools

    from kernels_metal import gpu as G
    from metalgen.generate import generate_step

    kept = G._i32, G._f32
    if padded:
        G._i32 = functools.lru_cache(maxsize=8192)(lambda *v: mx.array(list(v) + [0] * (4 - len(v)), dtype=mx.int32))
        G._f32 = functools.lru_cache(maxsize=1024)(lambda *v: mx.array(list(v) + [0.0] * (4 - len(v)), mx.float32))
    try:
        ids = mx.array([(7919 * (i + 1)) % 151000 for i in range(prompt)], mx.int32)
        gen = generate_step(ids, model, max_tokens=n + 1, decode="plain")
        next(gen)
        tic = time.perf_counter()
        for _ in gen:
            pass
        return (time.perf_counter() - tic) / n * 1e6
    finally:
        G._i32, G._f32 = kept


def sampler_main(args):
    for shape in args.shapes:
        model, _ = load(f"dummy:{shape}")
        print(f"\n== {shape}: microseconds per token, pipelined, {args.tokens} tokens, prompt {args.prompt}")
        for label, settings, penalty in (("greedy", {}, None),
                                         ("temp 0.7 top-p 0.9 rep 1.1", dict(temperature=0.7, top_p=0.9), 1.1)):
            for rnd in range(2):
                for pad in (False, True):
                    us = sampler_loop(model, args.tokens, args.prompt, settings, penalty, pad)
                    print(f"  {label:<27} state {'16 B' if pad else ' 8 B'} run {rnd}: {us:7.1f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["qwen3-0.6b", "qwen2.5-0.5b"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--sampler", action="store_true", help="time the sampler's state of 2 words and as made (4)")
    ap.add_argument("--plain", action="store_true", help="time the plain path with the kernels' parameter arrays "
                    "as given and padded")
    args = ap.parse_args()
    if args.sampler:
        return sampler_main(args)
    if args.plain:
        for shape in args.shapes:
            model, _ = load(f"dummy:{shape}")
            print(f"\n== {shape}: microseconds per token, the plain path, {args.tokens} tokens, prompt {args.prompt}")
            for rnd in range(2):
                for padded in (False, True):
                    us = plain_loop(model, args.tokens, args.prompt, padded)
                    print(f"  parameters {'padded' if padded else 'as given'} run {rnd}: {us:8.1f}")
        return
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
