"""`metalgen tts` and `metalgen bench --tts` on Magpie (dummy:magpie-tiny; the .nemo cases use the
reference dump of tests/magpie_ref and skip without it): WAVs whole and streamed, listings, and
every bad input as one line on stderr, exit 1 and no WAV left behind."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf

from metalgen.cli import main

TINY = ["tts", "--model", "dummy:magpie-tiny"]


def _err(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("note:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_writes_wav_whole_and_streamed(tmp_path, capsys):
    whole, streamed = tmp_path / "whole.wav", tmp_path / "streamed.wav"
    common = [*TINY, "--text", "Hello there.", "--language", "en", "--speaker", "Leo", "--seed", "2",
              "--max-frames", "12"]
    assert main([*common, "--out", str(whole)]) == 0
    assert main([*common, "--out", str(streamed), "--stream", "--chunk-frames", "4", "--first-chunk-frames", "2"]) == 0
    assert "first audio after" in capsys.readouterr().err
    a, sr = sf.read(str(whole), dtype="float32")
    b, _ = sf.read(str(streamed), dtype="float32")
    assert sr == 344 and a.shape == (12 * 16,)
    np.testing.assert_allclose(a, b, atol=1e-4)  # 16-bit PCM of the same waveform
    # no CFG, greedy, another scale: still 12 frames
    assert main([*common, "--out", str(whole), "--no-cfg", "--temp", "0", "--top-k", "5"]) == 0
    assert main([*common, "--out", str(whole), "--cfg-scale", "1.5"]) == 0
    assert sf.read(str(whole))[0].shape == (12 * 16,)


def test_lists(capsys):
    assert main([*TINY, "--list-speakers"]) == 0
    assert capsys.readouterr().out.split() == ["Aria", "Jason", "John", "Leo", "Sofia"]
    assert main([*TINY, "--list-languages"]) == 0
    assert capsys.readouterr().out.split() == ["de", "en", "es", "fr", "hi", "it", "ja", "vi"]


@pytest.mark.parametrize("extra, message", [
    (["--language", "zh"], "no tokenizer for language 'zh' (it has: de, en, es, fr, hi, it, ja, vi)"),
    (["--text", "Call 911 now"], "cannot map 2 characters: '9' (U+0039), '1' (U+0031)"),
    (["--speaker", "Bob"], "Magpie speaker 'Bob' is unknown (speakers: Aria, Jason, John, Leo, Sofia)"),
    (["--speaker", "7"], "speaker index 7 is out of range: this checkpoint has 5 speakers (0..4)"),
    (["--text", " \n "], "the text is empty"),
    (["--instruct", "calm"], "--instruct applies to Qwen3-TTS checkpoints, not Magpie"),
    (["--ref-audio", "x.wav"], "voice cloning needs a Magpie checkpoint with a context encoder"),
    (["--ref-audio", "x.wav", "--speaker", "Aria"], "give either --speaker or --ref-audio, not both"),
    (["--chunk-frames", "0"], "--chunk-frames and --first-chunk-frames must be >= 1"),
    (["--max-frames", "0"], "Magpie max_frames must be at least 1"),
    (["--max-frames", "1"], "Magpie max_frames must be at least 2: each decoder step makes 2 frames"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input(tmp_path, capsys, extra, message, stream):
    out = tmp_path / "x.wav"
    args = [*TINY, "--text", "Hello.", "--out", str(out), "--max-frames", "4", *extra]
    args += ["--stream"] if stream else []
    assert main(args) == 1
    err = _err(capsys)
    assert err.startswith("metalgen: error: ") and message in err
    assert not out.exists()


def test_qwen_flags_refused_and_magpie_flags_on_qwen(tmp_path, capsys):
    assert main(["tts", "--model", "dummy:qwen3-tts-tiny", "--text", "Hi", "--speaker", "vivian", "--no-cfg",
                 "--out", str(tmp_path / "q.wav")]) == 1
    assert _err(capsys) == "metalgen: error: --no-cfg applies to Magpie checkpoints, not Qwen3-TTS"


def test_stream_failure_leaves_no_partial_wav(tmp_path, capsys, monkeypatch):
    import metalgen.magpie.api as api
    from metalgen.errors import MetalgenError

    real = api.stream_chunks

    def failing(*a, **kw):
        # fails after the first piece, which the stream has written: the random model's clip may end
        # (EOS) after fewer pieces than a later failure would need (it did, now and then, in CI)
        for piece in real(*a, **kw):
            yield piece
            raise MetalgenError("the device went away")

    monkeypatch.setattr(api, "stream_chunks", failing)
    out = tmp_path / "partial.wav"
    assert main([*TINY, "--text", "Hello.", "--out", str(out), "--stream", "--first-chunk-frames", "2",
                 "--max-frames", "20"]) == 1
    assert _err(capsys) == "metalgen: error: the device went away"
    assert not out.exists()


def test_missing_and_corrupt_nemo(tmp_path, capsys):
    assert main(["tts", "--model", str(tmp_path / "none.nemo"), "--text", "Hi.", "--out", str(tmp_path / "a.wav")]) == 1
    assert _err(capsys) == f"metalgen: error: no Magpie .nemo file or folder at {tmp_path / 'none.nemo'}"
    bad = tmp_path / "bad.nemo"
    bad.write_bytes(b"not a tar archive at all" * 40)
    assert main(["tts", "--model", str(bad), "--text", "Hi.", "--out", str(tmp_path / "a.wav")]) == 1
    assert _err(capsys).startswith(f"metalgen: error: {bad} is not a .nemo file")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "codec.nemo").write_bytes(b"")
    (empty / "other_codec.nemo").write_bytes(b"")
    assert main(["tts", "--model", str(empty), "--text", "Hi.", "--out", str(tmp_path / "a.wav")]) == 1
    assert "holds 2 .nemo files" in _err(capsys)
    assert not (tmp_path / "a.wav").exists()


def test_hub_id_not_cached(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["tts", "--model", "nvidia/magpie_tts_multilingual_357m", "--text", "Hi.",
                 "--out", str(tmp_path / "a.wav")]) == 1
    assert _err(capsys) == ("metalgen: error: 'nvidia/magpie_tts_multilingual_357m' is not in the local Hugging "
                            "Face cache and HF_HUB_OFFLINE is set")


@pytest.fixture(scope="module")
def dump():
    from magpie_ref.harness import reference_folder

    return reference_folder()


def _hub_cache(root, files):
    """A Hugging Face cache holding nvidia/magpie_tts_multilingual_357m's snapshot of `files`."""
    repo = root / "models--nvidia--magpie_tts_multilingual_357m"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in files:
        shutil.copy(f, snap / f.name)
    return snap


def test_nemo_file_folder_hub_and_missing_codec(dump, tmp_path, capsys, monkeypatch):
    pair = tmp_path / "pair"
    pair.mkdir()
    shutil.copy(dump / "magpie.nemo", pair / "magpie.nemo")
    shutil.copy(dump / "codec.nemo", pair / "codec.nemo")
    out = tmp_path / "a.wav"
    common = ["--text", "Hello.", "--speaker", "1", "--max-frames", "4", "--temp", "0"]
    # a folder (the model is the .nemo not named codec), the file itself: the codec found beside it
    for model in (pair, pair / "magpie.nemo"):
        assert main(["tts", "--model", str(model), *common, "--out", str(out)]) == 0
        wav, sr = sf.read(str(out), dtype="float32")
        assert sr == 22050 and wav.shape == (4 * 16,)
    # the hub id from the local cache, offline
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _hub_cache(tmp_path / "hub", [pair / "magpie.nemo", pair / "codec.nemo"])
    hub_out = tmp_path / "hub.wav"
    assert main(["tts", "--model", "nvidia/magpie_tts_multilingual_357m", *common, "--out", str(hub_out)]) == 0
    np.testing.assert_array_equal(sf.read(str(hub_out), dtype="float32")[0], wav)
    capsys.readouterr()
    # no codec anywhere: the model alone (its stored codecmodel_path is the reference build's)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(dump / "magpie.nemo", alone / "magpie.nemo")
    bad = tmp_path / "b.wav"
    assert main(["tts", "--model", str(alone), "--text", "Hi.", "--out", str(bad)]) == 1
    assert _err(capsys).startswith("metalgen: error: no NanoCodec for magpie.nemo")
    assert main(["tts", "--model", str(alone), "--codec", str(tmp_path / "absent.nemo"), "--text", "Hi.",
                 "--out", str(bad)]) == 1
    assert _err(capsys) == f"metalgen: error: no codec .nemo file at {tmp_path / 'absent.nemo'}"
    assert not bad.exists()


def test_bench_cli(tmp_path, capsys):
    out = tmp_path / "magpie.json"
    assert main(["bench", "--tts", "--model", "dummy:magpie-tiny", "--frames", "5", "--runs", "1",
                 "--chunk-frames", "4", "--chunk-growth", "3", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "dec/step" in table and "TTFA" in table and "CFG on" in table and "growing x3" in table
    rep = json.loads(out.read_text())
    assert rep["kind"] == "magpie" and rep["frames"] == 6  # rounded up to whole decoder steps (stacking 2)
    assert rep["cfg"] is True and rep["first_chunk_frames"] == 4 and rep["chunk_frames"] == 4
    assert rep["chunk_growth"] == 3
    (r,) = rep["results"]
    for key in ("text_encoder_ms", "decoder_step_ms", "local_transformer_step_ms", "codec_frame_ms", "frame_ms",
                "ttfa_ms", "rtf"):
        assert r[key] > 0, key
    assert r["split_frame_ms"] == pytest.approx(r["decoder_frame_ms"] + r["local_transformer_frame_ms"]
                                                + r["codec_frame_ms"])
    assert r["decoder_frame_ms"] == pytest.approx(r["decoder_step_ms"] / 2)
    assert r["rtf"] == pytest.approx(rep["frame_audio_ms"] / r["frame_ms"], rel=1e-6)
    assert main(["bench", "--tts", "--model", "dummy:magpie-tiny", "--frames", "2", "--runs", "1", "--no-cfg"]) == 0
    assert "CFG off" in capsys.readouterr().out
    for bad in (["--compare", "mlx-lm"], ["--decode", "plain"], ["--frames", "1"], ["--chunk-growth", "0"]):
        assert main(["bench", "--tts", "--model", "dummy:magpie-tiny", "--runs", "1", *bad]) == 1
        assert _err(capsys).startswith("metalgen: error: ")
