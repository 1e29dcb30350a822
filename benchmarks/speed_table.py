"""The README's dense-decode speed table, regenerated from GPU rounds' `metalgen bench --json` files.

    python3 benchmarks/speed_table.py RESULTS_DIR [RESULTS_DIR ...] [--readme README.md]

Each RESULTS_DIR holds bench_<name>.json files (benchmarks/dense_gpu_round.sh writes them, one per shape and
setting, each with metalgen's and mlx-lm's results from the same run). Given several, oldest first, a row (model,
prompt, sampling, decode path) comes from the last directory that has it, and a last column names that directory (under
benchmarks/results/), so that the table holds each row's latest run and says which. The table replaces whatever
stands between the README's `<!-- speed-table -->` and `<!-- /speed-table -->` markers; without --readme it is
printed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

START, END = "<!-- speed-table -->", "<!-- /speed-table -->"


def _setting(report: dict) -> str:
    s = report.get("sampling") or {}
    parts = []
    if s.get("temperature"):
        parts.append(f"temp {s['temperature']}")
        if s.get("top_p", 1.0) < 1.0:
            parts.append(f"top-p {s['top_p']}")
        if s.get("top_k"):
            parts.append(f"top-k {s['top_k']}")
    if s.get("repetition_penalty", 1.0) != 1.0:
        parts.append(f"repetition penalty {s['repetition_penalty']}")
    return ", ".join(parts) or "greedy"


def _key(report: dict) -> tuple:
    """What a row is a measurement of: the model, the prompt length, the sampling and the decode path (a round may
    bench one model on two paths, as benchmarks/metal_round.sh does)."""
    return report.get("model", "?"), report["results"][0]["prompt_tokens"], _setting(report), report.get("decode_path")


def _run_name(folder: Path) -> str:
    """A results folder as the table names it: its path under benchmarks/results/ where it is there."""
    parts = folder.resolve().parts
    under = [i for i, p in enumerate(parts) if p == "results"]
    return "/".join(parts[under[-1] + 1:]) if under else folder.name


def _row(report: dict) -> list:
    ours, theirs = report["results"][0], report["results"][1] if len(report["results"]) > 1 else None
    model = report.get("model", "?").replace("dummy:", "")
    ctx = f"{ours['prompt_tokens']}"
    ratio = f"{report['decode_ratio']:.2f}x" if theirs else ""
    return [f"`{model}`", ctx, _setting(report), report.get("decode_path", "?"), f"{ours['decode_tps']:.1f}",
            f"{theirs['decode_tps']:.1f}" if theirs else "", ratio,
            f"{report['weight_gb']:.2f}", f"{ours['peak_memory_gb']:.2f}" + (f" ({theirs['peak_memory_gb']:.2f})" if theirs else "")]


def _order(rep: dict):
    # dense shapes by family and size, bf16 before 4-bit, then the settings and long contexts
    model = rep.get("model", "")
    m = re.search(r"(qwen[\d.]+)-([\d.]+)b", model)
    family, size = (m.group(1), float(m.group(2))) if m else (model, 0.0)
    return (rep["results"][0]["prompt_tokens"], _setting(rep) != "greedy", "bit" in model, family, size)


def table(*results: Path) -> str:
    """The table of the runs in `results` (oldest first: a later directory's row replaces an earlier one's); with
    more than one directory, a column names each row's."""
    latest = {}
    for folder in results:
        files = sorted(folder.glob("bench_*.json"))
        if not files:
            raise SystemExit(f"no bench_*.json in {folder}")
        for f in files:
            report = json.loads(f.read_text())
            latest[_key(report)] = (report, folder)
    head = ["model", "prompt", "sampling", "path", "metalgen tok/s", "mlx-lm tok/s", "ratio", "weights GB",
            "peak GB (mlx-lm)"] + (["run"] if len(results) > 1 else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for report, folder in sorted(latest.values(), key=lambda rf: _order(rf[0])):
        row = _row(report) + ([f"`{_run_name(folder)}`"] if len(results) > 1 else [])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+", help="results folders, oldest first")
    ap.add_argument("--readme", type=Path, default=None)
    args = ap.parse_args(argv)
    text = table(*args.results)
    if args.readme is None:
        print(text)
        return 0
    readme = args.readme.read_text()
    if START not in readme or END not in readme:
        raise SystemExit(f"{args.readme} has no {START} ... {END} section")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    args.readme.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
