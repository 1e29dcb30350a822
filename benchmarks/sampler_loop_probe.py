"""What each sampling setting adds to a pipelined megakernel token: the generate_step loop (the token history grown
by a concatenation where a repetition penalty needs it, the penalty folded into the sampler's launch) with greedy,
temperature alone, top-p, the penalty, and both, each twice, in one process.

    PYTHONPATH=.:tests python3 benchmarks/sampler_loop_probe.py [shape ...] [--tokens 128] [--prompt 128]

Prints microseconds per pipelined token (decode_step_probe.pipelined). The difference from greedy is the device
time the setting adds: the host's work of a step is hidden behind the device's at these speeds.
"""

from __future__ import annotations

import argparse

from metalgen.api import load

from scalar_pool_probe import sampler_loop

SETTINGS = [  # (label, make_sampler settings, repetition penalty)
    ("greedy", {}, None),
    ("temp 0.7", dict(temperature=0.7), None),
    ("temp 0.7 top-p 0.9", dict(temperature=0.7, top_p=0.9), None),
    ("greedy, rep 1.1", {}, 1.1),
    ("temp 0.7 top-p 0.9 rep 1.1", dict(temperature=0.7, top_p=0.9), 1.1),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["qwen3-0.6b"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128)
    args = ap.parse_args()
    for shape in args.shapes:
        model, _ = load(f"dummy:{shape}")
        print(f"\n== {shape}: microseconds per token, pipelined, {args.tokens} tokens, prompt {args.prompt}")
        for rnd in range(2):
            for label, settings, penalty in SETTINGS:
                us = sampler_loop(model, args.tokens, args.prompt, settings, penalty, True)
                print(f"  {label:<27} run {rnd}: {us:7.1f}")


if __name__ == "__main__":
    main()
