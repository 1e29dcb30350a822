"""Where a decode token's device time goes, from a trace of its launches: each launch of a token (the
megakernel, the LM head, the sampler, any MLX operation between them) with its mean time and the idle gap
before it.

    PYTHONPATH=. python3 benchmarks/cuda_trace.py qwen2.5-0.5b /tmp/run.csv      (torch's profiler)
    python3 benchmarks/trace_token.py /tmp/run.csv [--anchor megakernel] [--last 200]

The CSV has the columns of Nsight Systems' `nsys stats -r cuda_gpu_trace -f csv` (Start (ns), Duration (ns),
Name), so that report serves as well where nsys is installed.

A token starts at each launch of the anchor (default: the kernel with the most total time, the megakernel
in a fused decode). Tokens whose launch sequence is not the most common one (prefill, the first steps, the
end of a run) are left out, so the table is the steady state.
"""

from __future__ import annotations

import argparse
import collections
import csv
import statistics
import sys


def read_trace(path):
    """[(start ns, duration ns, name)] in start order, from nsys's cuda_gpu_trace CSV."""
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        start = next(c for c in cols if c.startswith("Start"))
        dur = next(c for c in cols if c.startswith("Duration"))
        name = next(c for c in cols if c == "Name")
        for r in reader:
            rows.append((int(float(r[start])), int(float(r[dur])), r[name]))
    rows.sort()
    return rows


def short(name: str, width: int = 56) -> str:
    # MLX's custom kernels carry long template names; the head of the name tells them apart
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width - 3] + "..."


def tokens(rows, anchor: str):
    """The launches split at each anchor launch: [[(start, duration, name), ...], ...]."""
    out, cur = [], None
    for r in rows:
        if anchor in r[2]:
            if cur is not None:
                out.append(cur)
            cur = [r]
        elif cur is not None:
            cur.append(r)
    return out


def breakdown(toks, last: int):
    """Mean (name, duration us, gap before us) for each launch of the most common token sequence, and the
    mean token span (from one anchor's start to the next's)."""
    spans = [nxt[0][0] - t[0][0] for t, nxt in zip(toks, toks[1:])]
    toks = toks[:-1]
    keyed = [tuple(short(r[2]) for r in t) for t in toks]
    common, _ = collections.Counter(keyed).most_common(1)[0]
    picked = [(t, s) for t, s, k in zip(toks, spans, keyed) if k == common][-last:]
    table = []
    for i, name in enumerate(common):
        durs = [t[i][1] / 1e3 for t, _ in picked]
        gaps = [(t[i][0] - (t[i - 1][0] + t[i - 1][1])) / 1e3 for t, _ in picked] if i else [0.0] * len(picked)
        table.append((name, statistics.mean(durs), statistics.median(durs), statistics.mean(gaps)))
    tail = [(s - (t[-1][0] + t[-1][1] - t[0][0])) / 1e3 for t, s in picked]
    return table, statistics.mean(tail), statistics.mean(s / 1e3 for _, s in picked), len(picked), len(toks)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="nsys stats -r cuda_gpu_trace -f csv output")
    ap.add_argument("--anchor", default=None, help="a substring of the launch that starts a token")
    ap.add_argument("--last", type=int, default=200, help="the last N steady tokens")
    args = ap.parse_args(argv)
    rows = read_trace(args.trace)
    if not rows:
        sys.exit("no launches in the trace")
    anchor = args.anchor
    if anchor is None:
        total = collections.Counter()
        for _, d, n in rows:
            total[n] += d
        anchor = total.most_common(1)[0][0]
    toks = tokens(rows, anchor)
    if len(toks) < 3:
        sys.exit(f"fewer than 3 launches of {short(anchor)!r}")
    table, tail, span, n, seen = breakdown(toks, args.last)
    print(f"{n} tokens of {seen} with the common sequence; anchor {short(anchor)!r}")
    print(f"  {'launch':56s} {'mean us':>9s} {'median':>9s} {'gap before':>11s}")
    for name, mean, med, gap in table:
        print(f"  {name:56s} {mean:9.2f} {med:9.2f} {gap:11.2f}")
    busy = sum(m for _, m, _, _ in table)
    gaps = sum(g for *_, g in table) + tail
    print(f"  {'idle before the next token':56s} {'':9s} {'':9s} {tail:11.2f}")
    print(f"  token span {span:.2f} us: launches {busy:.2f}, idle {gaps:.2f}")


if __name__ == "__main__":
    main()
