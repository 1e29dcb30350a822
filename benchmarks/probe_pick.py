"""Pick a #define's value from decode_step_probe.py runs, on the device, so that one call can probe, pick and bench.

    python3 benchmarks/probe_pick.py PROBE_LOG [PROBE_LOG ...] --base d,D --variants a:1,A:1,e:7,E:7 [--gate -0.3]

Each log is decode_step_probe.py's output for one or more shapes. For every shape, the full greedy token of each
variant label is compared with the mean of the base labels'; a value's change on a shape is the mean over its labels.
A value whose every check gave the default's bits, that is no more than --worst (percent) slower on any shape, and
whose mean change over the shapes is at or below --gate (percent), wins if it has the lowest mean; otherwise 0. Prints each value's changes and
`picked N` last (a shell reads it with `tail -n 1`).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

FULL = re.compile(r"^\s+full, greedy, (\S+)\s+([\d.]+)\s*$")
CHECK = re.compile(r"^\s+check, (\S+)\s+.*, (the same bits|not the same bits)\s*$")
SHAPE = re.compile(r"^== (\S+):")


def read(paths):
    """{shape: {label: [us, ...]}} and the labels whose check did not give the same bits."""
    times, wrong = defaultdict(lambda: defaultdict(list)), set()
    for p in paths:
        shape = None
        for line in open(p):
            m = SHAPE.match(line)
            if m:
                shape = m.group(1)
                continue
            m = FULL.match(line)
            if m and shape:
                times[shape][m.group(1)].append(float(m.group(2)))
                continue
            m = CHECK.match(line)
            if m and m.group(2) != "the same bits":
                wrong.add(m.group(1))
    return times, wrong


def pick(times, wrong, values, base, gate, worst):
    """The winning value (0: none) and a line a value: `values` {value: [labels]}, `base` the default's labels."""
    best, best_mean, lines = 0, gate, []
    for value, labels in sorted(values.items()):
        changes, names = [], []
        for shape, t in times.items():
            ref = [x for b in base for x in t.get(b, [])]
            got = [x for lb in labels for x in t.get(lb, [])]
            if ref and got:
                changes.append(100.0 * (sum(got) / len(got) / (sum(ref) / len(ref)) - 1.0))
                names.append(shape)
        bad = sorted(set(labels) & wrong)
        mean = sum(changes) / len(changes) if changes else float("inf")
        lines.append(f"{value}: mean {mean:+.2f}%; " + ", ".join(f"{n} {c:+.2f}%" for n, c in zip(names, changes))
                     + (f"; not the same bits: {bad}" if bad else ""))
        if not bad and changes and max(changes) <= worst and mean <= best_mean:
            best, best_mean = value, mean
    return best, lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--base", default="d,D", help="the default build's labels")
    ap.add_argument("--variants", required=True, help="label:value pairs, comma-separated")
    ap.add_argument("--gate", type=float, default=-0.3, help="largest mean change (percent) that can win")
    ap.add_argument("--worst", type=float, default=0.0, help="largest change on one shape (percent) that can win")
    a = ap.parse_args()
    times, wrong = read(a.logs)
    values = defaultdict(list)
    for pair in a.variants.split(","):
        label, value = pair.split(":")
        values[int(value)].append(label)
    best, lines = pick(times, wrong, values, a.base.split(","), a.gate, a.worst)
    print("\n".join(lines))
    print(f"picked {best}")


if __name__ == "__main__":
    main()
