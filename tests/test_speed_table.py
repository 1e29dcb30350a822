"""benchmarks/speed_table.py: the README's speed table from bench JSON files, each row's latest run."""

import json

import pytest

from benchmarks.speed_table import END, START, main, table


def _report(model, ours, theirs, prompt=128, temperature=0.0, path="megakernel"):
    result = dict(prompt_tokens=prompt, gen_tokens=256, ttft_ms=1.0, prefill_tps=1.0, peak_memory_gb=1.0)
    return dict(model=f"dummy:{model}", weight_gb=1.0, decode_path=path, decode_ratio=ours / theirs,
                sampling=dict(temperature=temperature, top_p=0.9 if temperature else 1.0, repetition_penalty=1.0),
                results=[dict(result, engine="metalgen", decode_tps=ours),
                         dict(result, engine="mlx-lm", decode_tps=theirs)])


def _write(folder, name, report):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"bench_{name}.json").write_text(json.dumps(report))


def test_later_runs_replace_earlier_rows_and_are_named(tmp_path):
    old, new = tmp_path / "results" / "old_round", tmp_path / "results" / "new_round" / "bench"
    _write(old, "qwen3-0.6b", _report("qwen3-0.6b", 1000.0, 200.0))
    _write(old, "qwen3-8b", _report("qwen3-8b", 230.0, 120.0))
    _write(old, "qwen3-0.6b-sampled", _report("qwen3-0.6b", 950.0, 190.0, temperature=0.7))
    _write(new, "qwen3-0.6b", _report("qwen3-0.6b", 1300.0, 250.0))
    rows = table(old, new).splitlines()[2:]
    assert len(rows) == 3
    by_model = {(r.split(" | ")[0], r.split(" | ")[2]): r for r in rows}
    latest = by_model[("| `qwen3-0.6b`", "greedy")]
    assert "1300.0" in latest and "5.20x" in latest and latest.endswith("`new_round/bench` |")
    assert by_model[("| `qwen3-8b`", "greedy")].endswith("`old_round` |")
    # the sampled row is another measurement of the same model: kept from its own run
    assert "950.0" in by_model[("| `qwen3-0.6b`", "temp 0.7, top-p 0.9")]
    # one directory: no run column
    assert "run" not in table(new).splitlines()[0]


def test_one_model_on_two_paths_keeps_both_rows(tmp_path):
    # benchmarks/metal_round.sh benches each shape on the auto path and the fused one, into one folder
    run = tmp_path / "metal-round"
    _write(run, "qwen3-0.6b-auto", _report("qwen3-0.6b", 90.0, 100.0, path="plain"))
    _write(run, "qwen3-0.6b-fused", _report("qwen3-0.6b", 150.0, 100.0, path="fused"))
    rows = table(run).splitlines()[2:]
    assert len(rows) == 2 and {r.split(" | ")[3] for r in rows} == {"plain", "fused"}


def test_readme_section_is_replaced(tmp_path):
    run = tmp_path / "results" / "r"
    _write(run, "qwen2.5-0.5b", _report("qwen2.5-0.5b", 1500.0, 250.0))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\nold table\n{END}\nafter\n")
    assert main([str(run), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old table" not in text and "1500.0" in text and text.startswith("intro\n") and text.endswith("after\n")
    with pytest.raises(SystemExit):
        table(tmp_path / "empty")
