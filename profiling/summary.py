"""Read a JSONL trace and reduce it to per-phase figures.

Percentiles use the nearest-rank definition: the p-th percentile of n sorted
durations is the ``ceil(p * n / 100)``-th smallest (1-based), always one of
the measured values. For durations 1..10 ms that gives p50 = 5 ms and
p90 = 9 ms; for a single event both equal it.

Derived figures (None where they cannot be derived):

* generated tokens: the ``readback`` events, one token each, where the trace
  has them; otherwise the ``decode_step`` events, each counting its ``tokens``
  field, or 1 where it has none;
* decode tokens/s: with readbacks, the tokens after the first over the wall time
  from the first readback's end to the last one's (the engine enqueues work
  asynchronously, so only readbacks see device time); otherwise generated
  tokens / total ``decode_step`` duration;
* time to first token: the earliest end (``ts + dur``) of a ``prefill`` or
  ``decode_step`` event, measured from the start of the first event that is
  neither ``meta`` nor ``load`` (so model loading is not counted);
* syncs per token: events with ``sync`` true, model loading excepted, /
  generated tokens;
* ops per token: the sum of ``ops`` over all events / generated tokens;
* peak memory: the largest ``peak_mem`` (else ``active_mem``) seen.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Optional

from .errors import ProfilingError

_NUMERIC = ("ts", "dur", "tokens", "ops", "active_mem", "peak_mem")


def percentile(values: Iterable[float], p: int) -> Optional[float]:
    """Nearest-rank percentile of ``values`` (None when empty), 0 < p <= 100."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, -(-p * len(ordered) // 100))  # ceil without float error
    return ordered[rank - 1]


def read_events(path) -> list:
    """Parse a trace file into a list of event dicts.

    Blank lines are skipped; a missing file, a malformed line, a line that is
    not an object, an event without ``phase``, an event other than ``meta``
    without a numeric ``dur``, or a non-numeric standard field raises
    `ProfilingError` with a one-line message naming the file and line.
    """
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        raise ProfilingError(f"{name}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfilingError(f"{name}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    events = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise ProfilingError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(ev, dict):
            raise ProfilingError(f"{where}: expected a JSON object, got {type(ev).__name__}")
        phase = ev.get("phase")
        if not isinstance(phase, str) or not phase:
            raise ProfilingError(f"{where}: event has no 'phase'")
        for key in _NUMERIC:
            if key in ev and not _is_number(ev[key]):
                raise ProfilingError(f"{where}: '{key}' must be a number, got {ev[key]!r}")
        if phase != "meta" and "dur" not in ev:
            raise ProfilingError(f"{where}: {phase!r} event has no 'dur'")
        events.append(ev)
    return events


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den else None


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1e3


def summarize_events(events: list, path: Optional[str] = None) -> dict:
    """The summary dict of already parsed events (see `summarize`)."""
    meta: dict = {}
    by_phase: dict = {}
    for ev in events:
        if ev["phase"] == "meta":
            meta.update((k, v) for k, v in ev.items() if k not in ("ts", "wall", "phase"))
        else:
            by_phase.setdefault(ev["phase"], []).append(ev)

    phases = {}
    for phase, evs in by_phase.items():
        durs = [ev["dur"] for ev in evs]
        total = sum(durs)
        has_tokens = any("tokens" in ev for ev in evs)
        tokens = sum(ev.get("tokens", 0) for ev in evs) if has_tokens else None
        has_ops = any("ops" in ev for ev in evs)
        phases[phase] = {
            "count": len(evs),
            "total_ms": total * 1e3,
            "p50_ms": _ms(percentile(durs, 50)),
            "p90_ms": _ms(percentile(durs, 90)),
            "tokens": tokens,
            "tokens_per_s": _ratio(tokens, total) if tokens else None,
            "syncs": sum(1 for ev in evs if ev.get("sync")),
            "ops": sum(ev.get("ops", 0) for ev in evs) if has_ops else None,
        }

    work = [ev for ph, evs in by_phase.items() for ev in evs]
    decode = by_phase.get("decode_step", [])
    readbacks = sorted(by_phase.get("readback", []), key=lambda ev: ev["ts"])
    if readbacks:
        generated = len(readbacks)
        span = readbacks[-1]["ts"] + readbacks[-1]["dur"] - readbacks[0]["ts"] - readbacks[0]["dur"]
        decode_rate = _ratio(generated - 1, span) if generated > 1 else None
    else:
        generated = sum(ev.get("tokens", 1) for ev in decode)
        decode_rate = _ratio(generated, sum(ev["dur"] for ev in decode)) if generated else None
    syncs = sum(1 for ev in work if ev.get("sync") and ev["phase"] != "load")
    has_ops = any("ops" in ev for ev in work)
    ops = sum(ev.get("ops", 0) for ev in work) if has_ops else None
    peaks = [ev["peak_mem"] for ev in events if "peak_mem" in ev]
    if not peaks:
        peaks = [ev["active_mem"] for ev in events if "active_mem" in ev]

    return {
        "path": path,
        "meta": meta,
        "events": len(work),
        "phases": phases,
        "generated_tokens": generated,
        "decode_tokens_per_s": decode_rate,
        "ttft_ms": _ms(_time_to_first_token(work)),
        "syncs": syncs,
        "syncs_per_token": _ratio(syncs, generated),
        "ops": ops,
        "ops_per_token": _ratio(ops, generated) if ops is not None else None,
        "peak_mem_bytes": max(peaks) if peaks else None,
    }


def _time_to_first_token(work: list) -> Optional[float]:
    timed = [ev for ev in work if "ts" in ev]
    ends = [ev["ts"] + ev["dur"] for ev in timed if ev["phase"] in ("prefill", "decode_step")]
    starts = [ev["ts"] for ev in timed if ev["phase"] != "load"]
    if not ends or not starts:
        return None
    return min(ends) - min(starts)


def summarize(path) -> dict:
    """Summarize the trace at ``path``.

    Returns a JSON-serializable dict: ``meta`` (merged meta headers),
    ``events``, ``phases`` (per phase, in order of first appearance:
    ``count``, ``total_ms``, ``p50_ms``, ``p90_ms``, ``tokens``,
    ``tokens_per_s``, ``syncs``, ``ops``), ``generated_tokens``,
    ``decode_tokens_per_s``, ``ttft_ms``, ``syncs``, ``syncs_per_token``,
    ``ops``, ``ops_per_token`` and ``peak_mem_bytes``. Raises `ProfilingError`.
    """
    return summarize_events(read_events(path), path=os.fspath(path))


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def format_summary(summary: dict) -> str:
    """Render a `summarize` dict as a plain-text table and a few totals."""
    out = []
    if summary.get("path"):
        out.append(f"trace: {summary['path']}")
    meta = summary.get("meta") or {}
    shown = [f"{k}={meta[k]}" for k in ("model", "backend", "device", "prompt_tokens") if k in meta]
    if shown:
        out.append("  ".join(shown))
    phases = summary.get("phases") or {}
    if not phases:
        out.append("no events")
        return "\n".join(out)
    width = max(12, *(len(p) for p in phases))
    out.append(
        f"{'phase':<{width}} {'count':>6} {'total ms':>10} {'p50 ms':>9} "
        f"{'p90 ms':>9} {'tokens':>7} {'tok/s':>9} {'syncs':>6}"
    )
    for phase, row in phases.items():
        out.append(
            f"{phase:<{width}} {row['count']:>6} {row['total_ms']:>10.2f} "
            f"{_fmt(row['p50_ms'], '.2f'):>9} {_fmt(row['p90_ms'], '.2f'):>9} "
            f"{_fmt(row['tokens'], '.0f'):>7} {_fmt(row['tokens_per_s'], '.1f'):>9} "
            f"{row['syncs']:>6}"
        )
    out.append("")
    out.append(
        f"decode: {_fmt(summary['generated_tokens'], '.0f')} tokens, "
        f"{_fmt(summary['decode_tokens_per_s'], '.1f')} tok/s"
    )
    ttft = summary["ttft_ms"]
    out.append(f"time to first token: {'-' if ttft is None else f'{ttft:.1f} ms'}")
    out.append(
        f"syncs per token: {_fmt(summary['syncs_per_token'], '.2f')} "
        f"({summary['syncs']} syncs)"
    )
    if summary.get("ops") is not None:
        out.append(f"ops per token: {_fmt(summary['ops_per_token'], '.1f')} ({summary['ops']} ops)")
    out.append(f"peak memory: {_bytes(summary.get('peak_mem_bytes'))}")
    return "\n".join(out)
