"""metalgen.omni's API on `dummy:qwen3-omni-tiny` (random weights, offline): what `stream` yields and
when, `generate`, seeded talker sampling, speakers, every bad input's one-line error, the published
30B-A3B shapes and parameter count, the 4-bit dummy, and the thinker as a text model for
`metalgen generate` (a checkpoint saved by transformers)."""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import soundfile as sf
from mlx.utils import tree_flatten

import metalgen.omni as omni
from metalgen.errors import MetalgenError
from metalgen.models.qwen3_omni.code2wav import Code2Wav
from metalgen.models.qwen3_omni.config import OmniArgs
from metalgen.models.qwen3_omni.model import Model
from metalgen.models.qwen3_omni.thinker import Thinker
from metalgen.omni.dummy import dummy_config

omni_generate = importlib.import_module("metalgen.omni.generate")  # `metalgen.omni.generate` is also a function
HELLO = [{"role": "user", "content": "Say hello."}]
SAMPLES_PER_FRAME = 1920
START_TRIM = 555  # Code2Wav's transposed convs cut these at the start (code2wav.py)
# a bound on the reply where an error is expected, so that a missing check fails fast instead of
# running the random talker on to its 4096-frame default
SHORT = dict(max_tokens=2, talker=omni.talker_sampling(max_frames=2))


@pytest.fixture(scope="module")
def tiny():
    return omni.load("dummy:qwen3-omni-tiny", dtype="float32")


@pytest.fixture(scope="module")
def thinker_only():
    """The tiny model without its audio encoder, talker and Code2Wav."""
    return omni.load("dummy:qwen3-omni-tiny", dtype="float32", parts=("thinker",))


def no_eos(parts):
    """A thinker logits processor that never lets the reply end."""
    eos = sorted(set(parts.tokenizer.eos_token_ids) | {parts.args.im_end_token_id})
    mask = mx.zeros((parts.args.thinker_text.vocab_size,), mx.float32)
    mask[mx.array(eos)] = -math.inf
    return lambda history, logits: logits + mask.astype(logits.dtype)


def frames_of(parts, seed, frames=4, **kw):
    """The talker's codes (frames, 16) of a short reply, `frames` frames exactly (codec EOS held off)."""
    out = []
    talker = omni.talker_sampling(max_frames=frames, min_frames=frames)
    for _ in omni.stream(parts, HELLO, max_tokens=6, talker=talker, seed=seed, frames_out=out, **kw):
        pass
    assert len(out) == frames
    return np.stack(out)


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(MetalgenError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message
    return message


# -- stream and generate ------------------------------------------------------------------------


@pytest.mark.parametrize("frames", [6, 11])
def test_stream_yields_text_and_gapless_audio_of_exactly_n_frames(tiny, frames):
    codes, pieces = [], []
    talker = omni.talker_sampling(max_frames=frames, min_frames=frames)
    for r in omni.stream(tiny, HELLO, max_tokens=8, talker=talker, seed=0, frames_out=codes):
        if r.audio is None:
            assert r.token is not None and isinstance(r.text, str)
        else:
            assert r.token is None and r.text == ""
            assert r.audio.dtype == np.float32 and r.audio.ndim == 1 and r.sample_rate == 24000
            pieces.append(r.audio)
    assert len(codes) == frames and all(c.shape == (16,) for c in codes)
    assert len(pieces) >= 2  # the first chunk (4 frames) comes before the rest
    wav = np.concatenate(pieces)
    assert wav.shape == (frames * SAMPLES_PER_FRAME - START_TRIM,)
    whole = np.array(tiny.model.code2wav(mx.array(np.stack(codes)[None]))[0])
    assert whole.shape == wav.shape
    # gapless: the streamed pieces join into the one-shot decode of the same codes
    assert np.corrcoef(wav, whole)[0, 1] > 0.9999
    np.testing.assert_allclose(wav, whole, atol=1e-4)


def test_first_audio_comes_before_the_thinker_is_done(tiny):
    """The talker starts after the thinker's first tokens, not after its whole reply."""
    events = []
    talker = omni.talker_sampling(max_frames=8, min_frames=8)
    for r in omni.stream(tiny, HELLO, max_tokens=40, logits_processors=[no_eos(tiny)], talker=talker, seed=0,
                         first_chunk=4):
        events.append("audio" if r.audio is not None else "text")
        if r.finish_reason is not None:
            assert r.finish_reason == "length" and r.generation_tokens == 40
    first_audio = events.index("audio")
    last_text = len(events) - 1 - events[::-1].index("text")
    assert events.count("text") == 40
    assert first_audio < last_text
    # the talker starts after two tokens and takes about one a frame: the first 4-frame chunk comes
    # about 8 tokens in, nowhere near the end of the reply
    assert events[:first_audio].count("text") <= 12


def test_generate_gathers_the_stream(tiny):
    kwargs = dict(max_tokens=6, talker=omni.talker_sampling(max_frames=5, min_frames=5), seed=3)
    streamed = list(omni.stream(tiny, HELLO, **kwargs))
    result = omni.generate(tiny, HELLO, **kwargs)
    assert result.text == "".join(r.text for r in streamed) and result.text
    assert result.tokens == [r.token for r in streamed if r.token is not None]
    assert result.finish_reason == "length" and result.frames == 5
    assert result.prompt_tokens == streamed[0].prompt_tokens > 0
    np.testing.assert_array_equal(result.audio, np.concatenate([r.audio for r in streamed if r.audio is not None]))
    assert result.sample_rate == 24000 and result.audio.shape == (5 * SAMPLES_PER_FRAME - START_TRIM,)


def test_text_only_never_runs_the_talker(tiny, monkeypatch):
    with_audio = omni.generate(tiny, HELLO, max_tokens=6, talker=omni.talker_sampling(max_frames=3))

    def boom(*args, **kwargs):
        raise AssertionError("the talker's work ran for a text-only reply")

    for name in ("TalkerText", "OmniFrames", "talker_prompt"):
        monkeypatch.setattr(omni_generate, name, boom)
    monkeypatch.setattr(Thinker, "hidden_and_tap", boom)
    monkeypatch.setattr(Code2Wav, "stream", boom)
    monkeypatch.setattr(Code2Wav, "__call__", boom)
    text_only = omni.generate(tiny, HELLO, max_tokens=6, return_audio=False)
    assert text_only.audio is None and text_only.frames == 0
    # the talker's pulls never change what the thinker writes
    assert text_only.tokens == with_audio.tokens and text_only.text == with_audio.text


def test_seeded_talker_sampling_is_reproducible(tiny):
    a, b, c = frames_of(tiny, 1), frames_of(tiny, 1), frames_of(tiny, 2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a[:, 0].max() < 2048 and a.min() >= 0  # codebook 0 never takes a control id


def test_a_given_reply_is_spoken_without_the_thinker_decoding(tiny, monkeypatch):
    og = sys.modules["metalgen.omni.generate"]  # (the package's `generate` is the function)

    def no_decode(*a, **k):
        raise AssertionError("the thinker decoded a given reply")

    monkeypatch.setattr(og, "generate_step", no_decode)
    said = "Good morning, dear listener."
    talker = omni.talker_sampling(max_frames=5, min_frames=5)

    def speak(text, seed=3):
        out = []
        pieces = list(omni.stream(tiny, [{"role": "user", "content": said}], say=text, talker=talker, seed=seed,
                                  frames_out=out))
        return pieces, np.stack(out)

    pieces, frames = speak(said)
    texts = [p for p in pieces if p.token is not None]
    assert "".join(p.text for p in texts) == said
    assert [p.token for p in texts] == tiny.tokenizer.encode(said) + [tiny.args.im_end_token_id]
    assert [p.finish_reason for p in texts][-1] == "stop" and all(p.finish_reason is None for p in texts[:-1])
    assert sum(p.audio.shape[0] for p in pieces if p.audio is not None) > 0
    # the talker reads the given text: the same text speaks the same frames, another text others
    np.testing.assert_array_equal(frames, speak(said)[1])
    assert not np.array_equal(frames, speak("Something else entirely, said slowly.")[1])


def test_a_given_reply_needs_audio_and_text(tiny):
    assert "for speech" in one_line_error(lambda: list(omni.stream(tiny, HELLO, say="Hi", return_audio=False)))
    assert "for speech" in one_line_error(lambda: list(omni.stream(tiny, HELLO, say="  ")))


# -- speakers -------------------------------------------------------------------------------------


def test_speakers_are_case_insensitive(tiny):
    assert omni.speaker_id(tiny, "Chelsie") == omni.speaker_id(tiny, "CHELSIE") == 2301
    assert omni.speaker_id(tiny, None) == 2302  # Ethan, the reference's default
    talker = omni.talker_sampling(max_frames=3, min_frames=3, temperature=0.0)
    codes = {}
    for name in ("aiden", "AIDEN", "Chelsie"):
        out = []
        for _ in omni.stream(tiny, HELLO, max_tokens=6, talker=talker, speaker=name, frames_out=out):
            pass
        codes[name] = np.stack(out)
    np.testing.assert_array_equal(codes["aiden"], codes["AIDEN"])
    assert not np.array_equal(codes["aiden"], codes["Chelsie"])  # the speaker is in the talker's prompt


def test_unknown_speaker_names_the_known_ones(tiny):
    message = one_line_error(omni.generate, tiny, HELLO, speaker="Nobody", **SHORT)
    assert message == "unknown speaker 'Nobody' (this checkpoint has: aiden, chelsie, ethan)"


# -- bad input ------------------------------------------------------------------------------------


def test_empty_conversation(tiny):
    assert "conversation is empty" in one_line_error(omni.generate, tiny, [], **SHORT)


def test_empty_audio_clip(tiny):
    message = one_line_error(omni.generate, tiny, HELLO, audio=[(np.zeros(0, np.float32), 16000)], **SHORT)
    assert "holds no audio" in message


def test_unreadable_wav(tiny, tmp_path):
    bad = tmp_path / "garbage.wav"
    bad.write_bytes(b"RIFF\x00\x01garbage, not a WAV file" * 10)
    message = one_line_error(omni.generate, tiny, HELLO, audio=[str(bad)], **SHORT)
    assert message.startswith("could not read audio file") and "garbage.wav" in message
    missing = one_line_error(omni.generate, tiny, HELLO, audio=[str(tmp_path / "absent.wav")], **SHORT)
    assert "does not exist" in missing


def test_a_lone_clip_is_one_clip(tiny, tmp_path):
    """`audio=` takes a list of clips, or one clip (a path, an array, an (array, rate) pair) on its own."""
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    path = tmp_path / "tone.wav"
    sf.write(str(path), tone, 16000, subtype="FLOAT")
    text_only = omni.generate(tiny, HELLO, max_tokens=2, return_audio=False)
    listed = omni.generate(tiny, HELLO, audio=[(tone, 16000)], max_tokens=2, return_audio=False)
    assert listed.prompt_tokens == text_only.prompt_tokens + 13 + 2  # 100 mel frames: 13 tokens, start, end
    for clip in ((tone, 16000), tone, str(path), path, [str(path)]):
        alone = omni.generate(tiny, HELLO, audio=clip, max_tokens=2, return_audio=False)
        assert (alone.prompt_tokens, alone.tokens) == (listed.prompt_tokens, listed.tokens)
    message = one_line_error(omni.generate, tiny, HELLO, audio=str(tmp_path / "absent.wav"), **SHORT)
    assert message == f"audio file {tmp_path / 'absent.wav'} does not exist"


def test_audio_needs_the_audio_encoder(thinker_only):
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    message = one_line_error(omni.generate, thinker_only, HELLO, audio=[(tone, 16000)], return_audio=False,
                             **SHORT)
    assert "without its audio encoder" in message


def test_speech_needs_the_talker_and_code2wav(thinker_only):
    message = one_line_error(omni.generate, thinker_only, HELLO, **SHORT)
    assert "has no talker and Code2Wav loaded" in message
    result = omni.generate(thinker_only, HELLO, max_tokens=3, return_audio=False)
    assert len(result.tokens) == 3 and result.audio is None


def test_prompt_longer_than_the_context(tiny, monkeypatch):
    decoder = tiny.model.thinker.model
    monkeypatch.setattr(decoder, "spec", dataclasses.replace(decoder.spec, max_position_embeddings=16))
    long = [{"role": "user", "content": "word " * 40}]
    message = one_line_error(omni.generate, tiny, long, **SHORT)
    assert "past the model's context of 16" in message


def test_bad_talker_options():
    with pytest.raises(TypeError, match="unknown talker sampling option 'speed'"):
        omni.talker_sampling(speed=2)


# -- shapes -----------------------------------------------------------------------------------------


def count(module: nn.Module) -> int:
    """Parameters of a module, from their shapes: MLX's initializers are lazy, nothing is made."""
    return sum(math.prod(v.shape) for _, v in tree_flatten(module.parameters()))


def test_published_shapes_and_parameter_count():
    args = OmniArgs.from_dict(dummy_config("qwen3-omni-30b-a3b"))
    t = args.thinker_text
    assert (t.num_hidden_layers, t.hidden_size, t.num_experts, t.num_experts_per_tok, t.vocab_size) == (
        48, 2048, 128, 8, 152064)
    talker = args.talker
    x = talker.text
    assert (x.num_hidden_layers, x.hidden_size, x.num_experts, x.num_experts_per_tok,
            x.shared_expert_intermediate_size) == (20, 1024, 128, 6, 768)
    assert talker.code_predictor.num_hidden_layers == 5 and talker.num_code_groups == 16
    assert talker.thinker_hidden_size == 2048 and talker.accept_hidden_layer == 24
    assert (args.audio["encoder_layers"], args.audio["d_model"], args.audio["output_dim"]) == (32, 1280, 2048)
    model = Model(args)
    c2w = model.code2wav.args
    assert (c2w.hidden_size, c2w.num_hidden_layers, c2w.total_upsample, c2w.start_trim) == (1024, 8, 1920, 555)

    audio = count(model.thinker.audio_tower)
    thinker = count(model.thinker) - audio
    # the thinker's decoder from its shapes alone: Qwen3-30B-A3B with Omni's 152064-token vocabulary
    h, heads, kv, hd, e, mi = 2048, 32, 4, 128, 128, 768
    layer = (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 2 * hd  # q, k, v, o and q/k norms
             + 2 * h + e * h + e * 3 * h * mi)  # two norms, router, experts
    assert thinker == 48 * layer + 2 * 152064 * h + h == 30_532_646_912
    talker_count, code2wav = count(model.talker), count(model.code2wav)
    assert 3.2e9 < talker_count < 3.45e9
    assert 0.6e9 < audio < 0.7e9 and 0.15e9 < code2wav < 0.25e9
    total = thinker + audio + talker_count + code2wav
    assert total == count(model)
    # Hugging Face lists 35.3B for the checkpoint, which also holds the image encoder that is not
    # built here: ~0.54B by its config (27 ViT blocks of width 1152, 4 patch mergers to 2048)
    assert abs(total + 0.54e9 - 35.3e9) < 0.1e9


def test_unknown_dummy_shape():
    message = one_line_error(omni.load, "dummy:qwen3-omni-huge")
    assert "unknown Qwen3-Omni dummy shape 'qwen3-omni-huge'" in message and "qwen3-omni-tiny" in message


def test_4bit_tiny_quantizes_the_decoders_only():
    parts = omni.load("dummy:qwen3-omni-tiny-4bit")
    model = parts.model
    quantized = {path for path, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)}
    assert "thinker.lm_head" in quantized and "talker.codec_head" in quantized
    assert any(p.startswith("talker.code_predictor.") for p in quantized)
    assert not any(p.startswith(("thinker.audio_tower", "code2wav")) for p in quantized)
    assert model.thinker.model.layers[0].mlp.gate.bits == 8  # routers at 8 bits, as mlx_lm.convert
    for _, v in tree_flatten(model.thinker.audio_tower.parameters()):
        assert mx.issubdtype(v.dtype, mx.floating)
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(model.code2wav.parameters()))
    result = omni.generate(parts, HELLO, max_tokens=4, talker=omni.talker_sampling(max_frames=3, min_frames=3),
                           seed=0)
    assert len(result.tokens) == 4 and result.frames == 3
    assert result.audio.shape == (3 * SAMPLES_PER_FRAME - START_TRIM,) and np.all(np.isfinite(result.audio))


# -- the thinker as a text model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_omni(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers.models.qwen3_omni_moe")
    from omni_reference import save_tiny_omni

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch's threads spin against MLX's on a small CPU
    try:
        folder = tmp_path_factory.mktemp("omni_text")
        save_tiny_omni(folder)
    finally:
        torch.set_num_threads(threads)
    return folder


def test_text_registry_loads_the_thinker(saved_omni):
    from metalgen.generate import generate_step
    from metalgen.loading import load

    model, tokenizer = load(str(saved_omni), dtype="float32")
    assert model.args.model_type == "qwen3_omni_moe_text"
    assert "audio_tower" not in model and "talker" not in model
    ids = tokenizer.encode("Hello there")
    tokens = [t for t, _ in generate_step(mx.array(ids), model, max_tokens=5)]
    assert len(tokens) == 5 and all(0 <= t < 152064 for t in tokens)
    # the same thinker as metalgen.omni runs: the same greedy tokens from the same ids
    parts = omni.load(str(saved_omni), dtype="float32", parts=("thinker",))
    again = [t for t, _ in generate_step(mx.array(ids), parts.model.thinker, max_tokens=5)]
    assert again == tokens
