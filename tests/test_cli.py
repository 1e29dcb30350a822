"""`metalgen generate` as a user runs it: a subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "dummy:tiny-qwen3"


def metalgen(*args, input=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "metalgen", *args], input=input, capture_output=True,
        text=True, timeout=timeout, env=env, cwd=ROOT,
    )


def assert_one_line_error(proc, fragment):
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("metalgen: error:") and fragment in lines[-1], proc.stderr


def test_generate_streams_text_and_reports_stats():
    proc = metalgen("generate", "--model", MODEL, "--prompt", "Hello", "--max-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "Generation: 12 tokens" in proc.stderr or "Finish: stop" in proc.stderr
    assert "Prompt:" in proc.stderr and "Peak memory" in proc.stderr


def test_prompt_from_stdin_and_seeded_sampling_reproducible():
    args = ("generate", "--model", MODEL, "--prompt", "-", "--max-tokens", "10",
            "--temp", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "5")
    a, b = metalgen(*args, input="Tell me"), metalgen(*args, input="Tell me")
    assert a.returncode == 0 and a.stdout == b.stdout


def test_empty_prompt_is_an_error():
    assert_one_line_error(metalgen("generate", "--model", MODEL, "--prompt", "   "), "empty")


def test_missing_model_is_an_error(tmp_path):
    assert_one_line_error(
        metalgen("generate", "--model", str(tmp_path / "absent"), "--prompt", "x"), "no model folder"
    )


def test_bad_sampling_flag_is_an_error():
    assert_one_line_error(metalgen("generate", "--model", MODEL, "--top-p", "2"), "top-p")


def test_profile_trace_and_summary(tmp_path):
    trace = tmp_path / "trace.jsonl"
    proc = metalgen("generate", "--model", MODEL, "--prompt", "Hi", "--max-tokens", "8",
                    "--ignore-chat-template", "--profile", str(trace))
    assert proc.returncode == 0, proc.stderr
    phases = {json.loads(line)["phase"] for line in trace.read_text().splitlines()}
    assert {"meta", "load", "prefill", "decode_step", "sample", "readback"} <= phases
    summary = subprocess.run(
        [sys.executable, "-m", "profiling", "summarize", str(trace), "--json"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert summary.returncode == 0, summary.stderr
    data = json.loads(summary.stdout)
    assert data["syncs_per_token"] <= 1.2


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_stops_cleanly_with_output_kept():
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "metalgen", "generate", "--model", MODEL, "--prompt", "go",
         "--max-tokens", "2000", "--temp", "1", "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    first = proc.stdout.read(1)  # generation has started
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert first + out
    assert "Traceback" not in err and "Finish: interrupted" in err
