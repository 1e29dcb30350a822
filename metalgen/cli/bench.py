"""`metalgen bench`: prefill and decode speed, optionally next to mlx-lm on the same weights."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure prefill and decode speed",
                       description="Measure time to first token, prefill and decode tokens/s.")
    p.add_argument("--model", default="dummy:qwen2.5-0.5b")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--runs", type=int, default=3, help="timed runs after one warm-up; medians")
    p.add_argument("--compare", choices=["mlx-lm"], default=None)
    p.add_argument("--json", metavar="OUT.json", default=None, help="also write the figures here")
    p.add_argument("--decode", choices=["auto", "plain", "fused", "megakernel", "reference"],
                   default="auto", help="decode path after prefill (docs/decode.md); default: %(default)s")
    p.add_argument("--profile", action="store_true",
                   help="also count MLX operations and host-device syncs per token (plain vs ours)")


def format_table(report) -> str:
    lines = [
        f"backend {report['backend']} ({report['device']}), weights {report['weight_gb']:.2f} GB, "
        f"copy bandwidth {report['copy_bandwidth_gbs']:.0f} GB/s, "
        f"decode floor {report['floor_decode_tps']:.0f} tok/s, decode path {report.get('decode_path', '?')}",
        f"{'engine':<10} {'prompt':>6} {'gen':>5} {'ttft ms':>9} {'prefill tok/s':>14} "
        f"{'decode tok/s':>13} {'% floor':>8} {'peak GB':>8}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['engine']:<10} {r['prompt_tokens']:>6} {r['gen_tokens']:>5} {r['ttft_ms']:>9.1f} "
            f"{r['prefill_tps']:>14.0f} {r['decode_tps']:>13.1f} "
            f"{100 * r['decode_tps'] / report['floor_decode_tps']:>7.1f}% {r['peak_memory_gb']:>8.2f}"
        )
    if "decode_ratio" in report:
        lines.append(f"metalgen / mlx-lm: decode {report['decode_ratio']:.2f}x, "
                     f"prefill {report['prefill_ratio']:.2f}x")
    for path, figures in report.get("profile", {}).items():
        lines.append(f"profile {path:<10} MLX ops/token {figures['ops_per_token']:>5}, "
                     f"host-device syncs/token {figures['syncs_per_token']:.2f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..api import load
    from ..bench import run_bench

    model, _ = load(args.model, dtype=args.dtype)
    report = run_bench(model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                       runs=args.runs, compare=args.compare, decode=args.decode, profile=args.profile)
    report["model"] = args.model
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0
