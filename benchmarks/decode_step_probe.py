"""What a megakernel token costs outside the kernel: pipelined decode (step n+1 enqueued before
token n is read, as generate_step does) timed in variants.

    PYTHONPATH=. python3 benchmarks/decode_step_probe.py [shape ...] [--tokens 128] [--min-chunk 32,64] [--group-from 0,6144]
        [--variants "v:MG_DEF=0;ref:@decode_layer_ref" [--only-variants] [--check 24]]

(`ref:@decode_layer_ref` compiles kernels_metal/bodies/decode_layer_ref.body, e.g. a body from an earlier
commit: `git show HEAD~1:kernels_metal/bodies/decode_layer.body > kernels_metal/bodies/decode_layer_ref.body`,
so the old and the new kernel are timed on the same machine in the same call.)

variants: full (kernel + LM head + argmax; with make_sampler()'s greedy instead; that per attention
split size with --min-chunk; that for megakernels compiled with other #defines of decode_layer.body
with --variants), kernel only (no LM head: the next input is a fixed
token), and the LM head + argmax alone on a fixed hidden state. With --check N, each variant's logits are also
compared with the default kernel's over N steps teacher-forced on the default's greedy tokens (the largest
difference, and whether they are the same bits): a timing of a wrong kernel does not pass unseen. (A variant with every position's
parameter array built before the timed loop measured 65 us a token faster, which led to
gpu.py's parameter blocks.)
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from metalgen.api import load
from metalgen.decode.check import prefill_random
from kernels_metal import source as S
from metalgen.decode import gpu
from metalgen.decode.path import make_step
from metalgen.sampling import make_sampler


def fresh(model, tokens, prompt=128):
    logits, cache = prefill_random(model, prompt)
    step = make_step(model, cache, prompt, tokens + 8, "megakernel_v1")
    return step, mx.argmax(logits, axis=-1).astype(mx.int32)


def variant(model, step, label: str, defines):
    """A decoder like `step`'s (the model keeps that one) running a copy of its kernel spec with
    other #defines (and with ("@", name), bodies/name.body instead of the spec's body), on `step`'s
    state, and a step function for it."""
    base_dec = step.decoder
    dec = type(base_dec)(base_dec.w, base_dec.blocks, base_dec.version)
    body = dict(defines).get("@")
    dec.kernel_name = S.with_defines(base_dec.kernel_name, label, [d for d in defines if d[0] != "@"], body)
    state = step.state
    return dec, state, lambda t: model.logits(dec.step(state, t))


def parse_variants(text):
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        label, _, defs = part.partition(":")
        # "@name" compiles bodies/name.body instead of the spec's own body
        out.append((label, [("@", d[1:]) if d.startswith("@") else (d.split("=")[0], int(d.split("=")[1]))
                            for d in filter(None, defs.split(","))]))
    return out


def default_run(model, n, prompt):
    """The default kernel over `n` steps from a fresh prefill, fed its own greedy tokens: (first token, each
    step's logits, the token fed after each step), what check_variant compares every variant with."""
    step, first = fresh(model, n, prompt)
    ref, fed, tok = [], [], first
    for _ in range(n):
        logits = step(tok)
        tok = mx.argmax(logits, axis=-1).astype(mx.int32)
        mx.eval(logits, tok)
        ref.append(logits)
        fed.append(tok)
    return first, ref, fed


def check_variant(model, label, defines, prompt, default):
    """Largest |logit difference| of a variant against the default kernel's run `default` (default_run) from the
    same prefill, fed the default's greedy tokens, and whether every step's logits were the same bits."""
    first, ref, fed = default
    step, _ = fresh(model, len(ref), prompt)
    _, _, vstep = variant(model, step, label, defines)
    worst, same, tok = 0.0, True, first
    for i in range(len(ref)):
        logits = vstep(tok)
        d = mx.max(mx.abs(logits.astype(mx.float32) - ref[i].astype(mx.float32))).item()
        worst, same, tok = max(worst, d), same and d == 0.0, fed[i]
    return worst, same


def kernel_only(dec, state, fixed):
    """A step function that runs only the kernel, always on the token `fixed` (no LM head), and
    returns a token that depends on the kernel's output (4 bytes read back)."""
    def fn(t):
        h = dec.step(state, fixed)
        return (h[0, :1] * 0).astype(mx.int32) + fixed
    return fn


def pipelined(fn, tok, n, feed=None):
    """us a step of `fn` run as generate_step runs it: step n+1 enqueued before the output of step n is read back.
    Each step takes the previous step's output, or `feed()` where given, called right after that step (a sampler's
    device copy of its token, DeviceSampler.last_token, as generate_step feeds the fast path)."""
    nxt = fn(tok)
    mx.async_eval(nxt)
    tic = time.perf_counter()
    for _ in range(n):
        cur = nxt
        nxt = fn(feed() if feed else cur)
        mx.async_eval(nxt)
        cur.item()
    mx.eval(nxt)
    return (time.perf_counter() - tic) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["qwen2.5-0.5b", "qwen3-0.6b"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before the timed steps (the context)")
    ap.add_argument("--min-chunk", type=lambda v: [int(x) for x in v.split(",")], default=[],
                    help="also time the full token with these attention split sizes (e.g. 32,64)")
    ap.add_argument("--group-from", type=lambda v: [int(x) for x in v.split(",")], default=[],
                    help="also time the full token with gpu.GROUP_FROM at these lengths (0: 2 query heads an "
                         "attention item always)")
    ap.add_argument("--variants", type=parse_variants, default=[],
                    help="label:DEF=v,...;label2:... megakernels with other #defines, timed after the default")
    ap.add_argument("--only-variants", action="store_true", help="time the default and the variants only")
    ap.add_argument("--check", type=int, default=0, metavar="N",
                    help="also compare each variant's logits with the default kernel's over N steps")
    args = ap.parse_args()
    n = args.tokens
    for shape in args.shapes:
        model, _ = load(f"dummy:{shape}")
        print(f"\n== {shape}: microseconds per token, pipelined, {n} tokens")
        step, tok = fresh(model, n, args.prompt)
        full = lambda t: mx.argmax(step(t), axis=-1).astype(mx.int32)  # noqa: E731
        print(f"  full (kernel + head + argmax)   {pipelined(full, tok, n):8.1f}")
        step, tok = fresh(model, n, args.prompt)
        sampler = make_sampler()  # greedy, with the logprob: what generate_step runs
        sampled = lambda t: sampler(step(t))[0]  # noqa: E731
        print(f"  full, make_sampler() greedy     {pipelined(sampled, tok, n):8.1f}")
        for again in ("", ", again"):
            step, tok = fresh(model, n, args.prompt)  # (sampled reads `step` when called: this one)
            print(f"  full, greedy, fed the state{again:<7}{pipelined(sampled, tok, n, sampler.last_token):8.1f}")
            step, tok = fresh(model, n, args.prompt)
            print(f"  full, greedy, fed its token{again:<7}{pipelined(sampled, tok, n):8.1f}")
        # the default kernel's logits, once a shape, for --check
        default = default_run(model, args.check, args.prompt) if args.check and args.variants else None
        for label, defines in args.variants:
            step, tok = fresh(model, n, args.prompt)
            dec, state, vstep = variant(model, step, label, defines)
            sampled = lambda t: sampler(vstep(t))[0]  # noqa: E731
            print(f"  full, greedy, {label:<17} {pipelined(sampled, tok, n):8.1f}")
            step, tok = fresh(model, n, args.prompt)
            dec, state, _ = variant(model, step, label, defines)
            print(f"  kernel only, {label:<18} {pipelined(kernel_only(dec, state, tok), tok, n):8.1f}")
            if args.check:
                worst, same = check_variant(model, label, defines, args.prompt, default)
                print(f"  check, {label:<24} {args.check} steps against the default: largest |logit difference| "
                      f"{worst:.3g}, {'the same bits' if same else 'not the same bits'}")
        if args.only_variants:
            continue
        # the split count (gpu.MIN_CHUNK: attention positions per (head, split) item at least) and
        # gpu.GROUP_FROM (from this many positions on, an attention item takes 2 query heads of a KV head):
        # the full token with each value, read when the parameter rows are made
        for name, values in (("MIN_CHUNK", args.min_chunk), ("GROUP_FROM", args.group_from)):
            kept = getattr(gpu, name)
            for v in values:
                setattr(gpu, name, v)
                step, tok = fresh(model, n, args.prompt)
                step.decoder._param_cache.clear()
                sampled = lambda t: sampler(step(t))[0]  # noqa: E731
                print(f"  full, greedy, {name} {v:<6d} {pipelined(sampled, tok, n):8.1f}")
            setattr(gpu, name, kept)
        step.decoder._param_cache.clear()
        step, tok = fresh(model, n, args.prompt)
        dec, state = step.decoder, step.state
        kernel = kernel_only(dec, state, tok)
        print(f"  kernel only                     {pipelined(kernel, tok, n):8.1f}")
        # the kernel's own stamps of the last launch, read once after the loop (no readback of the
        # scratch between launches): where the first step's time goes when nothing else touches it. A fresh
        # cache: the run above took its positions
        step, tok = fresh(model, n, args.prompt)
        dec, state = step.decoder, step.state
        kernel = kernel_only(dec, state, tok)
        dec.stamp_steps = True
        us = pipelined(kernel, tok, n)
        mx.synchronize()
        times, marks = dec.step_times(state), dec.step_marks(state)
        dec.stamp_steps = False
        print(f"  kernel only, stamps on          {us:8.1f}   (last launch: kernel {times.sum():7.1f} us, layer 0 "
              f"phase 0 {times[0]:6.1f} us, its input ready at {marks[0, 0]:6.1f}; later phase 0s "
              f"{times[5:-1:5].mean():5.2f} us)")
        h = mx.random.normal((1, model.spec.hidden_size)).astype(mx.bfloat16)
        mx.eval(h)

        def head_only(t):
            return mx.argmax(model.logits(h + t.astype(h.dtype) * 0), axis=-1).astype(mx.int32)
        print(f"  LM head + argmax only           {pipelined(head_only, tok, n):8.1f}")


if __name__ == "__main__":
    main()
