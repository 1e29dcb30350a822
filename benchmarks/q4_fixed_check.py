"""How far the 4-bit megakernel's logits are from the reference decoder's (the start-up self-check's measure,
||a - b|| / ||b||, metalgen/decode/path.py) with the rows' x in 16-bit fixed point (MG_Q4_FIXED) and without.

    PYTHONPATH=. python3 benchmarks/q4_fixed_check.py [shape ...] [--steps 8] [--variants "f:MG_Q4_FIXED=1;..."]
"""

from __future__ import annotations

import argparse

from benchmarks.decode_step_probe import parse_variants
from metalgen.api import load
from metalgen.decode import gpu
from metalgen.decode.path import CHECK_RTOL, self_check, stacked_weights
from kernels_metal import source as S


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["qwen3-8b-4bit"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--variants", type=parse_variants, default="float:MG_Q4_FIXED=0;fixed:MG_Q4_FIXED=1",
                    help="label:DEF=v,...;label2:... as benchmarks/decode_step_probe.py takes them")
    args = ap.parse_args()
    for shape in args.shapes:
        model = load(f"dummy:{shape}")[0]
        w = stacked_weights(model)
        base = gpu.MegakernelDecoder(w)
        print(f"== {shape}: ||a - b|| / ||b|| of the logits against the reference, {args.steps} steps "
              f"(the load check's bound {CHECK_RTOL})")
        for label, defines in args.variants:
            dec = gpu.MegakernelDecoder(w)
            dec.kernel_name = S.with_defines(base.kernel_name, label, [d for d in defines if d[0] != "@"],
                                             dict(defines).get("@"))
            print(f"  {label:<8} {self_check(dec, w, steps=args.steps, head=model.logits):.4f}", flush=True)


if __name__ == "__main__":
    main()
