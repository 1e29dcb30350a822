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


def test_compare_runs_mlx_lm_in_its_own_process(capsys, tmp_path):
    # mlx-lm holds its own weights in a child process, and samples with the settings we sample with; the
    # report carries both engines, the ratios and the settings
    import json

    import pytest

    pytest.importorskip("mlx_lm")
    from metalgen.cli import main

    out = tmp_path / "rep.json"
    assert main(["bench", "--model", "dummy:tiny-qwen3", "--prompt-tokens", "8", "--gen-tokens", "4", "--runs", "1",
                 "--compare", "mlx-lm", "--json", str(out), "--temp", "0.7", "--top-p", "0.9",
                 "--repetition-penalty", "1.1"]) == 0
    rep = json.loads(out.read_text())
    assert rep["sampling"]["top_p"] == 0.9 and rep["sampling"]["repetition_penalty"] == 1.1
    assert [r["engine"] for r in rep["results"]] == ["metalgen", "mlx-lm"]
    assert rep["results"][1]["decode_tps"] > 0 and rep["decode_ratio"] > 0
    assert "metalgen / mlx-lm: decode" in capsys.readouterr().out


def test_active_weights_count_top_k_experts():
    from metalgen.bench import active_weight_bytes, weight_bytes

    model = load("dummy:tiny-qwen3-moe")[0]
    moe = model.spec.moe
    experts = sum(v.nbytes for i in moe.sparse_layers
                  for _, v in __import__("mlx.utils").utils.tree_flatten(model.model.layers[i].mlp.switch_mlp.parameters()))
    assert active_weight_bytes(model) == weight_bytes(model) - experts + experts * moe.top_k // moe.num_experts
    dense = load("dummy:tiny-qwen3")[0]
    assert active_weight_bytes(dense) == weight_bytes(dense)


def test_mlx_lm_reads_the_dummy_configs_as_published():
    from metalgen.bench_mlx_lm import _as_published, vocab_size
    from metalgen.dummy import dummy_config

    nxt = _as_published(dummy_config("tiny-qwen3-next"))
    rope = nxt["rope_parameters"]
    assert (nxt["rope_theta"], nxt["partial_rotary_factor"]) == (rope["rope_theta"], rope["partial_rotary_factor"])
    assert "rope_theta" not in _as_published(dummy_config("tiny-qwen3.5"))  # mlx-lm reads qwen3_5's nested

    class Wrapper:  # mlx-lm's Qwen3.5 ModelArgs: the text decoder's fields in text_config
        text_config = {"vocab_size": 123}

    class Flat:
        vocab_size = 45

    assert vocab_size(Wrapper()) == 123 and vocab_size(Flat()) == 45


def test_mlx_lm_gets_our_sampling_settings():
    import pytest

    pytest.importorskip("mlx_lm")
    import mlx.core as mx

    from metalgen.bench import SAMPLING_DEFAULTS
    from metalgen.bench_mlx_lm import mlx_lm_sampling

    assert mlx_lm_sampling({}) == (None, None)
    sampler, procs = mlx_lm_sampling(dict(SAMPLING_DEFAULTS, repetition_penalty=1.5, repetition_context_size=2))
    logits = mx.array([[2.0, 2.0, -1.0, 0.5]])
    out = procs[0](mx.array([0, 1, 2]), logits)  # the last 2 tokens (1, 2) penalised
    assert mx.allclose(out, mx.array([[2.0, 2.0 / 1.5, -1.5, 0.5]])).item()
    assert sampler(out).item() == 0  # greedy at temperature 0
    assert mlx_lm_sampling(SAMPLING_DEFAULTS)[1] == []
