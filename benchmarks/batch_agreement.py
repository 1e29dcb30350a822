"""Greedy agreement of the running batch with each request alone (issue 17: "on the GPU, report the agreement").

    PYTHONPATH=. python3 benchmarks/batch_agreement.py [MODEL] [--prompts 32] [--prompt-tokens 128]
        [--gen-tokens 128] [--max-batch 32] [--dtype bfloat16] [--seed 0]

Every prompt (distinct random ids) is decoded greedily twice: all of them at once in one BatchGenerator
(joining in groups, as a server's arrivals do), and each alone through `stream_generate` on the path a user
gets (`decode` auto: on CUDA the fused single-sequence decode). On the CPU in float32 the two agree token for
token (tests/test_batch.py). Elsewhere a batched product rounds otherwise than a single-row one (a GEMM
against a GEMV, TF32 for float32 on CUDA), and a random checkpoint's logits are nearly flat, so an argmax may
flip where two tokens are within a rounding of each other; after that the texts go their own ways. Reported:
how many sequences agree whole, and where the others first differ (the token index). Results: benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys

import kernels_metal as K
import metalgen
from metalgen.batch import BatchGenerator
from metalgen.generate import stream_generate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="dummy:qwen3-0.6b")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model, tok = metalgen.load(args.model, dtype=args.dtype)
    rng = random.Random(args.seed)
    # ordinary text tokens: past the bytes and below the added and special ones
    prompts = [[rng.randrange(1000, min(tok.vocab_size, 100_000)) for _ in range(args.prompt_tokens)]
               for _ in range(args.prompts)]
    # nothing ends early: EOS ids are not stops here, so every sequence runs its --gen-tokens
    gen = BatchGenerator(model, max_batch=args.max_batch)
    uids = [gen.insert(p, args.gen_tokens, None, (), ()) for p in prompts]
    batched = {u: [] for u in uids}
    while gen.busy:
        for r in gen.step():
            batched[r.uid].append(r.token)
    firsts = []
    for u, p in zip(uids, prompts):
        alone = [r.token for r in stream_generate(model, tok, p, max_tokens=args.gen_tokens, eos_token_ids=())]
        both = batched[u]
        first = next((i for i, (a, b) in enumerate(zip(alone, both)) if a != b), None)
        if first is None and len(alone) != len(both):
            first = min(len(alone), len(both))
        firsts.append(first)
    differ = sorted(f for f in firsts if f is not None)
    out = {"model": args.model, "dtype": args.dtype, "backend": K.backend(), "prompts": args.prompts,
           "gen_tokens": args.gen_tokens, "max_batch": args.max_batch, "agree_whole": len(firsts) - len(differ), "first_difference": differ,
           "first_difference_median": statistics.median(differ) if differ else None}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
