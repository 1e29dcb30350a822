"""metalgen.tts API and `metalgen tts` CLI on `dummy:qwen3-tts-tiny` (random weights, offline):
seeded sampling, streaming, the frame loop's stop rules, and every bad input's one-line error."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import soundfile as sf

import metalgen.tts
from metalgen import MetalgenError
from metalgen.tts.audio import read_reference


@pytest.fixture(scope="module")
def tiny():
    return metalgen.tts.load("dummy:qwen3-tts-tiny")


def codes(tts, seed, **kw):
    kw.setdefault("max_frames", 8)
    return tts.generate_codes("Hello there.", speaker="vivian", language="english", seed=seed, **kw)


def test_sampling_defaults_are_the_reference_ones(tiny):
    s = tiny.sampling()
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty) == (0.9, 50, 1.0, 1.05)
    assert (s.sub_temperature, s.sub_top_k, s.sub_top_p) == (0.9, 50, 1.0)
    assert tiny.sampling(top_k=10, temperature=0.5).top_k == 10


def test_seeded_and_reproducible(tiny):
    a, b, c = codes(tiny, 1), codes(tiny, 1), codes(tiny, 2)
    assert a.shape == (8, 16) and a.dtype == np.int32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a[:, 0].max() < 2048  # control ids are suppressed


def test_greedy_ignores_the_seed(tiny):
    a = codes(tiny, 1, temperature=0.0, sub_temperature=0.0)
    b = codes(tiny, 2, temperature=0.0, sub_temperature=0.0)
    np.testing.assert_array_equal(a, b)


def test_synthesize_returns_float32_audio(tiny):
    wav, sr = tiny.synthesize("Hello there.", speaker="vivian", seed=3, max_frames=6)
    assert sr == tiny.sample_rate and wav.dtype == np.float32
    assert wav.shape == (6 * tiny.speech.decoder.total_upsample,)
    assert np.all(np.abs(wav) <= 1.0) and float(np.abs(wav).max()) > 0


def test_stream_yields_chunks_while_generating(tiny):
    wav, _ = tiny.synthesize("Hello there.", speaker="vivian", seed=4, max_frames=10)
    chunks = list(tiny.stream("Hello there.", speaker="vivian", seed=4, max_frames=10, chunk_frames=3,
                              first_chunk_frames=None))
    up = tiny.speech.decoder.total_upsample
    assert [c.shape[0] for c in chunks] == [3 * up, 3 * up, 3 * up, 1 * up]
    # 10 frames fit in the left context, so the chunks join into the whole decode.
    np.testing.assert_allclose(np.concatenate(chunks), wav, atol=1e-5)


def test_stream_first_chunk_then_doubling(tiny):
    wav, _ = tiny.synthesize("Hello there.", speaker="vivian", seed=4, max_frames=20)
    up = tiny.speech.decoder.total_upsample
    chunks = list(tiny.stream("Hello there.", speaker="vivian", seed=4, max_frames=20, chunk_frames=6))
    # the default first chunk is 2 frames, then 4, then 6 (the cap) until the text runs out
    assert [c.shape[0] // up for c in chunks] == [2, 4, 6, 6, 2]
    np.testing.assert_allclose(np.concatenate(chunks), wav, atol=1e-5)
    chunks = list(tiny.stream("Hello there.", speaker="vivian", seed=4, max_frames=20, chunk_frames=12,
                              first_chunk_frames=3))
    assert [c.shape[0] // up for c in chunks] == [3, 6, 11]


def test_stops_on_codec_eos(tiny, monkeypatch):
    """The talker's codec EOS ends generation (never before min_frames = 2)."""
    talker = tiny.model.talker
    eos = tiny.args.talker.codec_eos_token_id
    boost = mx.where(mx.arange(tiny.args.talker.vocab_size) == eos, 1e4, 0.0)
    original = type(talker).logits
    monkeypatch.setattr(type(talker), "logits", lambda self, h: original(self, h) + boost)
    assert codes(tiny, 0, max_frames=50).shape == (2, 16)


def test_max_frames(tiny):
    assert codes(tiny, 0, max_frames=3).shape == (3, 16)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(text=""), "the text is empty"),
        (dict(text="   \n"), "the text is empty"),
        (dict(speaker="nobody"), "unknown speaker 'nobody' (valid: aiden, dylan"),
        (dict(language="klingon"), "unknown language 'klingon' (valid: auto, chinese, english"),
        (dict(speaker=None), "needs a speaker (one of: aiden"),
        (dict(ref_audio="x.wav"), "voice cloning (ref_audio/ref_text) needs a Base model"),
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(max_frames=0), "max frames must be >= 1"),
    ],
)
def test_bad_input_errors(tiny, kwargs, message):
    args = dict(text="Hello.", speaker="vivian", max_frames=2)
    args.update(kwargs)
    with pytest.raises(MetalgenError) as e:
        tiny.synthesize(**args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_speaker_and_language_are_case_insensitive(tiny):
    assert codes(tiny, 0, max_frames=1).shape == (1, 16)
    tiny.generate_codes("Hi.", speaker="Vivian", language="English", max_frames=1)


def test_wrong_model_type_for_options():
    small = metalgen.tts.load("dummy:qwen3-tts-tiny-0b6")
    with pytest.raises(MetalgenError, match="does not take an instruction"):
        small.synthesize("Hi.", speaker="vivian", instruct="Whisper.", max_frames=1)
    design = metalgen.tts.load("dummy:qwen3-tts-tiny-voicedesign")
    with pytest.raises(MetalgenError, match="needs an instruction describing the voice"):
        design.synthesize("Hi.", max_frames=1)
    with pytest.raises(MetalgenError, match="has no named speakers"):
        design.synthesize("Hi.", speaker="vivian", instruct="A calm voice.", max_frames=1)
    wav, _ = design.synthesize("Hi.", instruct="A calm voice.", max_frames=2, seed=0)
    assert wav.shape[0] > 0


def test_reference_clip_errors_and_resampling(tmp_path):
    with pytest.raises(MetalgenError, match="does not exist"):
        read_reference(tmp_path / "missing.wav", 24000)
    silent = tmp_path / "silent.wav"
    sf.write(str(silent), np.zeros(16000, np.float32), 16000)
    with pytest.raises(MetalgenError, match="is silent"):
        read_reference(silent, 24000)
    clip = tmp_path / "tone16k.wav"
    t = np.arange(16000) / 16000
    sf.write(str(clip), (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    wav = read_reference(clip, 24000)
    assert wav.dtype == np.float32 and abs(wav.shape[0] - 24000) <= 1
    # The 440 Hz tone survives resampling: its spectrum peaks at 440 Hz at the new rate.
    spectrum = np.abs(np.fft.rfft(wav))
    assert abs(np.argmax(spectrum) * 24000 / wav.shape[0] - 440) < 2
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio")
    with pytest.raises(MetalgenError, match="could not read"):
        read_reference(bad, 24000)


def test_unknown_dummy_and_missing_folder(tmp_path):
    with pytest.raises(MetalgenError, match="unknown dummy TTS shape"):
        metalgen.tts.load("dummy:nope")
    with pytest.raises(MetalgenError, match="no model folder"):
        metalgen.tts.load(str(tmp_path / "none"))
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    with pytest.raises(MetalgenError, match="not a Qwen3-TTS checkpoint"):
        metalgen.tts.load(str(tmp_path))


def test_cli_writes_wav(tmp_path, capsys):
    from metalgen.cli import main

    out = tmp_path / "out.wav"
    rc = main(["tts", "--model", "dummy:qwen3-tts-tiny", "--text", "Hello there.", "--speaker", "vivian",
               "--language", "english", "--seed", "5", "--max-frames", "6", "--out", str(out)])
    assert rc == 0
    wav, sr = sf.read(str(out), dtype="float32")
    assert sr == 3000 and wav.shape == (6 * 240,)
    streamed = tmp_path / "streamed.wav"
    rc = main(["tts", "--model", "dummy:qwen3-tts-tiny", "--text", "Hello there.", "--speaker", "vivian",
               "--language", "english", "--seed", "5", "--max-frames", "6", "--out", str(streamed),
               "--stream", "--chunk-frames", "4"])
    assert rc == 0
    np.testing.assert_allclose(sf.read(str(streamed), dtype="float32")[0], wav, atol=1e-4)
    assert "first audio after" in capsys.readouterr().err
    # the stacked reference decode path and a 1-frame first chunk: in float32 the same codes as the
    # plain path, so the same audio
    common = ["tts", "--model", "dummy:qwen3-tts-tiny", "--text", "Hello there.", "--speaker", "vivian",
              "--language", "english", "--seed", "5", "--max-frames", "6", "--dtype", "float32"]
    plain, ref = tmp_path / "plain32.wav", tmp_path / "ref.wav"
    assert main([*common, "--out", str(plain), "--decode", "plain"]) == 0
    assert main([*common, "--out", str(ref), "--stream", "--first-chunk-frames", "1", "--decode", "reference"]) == 0
    np.testing.assert_allclose(sf.read(str(ref), dtype="float32")[0], sf.read(str(plain), dtype="float32")[0],
                               atol=1e-4)
    assert main(["tts", "--model", "dummy:qwen3-tts-tiny", "--text", "Hi", "--speaker", "vivian", "--out",
                 str(ref), "--first-chunk-frames", "0"]) == 1
    assert "--first-chunk-frames" in capsys.readouterr().err


def test_text_input_mode_reaches_the_prompt(tmp_path):
    """--text-input whole|streamed picks the prompt layout; whole is the CustomVoice default."""
    from metalgen.cli import main

    def run(*extra):
        out = tmp_path / f"{len(extra)}{'-'.join(extra)}.wav"
        rc = main(["tts", "--model", "dummy:qwen3-tts-tiny", "--text", "Hello there, friend.",
                   "--speaker", "vivian", "--language", "english", "--temp", "0", "--sub-temp", "0",
                   "--seed", "1", "--max-frames", "6",
                   "--out", str(out), *extra])
        assert rc == 0
        return sf.read(str(out), dtype="float32")[0]

    default, whole, streamed = run(), run("--text-input", "whole"), run("--text-input", "streamed")
    np.testing.assert_array_equal(default, whole)
    assert not np.array_equal(whole, streamed)


def test_cli_errors_are_one_line(tmp_path, capsys):
    from metalgen.cli import main

    rc = main(["tts", "--model", "dummy:qwen3-tts-tiny", "--text", "Hi", "--speaker", "nobody",
               "--out", str(tmp_path / "x.wav")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("metalgen: error: unknown speaker 'nobody' (valid: ")


@pytest.fixture(scope="module")
def tiny_base():
    return metalgen.tts.load("dummy:qwen3-tts-tiny-base")


def _tone(seconds=2.0, sr=3000):
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)


def test_base_clone_from_file_at_another_rate(tiny_base, tmp_path):
    path = tmp_path / "ref.wav"
    sf.write(str(path), _tone(2.0, 8000), 8000)  # resampled to the model's rate
    wav, sr = tiny_base.synthesize("Hello.", ref_audio=str(path), ref_text="A reference.", seed=0, max_frames=3)
    assert sr == tiny_base.sample_rate and wav.shape == (3 * tiny_base.speech.decoder.total_upsample,)
    xvec, _ = tiny_base.synthesize("Hello.", ref_audio=str(path), seed=0, max_frames=3)
    assert xvec.shape == wav.shape


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(ref_audio=None), "clones a voice: give a reference clip"),
        (dict(speaker="vivian"), "has no named speakers"),
        (dict(instruct="Whisper."), "does not take an instruction"),
        (dict(ref_audio="/nonexistent/ref.wav"), "does not exist"),
        (dict(ref_audio=(np.zeros(3000, np.float32), 3000)), "is silent"),
        (dict(ref_audio=(np.zeros(0, np.float32), 3000)), "holds no audio"),
    ],
)
def test_base_bad_input(tiny_base, kwargs, message):
    args = dict(text="Hello.", ref_audio=(_tone(), 3000), max_frames=1)
    args.update(kwargs)
    with pytest.raises(MetalgenError) as e:
        tiny_base.synthesize(**args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_clone(tiny_base, tmp_path):
    from metalgen.cli import main

    ref = tmp_path / "ref.wav"
    sf.write(str(ref), _tone(1.5, 3000), 3000)
    out = tmp_path / "clone.wav"
    rc = main(["tts", "--model", "dummy:qwen3-tts-tiny-base", "--text", "Hi.", "--ref-audio", str(ref),
               "--ref-text", "A reference.", "--seed", "1", "--max-frames", "2", "--out", str(out)])
    assert rc == 0 and sf.read(str(out))[0].shape == (2 * 240,)
