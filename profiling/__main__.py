"""``python -m profiling summarize TRACE.jsonl [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from .errors import ProfilingError
from .summary import format_summary, summarize


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m profiling",
        description="Tools for metalgen JSONL traces.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    summ = sub.add_parser(
        "summarize",
        help="per-phase timing table of a trace",
        description="Per-phase counts, totals, p50/p90 (nearest rank), tokens/s, "
        "time to first token, syncs and ops per token, peak memory.",
    )
    summ.add_argument("trace", help="a JSONL trace file")
    summ.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status (1 on a bad trace)."""
    args = _parser().parse_args(argv)
    try:
        summary = summarize(args.trace)
    except ProfilingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
