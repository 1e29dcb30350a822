"""metalgen bench on a tiny model (CPU): figures, decode path, profile counts."""

from metalgen.api import load
from metalgen.bench import run_bench
from metalgen.cli.bench import format_table


def test_bench_reference_path_with_profile():
    model = load("dummy:tiny-qwen3")[0]
    rep = run_bench(model, prompt_tokens=8, gen_tokens=4, runs=1, decode="reference", profile=True)
    assert rep["decode_path"] == "reference"
    assert rep["results"][0]["decode_tps"] > 0
    prof = rep["profile"]
    assert prof["plain"]["ops_per_token"] > 10 and prof["plain"]["syncs_per_token"] >= 1
    assert "reference" in prof
    assert "decode path reference" in format_table(rep)
