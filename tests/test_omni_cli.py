"""`metalgen omni` in-process on `dummy:qwen3-omni-tiny`: text to stdout, speech to a 24 kHz WAV (whole or
streamed), text only, speakers, spoken questions at any rate and channel count, and every user error
as one `metalgen: error:` line with exit status 1.

Each dummy model is made once per (shape, dtype, parts) for the whole file (`cached_load`): its
seeded random weights take seconds to make on a CPU, the command itself a fraction of one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import metalgen.omni as omni
from metalgen.cli import main
from metalgen.omni.dummy import dummy_config

MODEL = "dummy:qwen3-omni-tiny"
SR = 24000
SAMPLES_PER_FRAME = 1920
START_TRIM = 555
QUICK = ["--max-tokens", "4", "--max-frames", "3", "--seed", "1"]


@pytest.fixture(scope="module")
def loaded():
    return {}


@pytest.fixture(autouse=True)
def cached_load(loaded, monkeypatch):
    real = omni.load

    def load(path_or_id, *, dtype=None, parts=("thinker", "audio", "talker", "code2wav"), revision=None):
        if not path_or_id.startswith("dummy:"):
            return real(path_or_id, dtype=dtype, parts=parts, revision=revision)
        key = (path_or_id, dtype, tuple(sorted(parts)))
        if key not in loaded:
            loaded[key] = real(path_or_id, dtype=dtype, parts=parts, revision=revision)
        return loaded[key]

    monkeypatch.setattr(omni, "load", load)


def run(capsys, *args):
    """(exit status, stdout, stderr) of `metalgen omni ARGS`."""
    rc = main(["omni", "--model", MODEL, *args])
    out, err = capsys.readouterr()
    return rc, out, err


def prompt_tokens(err: str) -> int:
    return int(re.search(r"(\d+) prompt tokens", err).group(1))


def speech_lengths(frames: int):
    """The waveform lengths a reply of at most `frames` frames can have (none if the talker stops at once)."""
    return {0} | {f * SAMPLES_PER_FRAME - START_TRIM for f in range(1, frames + 1)}


def sine(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wav = 0.3 * np.sin(2 * np.pi * 330 * t)
    if channels == 2:
        wav = np.stack([wav, 0.5 * np.sin(2 * np.pi * 550 * t)], axis=1)
    return wav.astype(np.float32)


# -- answers --------------------------------------------------------------------------------------


def test_text_to_stdout_and_speech_to_a_wav(capsys, tmp_path):
    out = tmp_path / "answer.wav"
    rc, stdout, err = run(capsys, "--prompt", "Say hello.", "--out", str(out), *QUICK)
    assert rc == 0, err
    wav, sr = sf.read(str(out), dtype="float32")
    assert sr == SR and wav.ndim == 1 and wav.shape[0] in speech_lengths(3)
    assert sf.info(str(out)).subtype == "PCM_16"
    assert "random weights" in err and f"wrote {out}" in err and "4 text tokens" in err
    # stdout is the reply's text, as the API writes it with the same (greedy) thinker
    parts = omni.load(MODEL, parts=("thinker", "audio", "talker", "code2wav"))
    reply = omni.generate(parts, [{"role": "user", "content": "Say hello."}], max_tokens=4, return_audio=False)
    assert stdout == reply.text + "\n" and reply.text


def test_streamed_wav_equals_the_whole_one(capsys, tmp_path):
    whole, streamed = tmp_path / "whole.wav", tmp_path / "streamed.wav"
    args = ["--prompt", "Say hello.", "--max-tokens", "6", "--max-frames", "7", "--seed", "2",
            "--talker-temp", "0"]  # a greedy talker: never stops before its codec EOS or 7 frames
    rc, text, err = run(capsys, *args, "--out", str(whole))
    assert rc == 0, err
    rc, text_streamed, err = run(capsys, *args, "--out", str(streamed), "--stream", "--first-chunk-frames", "2")
    assert rc == 0, err
    assert "first audio after" in err
    assert text_streamed == text
    a, sr_a = sf.read(str(whole), dtype="float32")
    b, sr_b = sf.read(str(streamed), dtype="float32")
    assert sr_a == sr_b == SR and a.shape == b.shape and a.shape[0] in speech_lengths(7)
    np.testing.assert_allclose(a, b, atol=2e-4)  # gapless chunks: the same samples, in 16-bit PCM


def test_no_audio_writes_nothing_and_needs_no_out(capsys, tmp_path):
    rc, stdout, err = run(capsys, "--prompt", "Say hello.", "--no-audio", "--max-tokens", "3")
    assert rc == 0, err
    assert stdout.strip() and "wrote" not in err and "3 text tokens" in err
    unused = tmp_path / "unused.wav"
    rc, _, err = run(capsys, "--prompt", "Say hello.", "--no-audio", "--max-tokens", "3", "--out", str(unused))
    assert rc == 0, err
    assert not unused.exists() and not list(tmp_path.iterdir())


def test_list_speakers_reads_the_config_alone(capsys, monkeypatch, tmp_path):
    def no_weights(*args, **kwargs):
        raise AssertionError("--list-speakers loaded a model")

    monkeypatch.setattr(omni, "load", no_weights)
    rc, stdout, err = run(capsys, "--list-speakers")
    assert rc == 0, err
    assert stdout.split() == ["aiden", "chelsie", "ethan"]
    # a checkpoint folder with its config.json and no weights at all
    config = json.loads(json.dumps(dummy_config("qwen3-omni-tiny")))
    config["talker_config"]["speaker_id"] = {"Vivian": 3000, "Ryan": 3001}
    folder = tmp_path / "omni"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    rc, stdout, err = run(capsys, "--model", str(folder), "--list-speakers")
    assert rc == 0, err
    assert stdout.split() == ["ryan", "vivian"]
    config["enable_audio_output"] = False  # a thinker-only checkpoint
    (folder / "config.json").write_text(json.dumps(config))
    assert_one_line_error(*run(capsys, "--model", str(folder), "--list-speakers")[::2], "has no talker")


def test_speaker_flag_is_case_insensitive(capsys, tmp_path):
    rc, _, err = run(capsys, "--prompt", "Hi.", "--speaker", "Chelsie", "--out", str(tmp_path / "c.wav"), *QUICK)
    assert rc == 0, err


def test_spoken_questions_at_any_rate(capsys, tmp_path):
    """1 s at 16 kHz is 100 mel frames, 13 audio tokens; 2 s of 44.1 kHz stereo is resampled and
    averaged to 2 s at 16 kHz mono, 26 tokens. Each clip adds its tokens and <|audio_start|>,
    <|audio_end|> to the prompt."""
    rc, _, err = run(capsys, "--prompt", "What is this?", "--no-audio", "--max-tokens", "2")
    assert rc == 0, err
    text_only = prompt_tokens(err)
    mono = tmp_path / "mono16k.wav"
    sf.write(str(mono), sine(1.0, 16000), 16000)
    rc, stdout, err = run(capsys, "--prompt", "What is this?", "--audio-in", str(mono), "--out",
                          str(tmp_path / "a.wav"), *QUICK)
    assert rc == 0, err
    assert prompt_tokens(err) == text_only + 13 + 2 and stdout.strip()
    stereo = tmp_path / "stereo44k.wav"
    sf.write(str(stereo), sine(2.0, 44100, channels=2), 44100)
    assert sf.info(str(stereo)).channels == 2
    rc, _, err = run(capsys, "--prompt", "What is this?", "--audio-in", str(stereo), "--no-audio",
                     "--max-tokens", "2")
    assert rc == 0, err
    assert prompt_tokens(err) == text_only + 26 + 2
    # audio alone is a question too, and clips add up
    rc, _, err = run(capsys, "--audio-in", str(mono), "--audio-in", str(stereo), "--no-audio", "--max-tokens", "2")
    assert rc == 0, err
    assert prompt_tokens(err) > 13 + 26 + 4


# -- errors ---------------------------------------------------------------------------------------


def assert_one_line_error(rc: int, err: str, fragment: str) -> None:
    assert rc == 1, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("metalgen: error: ") and fragment in lines[-1], err


@pytest.fixture
def files(tmp_path):
    """Paths the error cases refer to: an empty WAV, a Qwen3 (not Omni) checkpoint's config alone."""
    empty = tmp_path / "empty.wav"
    sf.write(str(empty), np.zeros((0,), np.float32), 16000)
    qwen3 = tmp_path / "qwen3"
    qwen3.mkdir()
    # no weights: the model type is checked before any are needed
    (qwen3 / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64}))
    return dict(out=str(tmp_path / "out.wav"), empty=str(empty), qwen3=str(qwen3), tmp=str(tmp_path))


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--out", "{out}"], "give a question: --prompt TEXT, --audio-in WAV, or both"),
        (["--prompt", "  ", "--out", "{out}"], "give a question"),
        (["--prompt", "Hi", "--image", "cat.png", "--out", "{out}"], "image input is not supported yet"),
        (["--prompt", "Hi"], "give --out FILE.wav for the spoken answer, or --no-audio"),
        (["--prompt", "Hi", "--out", "{tmp}/missing/out.wav"], "the folder of --out does not exist"),
        (["--prompt", "Hi", "--speaker", "nobody", "--out", "{out}"],
         "unknown speaker 'nobody' (this checkpoint has: aiden, chelsie, ethan)"),
        (["--prompt", "Hi", "--speaker", "nobody", "--out", "{out}", "--stream"], "unknown speaker 'nobody'"),
        (["--prompt", "Hi", "--audio-in", "{tmp}/absent.wav", "--out", "{out}"], "absent.wav: no such file"),
        (["--prompt", "Hi", "--audio-in", "{empty}", "--no-audio"], "holds no audio"),
        (["--model", "{qwen3}", "--prompt", "Hi", "--no-audio"],
         "is not a Qwen3-Omni checkpoint (model_type 'qwen3', expected 'qwen3_omni_moe')"),
        (["--model", "dummy:qwen3-omni-huge", "--prompt", "Hi", "--no-audio"],
         "unknown Qwen3-Omni dummy shape 'qwen3-omni-huge'"),
        (["--prompt", "Hi", "--max-tokens", "0", "--no-audio"], "--max-tokens must be >= 1"),
        (["--prompt", "Hi", "--max-frames", "0", "--out", "{out}"], "max frames must be >= 1"),
        (["--prompt", "Hi", "--first-chunk-frames", "0", "--out", "{out}"], "--first-chunk-frames must be >= 1"),
    ],
)
def test_errors_are_one_line(capsys, files, args, fragment):
    rc, _, err = run(capsys, *[a.format(**files) for a in args])
    assert_one_line_error(rc, err, fragment)
    assert not Path(files["out"]).exists()  # a failed answer leaves no WAV behind
