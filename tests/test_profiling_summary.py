"""profiling.summary and the `python -m profiling` CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiling import ProfilingError, Tracer, format_summary, summarize
from profiling.summary import percentile

REPO = Path(__file__).resolve().parents[1]


def write_trace(path, events, blank_lines=False):
    with open(path, "w") as fh:
        for ev in events:
            fh.write(json.dumps(ev) + "\n")
            if blank_lines:
                fh.write("\n   \n")
    return path


def hand_made():
    """load 1 s; prefill 50 ms (8 tokens, a sync); ten decode steps of
    1..10 ms (1 token, 100 ops each), each followed by a 1 ms sync readback."""
    evs = [
        {"phase": "meta", "ts": 0.0, "model": "qwen3-0.6b", "backend": "cpu"},
        {"phase": "load", "ts": 0.0, "dur": 1.0, "sync": True, "peak_mem": 1000},
        {"phase": "prefill", "ts": 1.0, "dur": 0.05, "tokens": 8, "sync": True,
         "ops": 300, "peak_mem": 5000, "active_mem": 4000},
    ]
    t = 1.05
    for i, ms in enumerate([3, 1, 4, 10, 5, 9, 2, 6, 8, 7]):  # shuffled 1..10
        evs.append({"phase": "decode_step", "ts": t, "dur": ms / 1000, "step": i,
                    "tokens": 1, "sync": False, "ops": 100, "peak_mem": 3000})
        t += ms / 1000
        evs.append({"phase": "readback", "ts": t, "dur": 0.001, "sync": True})
        t += 0.001
    return evs


@pytest.fixture
def trace(tmp_path):
    return write_trace(tmp_path / "t.jsonl", hand_made(), blank_lines=True)


def test_percentile_nearest_rank():
    ten = list(range(1, 11))
    assert percentile(ten, 50) == 5 and percentile(ten, 90) == 9
    assert percentile(ten, 100) == 10 and percentile(ten, 1) == 1
    assert percentile([4, 1, 3, 2], 50) == 2 and percentile([4, 1, 3, 2], 90) == 4
    assert percentile([7.5], 50) == 7.5 and percentile([7.5], 90) == 7.5
    assert percentile([], 50) is None


def test_phase_table(trace):
    s = summarize(trace)
    assert list(s["phases"]) == ["load", "prefill", "decode_step", "readback"]
    dec = s["phases"]["decode_step"]
    assert dec["count"] == 10
    assert dec["total_ms"] == pytest.approx(55.0)
    assert dec["p50_ms"] == pytest.approx(5.0, rel=1e-12)
    assert dec["p90_ms"] == pytest.approx(9.0, rel=1e-12)
    assert dec["tokens"] == 10 and dec["tokens_per_s"] == pytest.approx(10 / 0.055)
    assert dec["syncs"] == 0 and dec["ops"] == 1000
    pre = s["phases"]["prefill"]
    assert pre["count"] == 1 and pre["p50_ms"] == pytest.approx(50.0)
    assert pre["tokens_per_s"] == pytest.approx(160.0)
    rb = s["phases"]["readback"]
    assert rb["tokens"] is None and rb["tokens_per_s"] is None and rb["ops"] is None
    assert s["meta"] == {"model": "qwen3-0.6b", "backend": "cpu"}
    assert s["events"] == 22


def test_derived_figures(trace):
    s = summarize(trace)
    assert s["generated_tokens"] == 10  # one per readback
    # 9 tokens after the first, from the first readback's end (1.054 s) to the last's (1.115 s)
    assert s["decode_tokens_per_s"] == pytest.approx(9 / 0.061)
    assert s["ttft_ms"] == pytest.approx(50.0)  # the load is not counted
    assert s["syncs"] == 11  # prefill + 10 readbacks; the load's sync is not per token
    assert s["syncs_per_token"] == pytest.approx(1.1)
    assert s["ops"] == 1300 and s["ops_per_token"] == pytest.approx(130.0)
    assert s["peak_mem_bytes"] == 5000


def test_decode_tokens_summed_when_steps_emit_several(tmp_path):
    evs = [{"phase": "decode_step", "ts": 0.1 * i, "dur": 0.1, "tokens": 3, "sync": True}
           for i in range(4)]
    s = summarize(write_trace(tmp_path / "t.jsonl", evs))
    assert s["generated_tokens"] == 12
    assert s["syncs_per_token"] == pytest.approx(4 / 12)
    assert s["decode_tokens_per_s"] == pytest.approx(30.0)
    assert s["ttft_ms"] == pytest.approx(100.0)
    assert s["ops"] is None and s["ops_per_token"] is None


def test_decode_steps_without_tokens_count_one_each(tmp_path):
    evs = [{"phase": "decode_step", "dur": 0.01, "sync": True} for _ in range(5)]
    s = summarize(write_trace(tmp_path / "t.jsonl", evs))
    assert s["generated_tokens"] == 5 and s["syncs_per_token"] == 1.0
    assert s["phases"]["decode_step"]["tokens"] is None
    assert s["ttft_ms"] is None  # no ts: not derivable


def test_no_decode_and_empty_trace(tmp_path):
    s = summarize(write_trace(tmp_path / "a.jsonl", [{"phase": "load", "dur": 0.2}]))
    assert s["generated_tokens"] == 0
    assert s["decode_tokens_per_s"] is None and s["syncs_per_token"] is None
    assert s["peak_mem_bytes"] is None
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    s = summarize(empty)
    assert s["events"] == 0 and s["phases"] == {}
    assert "no events" in format_summary(s)


def test_format_summary(trace):
    text = format_summary(summarize(trace))
    for needle in ("decode_step", "prefill", "p50 ms", "5.00", "9.00",
                   "time to first token: 50.0 ms", "syncs per token: 1.10",
                   "ops per token: 130.0", "peak memory: 4.88 KiB", "model=qwen3-0.6b"):
        assert needle in text, needle


def test_round_trip_from_tracer(tmp_path):
    path = tmp_path / "t.jsonl"
    with Tracer(path) as tr:
        tr.meta(model="m")
        with tr.span("prefill", tokens=4, sync=True):
            pass
        for i in range(3):
            with tr.span("decode_step", step=i) as ev:
                ev["tokens"] = 1
            tr.event("readback", dur=0.0, sync=True)
    s = summarize(path)
    assert s["generated_tokens"] == 3 and s["syncs_per_token"] == pytest.approx(4 / 3)
    assert s["ttft_ms"] is not None and s["ttft_ms"] >= 0
    assert s["peak_mem_bytes"] is not None
    json.dumps(s)  # serializable


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"phase": "load", "dur": 1}\n{"phase": "prefill", "dur": \n', r":2: malformed JSON"),
        ("[1, 2]\n", r":1: expected a JSON object"),
        ('{"dur": 1}\n', r":1: event has no 'phase'"),
        ('{"phase": "prefill"}\n', r":1: 'prefill' event has no 'dur'"),
        ('{"phase": "prefill", "dur": "fast"}\n', r":1: 'dur' must be a number"),
        ('{"phase": "prefill", "dur": 1, "tokens": true}\n', r":1: 'tokens' must be a number"),
    ],
)
def test_bad_lines(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ProfilingError, match=match) as info:
        summarize(path)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(ProfilingError, match="no such file"):
        summarize(tmp_path / "nope.jsonl")


def cli(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "profiling", *map(str, args)],
                          cwd=REPO, env=env, capture_output=True, text=True)


def test_cli_table_and_json(trace):
    r = cli("summarize", trace)
    assert r.returncode == 0, r.stderr
    assert "decode_step" in r.stdout and "syncs per token: 1.10" in r.stdout
    r = cli("summarize", trace, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["generated_tokens"] == 10
    assert data["phases"]["decode_step"]["p90_ms"] == pytest.approx(9.0)


def test_cli_help():
    r = cli("--help")
    assert r.returncode == 0 and "summarize" in r.stdout
    r = cli("summarize", "--help")
    assert r.returncode == 0 and "--json" in r.stdout


@pytest.mark.parametrize("kind", ["missing", "malformed"])
def test_cli_bad_input(tmp_path, kind):
    path = tmp_path / "t.jsonl"
    if kind == "malformed":
        path.write_text('{"phase": "load", "dur": 1}\nnot json\n')
    r = cli("summarize", path)
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert str(path) in lines[0]
