"""Where a megakernel token's time goes: per-phase durations from the kernel's own timing stamps.

    PYTHONPATH=. python3 benchmarks/decode_phase_probe.py [shape ...] [--tokens 32] [--versions 1,2] [--prompt 128]

After a `--prompt`-token plain prefill (the context), decodes `--tokens` tokens on the megakernel with `stamp_steps`
set (group 0 stores the SM's cycle counter after every step's grid barrier, kernels_metal
preludes/cuda.h mg_cycles) and reports, per phase of a layer, the mean microseconds (over layers
and tokens, the first 4 tokens dropped), each phase's weight bytes and the bandwidth that implies,
the final norm, the kernel's total and a whole token's wall time (kernel + LM head + argmax +
readback) for comparison, and where inside a phase group 0 is (`MegakernelDecoder.step_marks`: its
input vector ready, its work done; the rest of the phase is waiting for the other groups and the
barrier). Reading the stamps back after every token makes the next launch's first touch of the
scratch page slow: layer 0's phase 0 costs 80-260 us here against 11-38 us in a pipelined run
(decode_step_probe.py reads them once, after its loop).
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

from metalgen.api import load
from metalgen.decode.check import prefill_random
from metalgen.decode.path import make_step

PHASES = ["0 norm+QKV", "1 attention", "2 merge+o_proj", "3 norm+gate/up", "4 down"]
# an MoE decoder's 6 phases (its sparse layers'; docs/decode.md)
MOE_PHASES = ["0 norm+QKV", "1 attention", "2 merge+o_proj", "3 norm+router", "4 route+gate/up", "5 down"]


def phase_bytes(w):
    b = 2 if w.quant is None else w.quant.bits / 8  # bytes a weight (scales and biases aside)
    head = [w.qkv_dim * w.hidden * b, 0, w.hidden * w.q_dim * b]
    m = w.moe
    if m is None:
        return head + [2 * w.inter * w.hidden * b, w.hidden * w.inter * b]
    gb = 2 if w.quant is None else w.quant.gate_bits / 8
    return head + [m.experts * w.hidden * gb, (2 * m.top_k * m.inter + 2 * m.shared) * w.hidden * b,
                   (m.top_k * m.inter + m.shared) * w.hidden * b]


def probe(model, shape: str, version: int, tokens: int, prompt: int = 128):
    logits, cache = prefill_random(model, prompt)
    step = make_step(model, cache, prompt, tokens + 8, f"megakernel_v{version}")
    dec, state = step.decoder, step.state
    dec.stamp_steps = True
    w = dec.w
    tok = mx.argmax(logits, axis=-1).astype(mx.int32)
    per_step, walls, marks = [], [], []
    for t in range(tokens):
        tic = time.perf_counter()
        logits = step(tok)
        tok = mx.argmax(logits, axis=-1).astype(mx.int32)
        mx.eval(tok)
        walls.append(time.perf_counter() - tic)
        times = dec.step_times(state)
        if t >= 4:
            per_step.append(times)
            marks.append(dec.step_marks(state))
    a = np.array(per_step)  # (tokens, P L + 1) microseconds
    L, P = w.layers, dec.phases
    names = MOE_PHASES if P == 6 else PHASES
    layer = a[:, : P * L].reshape(len(a), L, P)
    total = a.sum(axis=1)
    nb = phase_bytes(w)
    print(f"\n== {shape}, {dec.name} (version {version}), {dec.blocks} groups, {L} layers, "
          f"position ~{prompt + tokens // 2}")
    mk = np.array(marks)[:, : P * L].reshape(len(marks), L, P, 2)  # us from the step's start
    for p in range(P):
        us = float(layer[:, :, p].mean())
        bw = f"{nb[p] / us / 1e3:7.0f} GB/s" if nb[p] else "        -"
        m = mk[:, 1:, p].mean(axis=(0, 1))  # layer 0 aside (its start includes the launch)
        print(f"  phase {names[p]:<16} {us:7.2f} us  (x{L} = {us * L:7.1f} us)  weights {nb[p] / 1e6:6.2f} MB  {bw}"
              f"  | input ready {m[0]:5.2f} done {m[1]:5.2f}")
    m0 = mk[:, 0, 0]  # layer 0's phase 0: the launch, the token's embedding row
    print(f"  layer 0 phase 0        {float(layer[:, 0, 0].mean()):7.2f} us  | input ready {m0[:, 0].mean():6.2f} "
          f"done {m0[:, 1].mean():6.2f}; later layers' phase 0 {float(layer[:, 1:, 0].mean()):6.2f} us")
    print(f"  final norm             {float(a[:, -1].mean()):7.2f} us")
    print(f"  kernel total (stamps)  {float(np.median(total)):7.1f} us; whole token wall {np.median(walls[4:]) * 1e6:7.1f} us")
    worst = layer.mean(axis=0)  # (L, 5)
    print("  per-layer spread (max/min of a phase's layer means): "
          + ", ".join(f"{worst[:, p].max() / max(worst[:, p].min(), 1e-9):.2f}" for p in range(P)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["qwen2.5-0.5b", "qwen3-0.6b", "qwen3-4b"])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--versions", default="1,2")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before the timed steps (the context)")
    args = ap.parse_args()
    for shape in args.shapes:
        model, _ = load(f"dummy:{shape}")
        for v in (int(x) for x in args.versions.split(",")):
            probe(model, shape, v, args.tokens, args.prompt)


if __name__ == "__main__":
    main()
