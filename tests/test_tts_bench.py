"""metalgen bench --tts on the tiny TTS dummy (CPU): report fields, the mlx-lm twin, errors."""

import json

import numpy as np
import pytest

import metalgen.tts
from metalgen.cli import main
from metalgen.cli.bench import format_tts_table
from metalgen.errors import MetalgenError
from metalgen.tts.bench import MetalgenEngine, MlxLmTwin, run_tts_bench

FIELDS = {"engine", "frames", "talker_ms", "predictor_ms", "decoder_ms", "split_total_ms", "frame_ms", "rtf",
          "ttfa_ms", "peak_memory_gb"}


@pytest.fixture(scope="module")
def tts():
    return metalgen.tts.load("dummy:qwen3-tts-tiny")


def test_report_fields_and_ratio(tts):
    rep = run_tts_bench(tts, frames=6, runs=1, compare="mlx-lm", chunk_frames=4)
    assert [r["engine"] for r in rep["results"]] == ["metalgen", "mlx-lm"]
    for r in rep["results"]:
        assert set(r) == FIELDS
        assert r["frames"] == 6
        assert min(r["talker_ms"], r["predictor_ms"], r["decoder_ms"], r["frame_ms"], r["ttfa_ms"]) > 0
        assert r["split_total_ms"] == pytest.approx(r["talker_ms"] + r["predictor_ms"] + r["decoder_ms"])
        # a frame is 80 ms of audio: RTF = 80 / ms per frame
        assert r["rtf"] == pytest.approx(80.0 / r["frame_ms"], rel=1e-6)
    assert rep["frame_audio_ms"] == pytest.approx(80.0)
    for key in ("frame_ratio", "split_ratio", "ttfa_ratio"):
        assert rep[key] > 0
    table = format_tts_table(rep)
    assert "mlx-lm / metalgen" in table and "TTFA" in table


def test_no_ratio_without_compare(tts):
    rep = run_tts_bench(tts, frames=3, runs=1, chunk_frames=2)
    assert len(rep["results"]) == 1 and "frame_ratio" not in rep


def test_twin_makes_the_same_frames_greedy():
    # The mlx-lm-driven loop does the same work: greedy float32 codes are identical to ours.
    tts = metalgen.tts.load("dummy:qwen3-tts-tiny", dtype="float32")
    prompt, _ = tts.prepare("Hello there", speaker=tts.speakers[0], language="english")
    s = tts.sampling(max_frames=6, min_frames=6, temperature=0, sub_temperature=0)
    ours = np.stack(list(MetalgenEngine(tts, prompt, s).frames(0)))
    theirs = np.stack(list(MlxLmTwin(tts, prompt, s).frames(0)))
    assert ours.shape == (6, 16)
    np.testing.assert_array_equal(ours, theirs)


def test_bad_args(tts):
    with pytest.raises(MetalgenError):
        run_tts_bench(tts, frames=1, runs=1)
    with pytest.raises(MetalgenError):
        run_tts_bench(tts, frames=4, runs=0)
    with pytest.raises(MetalgenError):
        run_tts_bench(tts, frames=4, runs=1, compare="torch")


def test_cli(tmp_path, capsys):
    out = tmp_path / "tts.json"
    rc = main(["bench", "--tts", "--model", "dummy:qwen3-tts-tiny", "--frames", "3", "--runs", "1",
               "--chunk-frames", "2", "--json", str(out)])
    assert rc == 0
    assert "ms/frame" in capsys.readouterr().out
    rep = json.loads(out.read_text())
    assert rep["model"] == "dummy:qwen3-tts-tiny" and rep["results"][0]["frames"] == 3
    assert rep["first_chunk_frames"] == 2 and rep["paths"]["talker"] in ("plain", "megakernel")
    rc = main(["bench", "--tts", "--model", "dummy:qwen3-tts-tiny", "--frames", "3", "--runs", "1",
               "--decode", "reference", "--first-chunk-frames", "1", "--json", str(out)])
    assert rc == 0 and "talker reference, code predictor reference" in capsys.readouterr().out
    rep = json.loads(out.read_text())
    assert rep["paths"] == {"talker": "reference", "code_predictor": "reference"} and rep["first_chunk_frames"] == 1
    for bad in (["--frames", "1"], ["--runs", "0"], ["--chunk-frames", "0"], ["--first-chunk-frames", "0"],
                ["--profile"]):
        assert main(["bench", "--tts", "--model", "dummy:qwen3-tts-tiny", *bad]) == 1
    assert "error" in capsys.readouterr().err
    assert main(["bench", "--tts", "--model", "dummy:qwen3-tts-tiny", "--chunk-growth", "3"]) == 1
    assert "--chunk-growth apply to Magpie checkpoints" in capsys.readouterr().err
    # a text model is no TTS model
    assert main(["bench", "--tts", "--model", "dummy:qwen2.5-0.5b", "--frames", "2", "--runs", "1"]) == 1
