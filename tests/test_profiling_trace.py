"""profiling.trace: the JSONL Tracer, the NullTracer and make_tracer."""

import io
import json
import subprocess
import sys
import time
import timeit
from pathlib import Path

import numpy as np
import pytest

from profiling import NullTracer, ProfilingError, Tracer, make_tracer

REPO = Path(__file__).resolve().parents[1]


def lines_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_events_are_json_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    before = time.time()
    with Tracer(path) as tr:
        tr.meta(model="qwen3-0.6b", backend="cpu", prompt_tokens=7)
        with tr.span("prefill", tokens=7, sync=True):
            pass
        tr.event("readback", dur=0.002, sync=True)
    evs = lines_of(path)
    assert [e["phase"] for e in evs] == ["meta", "prefill", "readback"]
    meta = evs[0]
    assert meta["model"] == "qwen3-0.6b" and meta["prompt_tokens"] == 7
    assert meta["format"] == "metalgen-trace/1" and isinstance(meta["argv"], list)
    for e in evs:
        assert isinstance(e["ts"], float) and isinstance(e["wall"], float)
        assert before - 1 <= e["wall"] <= time.time() + 1
    assert evs[1]["ts"] <= evs[2]["ts"] + evs[2]["dur"]
    assert evs[2]["dur"] == pytest.approx(0.002)
    assert evs[1]["sync"] is True and evs[1]["tokens"] == 7


def test_span_timing(tmp_path):
    path = tmp_path / "t.jsonl"
    with Tracer(path) as tr:
        with tr.span("load"):
            time.sleep(0.01)
    (ev,) = lines_of(path)
    assert 0.01 <= ev["dur"] < 1.0
    assert ev["ts"] >= 0.0


def test_span_fields_updated_inside_block():
    buf = io.StringIO()
    tr = Tracer(buf)
    with tr.span("decode_step", step=3) as ev:
        ev["tokens"] = 2
        ev["ops"] = np.int64(812)  # NumPy scalars are written as numbers
        ev["note"] = "spec"
    tr.close()
    (e,) = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert e["step"] == 3 and e["tokens"] == 2 and e["ops"] == 812 and e["note"] == "spec"
    assert e["sync"] is False  # the default


def test_tracer_owns_ts_wall_phase_dur():
    buf = io.StringIO()
    tr = Tracer(buf, memory=False)
    with tr.span("sample") as ev:
        ev["dur"] = 123.0
        ev["ts"] = -5
    tr.event("readback", dur=0.5, wall=0)
    evs = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert evs[0]["dur"] < 1 and evs[0]["ts"] >= 0
    assert evs[1]["wall"] > 1e9 and evs[1]["dur"] == 0.5


def test_memory_figures():
    buf = io.StringIO()
    with Tracer(buf) as tr:
        with tr.span("prefill"):
            pass
    with Tracer(buf, memory=False) as tr:
        tr.event("decode_step", dur=0.0)
    with_mem, without = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert isinstance(with_mem["active_mem"], int) and isinstance(with_mem["peak_mem"], int)
    assert with_mem["peak_mem"] >= 0
    assert "active_mem" not in without and "peak_mem" not in without


def test_exception_in_span_is_recorded_and_propagates():
    buf = io.StringIO()
    tr = Tracer(buf, memory=False)
    with pytest.raises(KeyError):
        with tr.span("prefill"):
            raise KeyError("boom")
    (e,) = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert e["error"] == "KeyError"


def test_close_semantics(tmp_path):
    buf = io.StringIO()
    tr = Tracer(buf)
    tr.close()
    tr.close()  # idempotent
    assert tr.closed and not buf.closed  # a file object passed in stays open
    with pytest.raises(ProfilingError):
        tr.event("decode_step", dur=0.1)

    path = tmp_path / "t.jsonl"
    tr = Tracer(str(path))
    tr.event("load", dur=0.1)
    tr.close()
    assert tr._fh.closed and len(lines_of(path)) == 1


def test_lines_reach_disk_before_close(tmp_path):
    path = tmp_path / "t.jsonl"
    tr = Tracer(path)
    tr.event("load", dur=0.1)
    assert len(lines_of(path)) == 1  # line buffered: a crash keeps full events
    tr.close()


def test_bad_destination(tmp_path):
    with pytest.raises(ProfilingError, match="cannot open trace file"):
        Tracer(tmp_path / "no" / "such" / "dir.jsonl")
    with pytest.raises(TypeError):
        Tracer(42)


def test_make_tracer(tmp_path):
    assert isinstance(make_tracer(None), NullTracer)
    assert isinstance(make_tracer(""), NullTracer)
    assert make_tracer(None) is make_tracer(None)
    tr = make_tracer(tmp_path / "t.jsonl", memory=False)
    assert isinstance(tr, Tracer) and tr.enabled
    tr.close()


def test_null_tracer_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tr = make_tracer(None)
    assert not tr.enabled
    with tr:
        tr.meta(model="x")
        with tr.span("decode_step", step=0, sync=False) as ev:
            ev["tokens"] = 1
        tr.event("readback", dur=0.1, sync=True)
        tr.flush()
    tr.close()
    assert list(tmp_path.iterdir()) == []
    assert tr.span("a") is tr.span("b")  # one shared no-op context manager


def test_null_span_lets_exceptions_through():
    with pytest.raises(RuntimeError):
        with make_tracer(None).span("prefill"):
            raise RuntimeError


def test_null_tracer_does_not_import_mlx():
    code = (
        "import sys, profiling\n"
        "t = profiling.make_tracer(None)\n"
        "with t.span('decode_step', step=0, sync=False): pass\n"
        "t.event('x', dur=1.0); t.meta(a=1); t.close()\n"
        "assert 'mlx' not in sys.modules, 'mlx imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_null_span_is_cheap():
    tr = make_tracer(None)
    n = 20000

    def loop():
        for i in range(n):
            with tr.span("decode_step", step=i, sync=False):
                pass

    per_span = min(timeit.repeat(loop, number=1, repeat=5)) / n
    # About 0.3-0.4 us on a slow CI core; the bound leaves room for noise.
    assert per_span < 5e-6, f"null span costs {per_span * 1e6:.2f} us"
