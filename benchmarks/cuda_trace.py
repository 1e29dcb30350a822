"""A decode run's device launches, recorded through torch's profiler (CUPTI sees every kernel of the process,
MLX's too), written as the CSV that benchmarks/trace_token.py reads: where there is no Nsight Systems.

    PYTHONPATH=. python3 benchmarks/cuda_trace.py SHAPE OUT.csv [--gen-tokens 256] [--temp 0.7 --top-p 0.9
        --repetition-penalty 1.1] [--decode auto]

torch is a benchmark extra (it is on the GPU machine); one warm-up run, then one traced run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile

import mlx.core as mx


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape")
    ap.add_argument("out")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--decode", default=None)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    args = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from metalgen.bench import metalgen_steps
    from metalgen.loading import load

    model, _ = load(f"dummy:{args.shape}")
    sampling = dict(temperature=args.temp, top_p=args.top_p, top_k=args.top_k,
                    repetition_penalty=args.repetition_penalty)
    steps = metalgen_steps(model, args.decode, sampling)
    prompt = mx.random.randint(0, 1000, (args.prompt_tokens,), key=mx.random.key(0)).astype(mx.int32)
    for _ in steps(prompt, args.gen_tokens):  # warm-up: compilation, allocation
        pass
    mx.synchronize()
    if torch.cuda.is_available():
        torch.cuda.init()  # the profiler's CUPTI needs the runtime up
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in steps(prompt, args.gen_tokens):
            pass
        mx.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    rows = [(int(float(e["ts"]) * 1e3), int(float(e["dur"]) * 1e3), e["name"]) for e in events
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rows.sort()
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Start (ns)", "Duration (ns)", "Name"])
        w.writerows(rows)
    print(f"{len(rows)} launches -> {args.out}")


if __name__ == "__main__":
    main()
