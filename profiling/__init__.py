"""Opt-in profiling: JSONL trace events (`Tracer`) and their summary.

Off by default: ``make_tracer(None)`` gives the shared `NullTracer`, whose
spans cost a method call. ``python -m profiling summarize trace.jsonl``
prints the per-phase table.
"""

from .errors import ProfilingError
from .summary import format_summary, percentile, read_events, summarize, summarize_events
from .trace import NULL_TRACER, NullTracer, Tracer, make_tracer

__all__ = [
    "Tracer",
    "NullTracer",
    "NULL_TRACER",
    "make_tracer",
    "summarize",
    "summarize_events",
    "read_events",
    "percentile",
    "format_summary",
    "ProfilingError",
]
