"""JSONL trace events: `Tracer` writes them, `NullTracer` stands in at no cost.

Every event is one JSON object on its own line::

    {"ts": 0.0123, "wall": 1732230000.5, "phase": "decode_step", "dur": 0.021,
     "sync": false, "step": 3, "tokens": 1, "active_mem": 123, "peak_mem": 456}

``ts`` is the event's start in seconds since the tracer was created
(``time.perf_counter`` based), ``wall`` the same instant as Unix time, ``dur``
its length in seconds and ``sync`` whether it includes a host-device
synchronization (a readback or ``mx.eval``). ``tokens``, ``step`` and ``ops``
(MLX operations issued) are optional; any other keyword becomes a free-form
field. ``active_mem`` / ``peak_mem`` (bytes, MLX's process-wide counters) are
read at the end of each event when MLX is importable and ``memory`` is on.

The tracer is meant for one thread; the file is line buffered, so a trace
stays readable up to the last full event if the process dies.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Optional

from .errors import ProfilingError

FORMAT = "metalgen-trace/1"

# Keys the tracer owns; caller fields of these names are overridden.
_OWN_KEYS = ("ts", "wall", "phase", "dur")

_mem_readers: Optional[tuple] = None


def _memory_readers() -> tuple:
    """(active, peak) callables from MLX, or Nones; resolved once, lazily."""
    global _mem_readers
    if _mem_readers is None:
        active = peak = None
        try:
            import mlx.core as mx
        except Exception:  # no MLX: events simply carry no memory figures
            mx = None
        if mx is not None:
            # Newer MLX has them at top level; older ones only under mx.metal.
            for space in (mx, getattr(mx, "metal", None)):
                if space is None:
                    continue
                if active is None:
                    active = getattr(space, "get_active_memory", None)
                if peak is None:
                    peak = getattr(space, "get_peak_memory", None)
        _mem_readers = (active, peak)
    return _mem_readers


def _read(reader: Optional[Callable[[], int]]) -> Optional[int]:
    if reader is None:
        return None
    try:
        return int(reader())
    except Exception:
        return None


def _jsonable(value: Any) -> Any:
    """Fallback for json.dumps: NumPy/MLX scalars, paths, sets; else str()."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


class _Span:
    """Times a ``with`` block and writes one event when it exits."""

    __slots__ = ("_tracer", "_phase", "_fields", "_start")

    def __init__(self, tracer: "Tracer", phase: str, fields: dict) -> None:
        self._tracer = tracer
        self._phase = phase
        self._fields = fields
        self._start = 0.0

    def __enter__(self) -> dict:
        self._start = time.perf_counter()
        return self._fields

    def __exit__(self, exc_type, exc, tb) -> bool:
        end = time.perf_counter()
        if exc_type is not None:
            self._fields.setdefault("error", exc_type.__name__)
        self._tracer._write(self._phase, self._start, end - self._start, self._fields)
        return False


class Tracer:
    """Writes trace events as JSON lines to a path or a text file object.

    ``Tracer(path)`` creates (truncates) the file and closes it on `close`;
    a file object passed in is only flushed, never closed. With
    ``memory=False`` no memory figures are read.
    """

    enabled = True

    def __init__(self, dest, *, memory: bool = True) -> None:
        if isinstance(dest, (str, os.PathLike)):
            self.path: Optional[str] = os.fspath(dest)
            try:
                self._fh = open(self.path, "w", encoding="utf-8", buffering=1)
            except OSError as e:
                raise ProfilingError(
                    f"cannot open trace file {self.path}: {e.strerror or e}"
                ) from None
            self._owns = True
        elif callable(getattr(dest, "write", None)):
            name = getattr(dest, "name", None)
            self.path = name if isinstance(name, str) else None
            self._fh = dest
            self._owns = False
        else:
            raise TypeError(f"Tracer needs a path or a file object, not {type(dest).__name__}")
        self._mem = _memory_readers() if memory else (None, None)
        self._closed = False
        self._t0 = time.perf_counter()
        self._wall0 = time.time()

    # -- events -----------------------------------------------------------
    def span(self, phase: str, **fields: Any) -> _Span:
        """Context manager timing its block; writes the event on exit.

        It yields the event's field dict, which the block may update
        (``ev["tokens"] = n``). An exception leaving the block is recorded
        as ``error: <type name>`` and propagates.
        """
        return _Span(self, phase, fields)

    def event(self, phase: str, dur: float, **fields: Any) -> None:
        """Write an event the caller timed, taken to have ended just now."""
        now = time.perf_counter()
        self._write(phase, now - dur, float(dur), fields)

    def meta(self, **fields: Any) -> None:
        """Write a ``{"phase": "meta", ...}`` header (model, backend, device, ...).

        ``argv`` defaults to ``sys.argv`` and ``format`` to the trace format.
        """
        ts = time.perf_counter() - self._t0
        ev = {"ts": ts, "wall": self._wall0 + ts, "phase": "meta"}
        ev["format"] = FORMAT
        ev["argv"] = list(sys.argv)
        ev.update((k, v) for k, v in fields.items() if k not in _OWN_KEYS)
        self._emit(ev)

    # -- plumbing -----------------------------------------------------------
    def _write(self, phase: str, start: float, dur: float, fields: dict) -> None:
        ts = start - self._t0
        ev = {"ts": ts, "wall": self._wall0 + ts, "phase": phase, "dur": dur, "sync": False}
        for k, v in fields.items():
            if k not in _OWN_KEYS:
                ev[k] = v
        active, peak = self._mem
        if active is not None and "active_mem" not in ev:
            value = _read(active)
            if value is not None:
                ev["active_mem"] = value
        if peak is not None and "peak_mem" not in ev:
            value = _read(peak)
            if value is not None:
                ev["peak_mem"] = value
        self._emit(ev)

    def _emit(self, ev: dict) -> None:
        if self._closed:
            raise ProfilingError(f"trace is closed; cannot write a {ev['phase']!r} event")
        self._fh.write(json.dumps(ev, default=_jsonable, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        """Push buffered lines to the file."""
        if not self._closed:
            self._fh.flush()

    def close(self) -> None:
        """Flush, and close the file if the tracer opened it. Idempotent."""
        if self._closed:
            return
        self._fh.flush()
        self._closed = True
        if self._owns:
            self._fh.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Tracer":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> dict:
        return _SCRATCH

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False


# What a null span yields: a shared scratch dict, written to and never read.
_SCRATCH: dict = {}
_NULL_SPAN = _NullSpan()


class NullTracer:
    """The `Tracer` API doing nothing: what the engine holds when profiling is off.

    `span` returns one shared no-op context manager, so a traced block costs
    a method call and a ``with``, and nothing is timed, read or written.
    """

    __slots__ = ()
    enabled = False
    path = None
    closed = False

    def span(self, phase: str, **fields: Any) -> _NullSpan:
        """A shared no-op context manager (it yields a scratch dict)."""
        return _NULL_SPAN

    def event(self, phase: str, dur: float = 0.0, **fields: Any) -> None:
        """Does nothing."""

    def meta(self, **fields: Any) -> None:
        """Does nothing."""

    def flush(self) -> None:
        """Does nothing."""

    def close(self) -> None:
        """Does nothing."""

    def __enter__(self) -> "NullTracer":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False


NULL_TRACER = NullTracer()


def make_tracer(dest=None, **kwargs: Any):
    """A `Tracer` writing to ``dest`` (path or file object), or the shared
    `NullTracer` when ``dest`` is None or empty. ``kwargs`` go to `Tracer`."""
    if dest is None or dest == "":
        return NULL_TRACER
    return Tracer(dest, **kwargs)
