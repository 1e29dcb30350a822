"""benchmarks/trace_token.py: a token's launches and idle gaps from a trace."""

import csv

import pytest

from benchmarks.trace_token import breakdown, read_trace, tokens


def _trace(path, steps, extra_every=0):
    t = 1000
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Start (ns)", "Duration (ns)", "Name"])
        w.writerow([t, 50000, "prefill_gemm"])  # before the first anchor: not a token's
        t += 60000
        for i in range(steps):
            launches = [("custom_kernel_mg_decode_megakernel_ab(int)", 600000, 1000), ("gemv_single<bf16, 8, 4>", 72000, 500),
                        ("custom_kernel_mg_sample_cd", 8000 + 1000 * (i % 2), 300)]
            if extra_every and i % extra_every == 0:
                launches.append(("copy_v<int>", 2000, 100))  # an odd token: not the common sequence
            for name, dur, gap in launches:
                t += gap
                w.writerow([t, dur, name])
                t += dur


def test_the_common_token_sequence_with_its_means_and_gaps(tmp_path):
    path = tmp_path / "trace.csv"
    _trace(path, 40, extra_every=10)
    rows = read_trace(path)
    toks = tokens(rows, "megakernel")
    assert len(toks) == 39  # the last anchor's launches run to the end of the trace: left out
    table, tail, span, n, seen = breakdown(toks, last=200)
    # 38 tokens have a next anchor to end their span; 0, 10, 20 and 30 carry a copy: 34 have the common sequence
    assert (n, seen) == (34, 38)
    names = [name for name, *_ in table]
    assert names == ["custom_kernel_mg_decode_megakernel_ab", "gemv_single<bf16, 8, 4>", "custom_kernel_mg_sample_cd"]
    # the sampler: 8 us on even tokens, 9 on odd; of the 34, 15 even and 19 odd
    assert [round(m, 3) for _, m, _, _ in table] == [600.0, 72.0, pytest.approx((15 * 8 + 19 * 9) / 34, abs=1e-3)]
    assert [round(g, 3) for *_, g in table] == [0.0, 0.5, 0.3]
    assert tail == pytest.approx(1.0)
    assert span == pytest.approx(600 + 72 + (15 * 8 + 19 * 9) / 34 + 0.5 + 0.3 + 1.0, abs=1e-3)


def test_last_keeps_only_the_latest_tokens(tmp_path):
    path = tmp_path / "trace.csv"
    _trace(path, 30)
    _, _, _, n, _ = breakdown(tokens(read_trace(path), "megakernel"), last=5)
    assert n == 5
