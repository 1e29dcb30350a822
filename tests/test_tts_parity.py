"""Qwen3-TTS parity against the official qwen-tts 0.1.1 (PyTorch, CPU, fp32) on tiny random
checkpoints built with its own config classes and saved with `save_pretrained`
(tests/qwen_tts_ref/make_reference.py, run in its own venv). Skipped, with the reason, when
that venv cannot be made (no network)."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from qwen_tts_ref.harness import reference_dump

FRAMES_LOGITS = 16
CASES = ["a", "b", "c"]  # see make_reference.py: speaker+language; instruct+dialect; streaming text


@pytest.fixture(scope="module")
def ref():
    folder, why = reference_dump()
    if folder is None:
        pytest.skip(why)
    import metalgen.tts

    return dict(
        folder=folder,
        npz=np.load(folder / "custom_voice.npz"),
        meta=json.loads((folder / "custom_voice.json").read_text()),
        tts=metalgen.tts.load(str(folder / "custom_voice")),
    )


def rel_err(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module")
def greedy(ref):
    """Our greedy run of each case with its raw logits recorded."""
    from metalgen.tts.frames import FrameGenerator

    tts, meta = ref["tts"], ref["meta"]
    out = {}
    for key in CASES:
        case = meta["cases"][key]
        prompt, _ = tts.prepare(case["text"], case.get("speaker"), case["language"], case.get("instruct"),
                                non_streaming=case.get("non_streaming_mode", True))
        sampling = tts.sampling(temperature=0.0, sub_temperature=0.0, max_frames=meta["frames"],
                                repetition_penalty=case.get("repetition_penalty", 1.05))
        gen = FrameGenerator(tts.model, prompt, sampling, seed=0, record_logits=True)
        codes = np.stack(list(gen.frames()))
        out[key] = dict(prompt=np.array(prompt.embeddings[0]), codes=codes,
                        talker=np.stack(gen.talker_logits), cp=np.stack(gen.cp_logits))
    return out


def test_checkpoint_layout_loads(ref):
    tts = ref["tts"]
    assert tts.model_type == "custom_voice"
    assert tts.speakers == sorted(ref["meta"]["speakers"])
    assert "auto" in tts.languages and "sichuan_dialect" not in tts.languages


@pytest.mark.parametrize("key", CASES)
def test_text_tokens_match(ref, key):
    from metalgen.tts.prompt import assistant_text

    case = ref["meta"]["cases"][key]
    ids = ref["tts"].tokenizer.encode(assistant_text(case["text"]))
    assert ids == ref["npz"][f"{key}_input_ids"].tolist()


@pytest.mark.parametrize("key", CASES)
def test_prompt_embeddings(ref, greedy, key):
    want = ref["npz"][f"{key}_prefill_embeds"]
    assert greedy[key]["prompt"].shape == want.shape
    assert rel_err(greedy[key]["prompt"], want) < 1e-5


@pytest.mark.parametrize("key", CASES)
def test_talker_logits(ref, greedy, key):
    want = ref["npz"][f"{key}_talker_logits"][:FRAMES_LOGITS]
    got = greedy[key]["talker"][:FRAMES_LOGITS]
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert max(errs) < 1e-4, errs


@pytest.mark.parametrize("key", CASES)
def test_code_predictor_logits(ref, greedy, key):
    want = ref["npz"][f"{key}_cp_logits"][:FRAMES_LOGITS]
    got = greedy[key]["cp"][:FRAMES_LOGITS]
    assert got.shape == want.shape
    errs = [rel_err(got[f, g], want[f, g]) for f in range(got.shape[0]) for g in range(got.shape[1])]
    assert max(errs) < 1e-4, max(errs)


@pytest.mark.parametrize("key", CASES)
def test_greedy_codes_identical(ref, greedy, key):
    want = ref["npz"][f"{key}_codes"]
    assert want.shape == (ref["meta"]["frames"], 16)
    np.testing.assert_array_equal(greedy[key]["codes"], want)


def _wave_ok(got, want):
    assert got.shape == want.shape
    assert float(np.corrcoef(got, want)[0, 1]) > 0.9999
    assert float(np.max(np.abs(got - want))) < 1e-3


@pytest.mark.parametrize("which", ["dec", "gen"])
def test_speech_decoder_whole(ref, which):
    codes = ref["npz"]["dec_codes" if which == "dec" else "a_codes"]
    wav = ref["tts"].speech.decoder(mx.array(codes[None].astype(np.int32)))[0]
    _wave_ok(np.array(wav), ref["npz"][f"{which}_whole"])


@pytest.mark.parametrize("which", ["dec", "gen"])
def test_speech_decoder_chunked(ref, which):
    codes = ref["npz"]["dec_codes" if which == "dec" else "a_codes"]
    chunk, left = ref["meta"]["decoder"]["rand" if which == "dec" else "gen"]
    wav = ref["tts"].speech.decoder.chunked(mx.array(codes[None].astype(np.int32)), chunk, left)[0]
    _wave_ok(np.array(wav), ref["npz"][f"{which}_chunked"])


@pytest.mark.parametrize("which", ["dec", "gen"])
def test_speech_tokenizer_decode_api(ref, which):
    """The tokenizer's own decode (its default 300/25 chunking), which synthesize uses."""
    codes = ref["npz"]["dec_codes" if which == "dec" else "a_codes"]
    _wave_ok(ref["tts"].decode(codes), ref["npz"][f"{which}_api"])


def test_stream_equals_reference_chunked(ref):
    """Streaming emits exactly the reference's chunked decode of the same frames."""
    from metalgen.models.qwen3_tts.speech_decoder import StreamingDecoder

    codes = ref["npz"]["dec_codes"]
    chunk, left = ref["meta"]["decoder"]["rand"]
    stream = StreamingDecoder(ref["tts"].speech.decoder, chunk, left)
    pieces = []
    for f in range(codes.shape[0]):  # one frame at a time, as the talker produces them
        pieces += [np.array(p[0]) for p in stream.push(mx.array(codes[None, f : f + 1].astype(np.int32)))]
    pieces += [np.array(p[0]) for p in stream.flush()]
    assert len(pieces) == -(-codes.shape[0] // chunk)
    _wave_ok(np.concatenate(pieces), ref["npz"]["dec_chunked"])


@pytest.fixture(scope="module")
def voice_design(ref):
    import metalgen.tts
    from metalgen.tts.frames import FrameGenerator

    folder = ref["folder"]
    tts = metalgen.tts.load(str(folder / "voice_design"))
    meta = json.loads((folder / "voice_design.json").read_text())
    case = meta["cases"]["d"]
    prompt, _ = tts.prepare(case["text"], None, case["language"], case["instruct"])
    gen = FrameGenerator(tts.model, prompt, tts.sampling(temperature=0.0, sub_temperature=0.0,
                                                         max_frames=meta["frames"]), seed=0, record_logits=True)
    codes = np.stack(list(gen.frames()))
    return dict(tts=tts, npz=np.load(folder / "voice_design.npz"), codes=codes,
                talker=np.stack(gen.talker_logits), cp=np.stack(gen.cp_logits))


def test_voice_design_parity(voice_design):
    v = voice_design
    assert v["tts"].model_type == "voice_design"
    want = v["npz"]
    errs = [rel_err(g, w) for g, w in zip(v["talker"][:FRAMES_LOGITS], want["d_talker_logits"][:FRAMES_LOGITS])]
    assert max(errs) < 1e-4
    cp, cw = v["cp"][:FRAMES_LOGITS], want["d_cp_logits"][:FRAMES_LOGITS]
    assert max(rel_err(cp[f, g], cw[f, g]) for f in range(cp.shape[0]) for g in range(cp.shape[1])) < 1e-4
    np.testing.assert_array_equal(v["codes"], want["d_codes"])


def test_speech_tokenizer_encoder_codes(ref):
    """The 12 Hz tokenizer's encoder (Mimi) gives the reference's codes on a test clip."""
    from metalgen.tts.clone import encode_codes

    folder = ref["folder"]
    # CustomVoice checkpoints load without the encoder; ask for it explicitly here.
    from metalgen.tts.loading import load_parts

    _, speech, _, _ = load_parts(folder / "custom_voice", with_encoder=True)
    codes = encode_codes(speech, ref["npz"]["enc_clip"])
    np.testing.assert_array_equal(codes, ref["npz"]["enc_codes"])


@pytest.fixture(scope="module")
def base(ref):
    import metalgen.tts

    folder = ref["folder"]
    return dict(tts=metalgen.tts.load(str(folder / "base")), npz=np.load(folder / "base.npz"),
                meta=json.loads((folder / "base.json").read_text()))


def test_base_speaker_embedding_and_codes(base):
    from metalgen.models.qwen3_tts.speaker_encoder import log_mel
    from metalgen.tts.clone import encode_codes, speaker_embedding

    npz = base["npz"]
    assert float(np.max(np.abs(log_mel(npz["clip"]) - npz["mel"]))) < 1e-4
    spk = np.array(speaker_embedding(base["tts"].model, npz["clip"]))
    assert rel_err(spk, npz["spk"]) < 1e-4
    np.testing.assert_array_equal(encode_codes(base["tts"].speech, npz["clip"]), npz["ref_codes"])


@pytest.mark.parametrize("key", ["icl", "xvec"])
def test_base_voice_clone_parity(base, key):
    from metalgen.tts.frames import FrameGenerator

    tts, npz, meta = base["tts"], base["npz"], base["meta"]
    case = meta["cases"][key]
    prompt, _ = tts.prepare(case["text"], None, case["language"], None, ref_audio=(npz["clip"], 24000),
                            ref_text=case.get("ref_text"), non_streaming=case["non_streaming_mode"])
    assert rel_err(np.array(prompt.embeddings[0]), npz[f"{key}_prefill_embeds"]) < 1e-5
    gen = FrameGenerator(tts.model, prompt, tts.sampling(temperature=0.0, sub_temperature=0.0,
                                                         max_frames=meta["frames"]), seed=0, record_logits=True)
    codes = np.stack(list(gen.frames()))
    errs = [rel_err(g, w) for g, w in zip(gen.talker_logits[:FRAMES_LOGITS], npz[f"{key}_talker_logits"])]
    assert max(errs) < 1e-4
    cp, cw = np.stack(gen.cp_logits)[:FRAMES_LOGITS], npz[f"{key}_cp_logits"][:FRAMES_LOGITS]
    assert max(rel_err(cp[f, g], cw[f, g]) for f in range(cp.shape[0]) for g in range(cp.shape[1])) < 1e-4
    np.testing.assert_array_equal(codes, npz[f"{key}_codes"])


def test_base_synthesize_and_stream(base, tmp_path):
    """End to end from a WAV file at another sample rate (resampled), in-context cloning: the
    reference frames are decoded as left context and cut, as the reference does."""
    import soundfile as sf

    clip = base["npz"]["clip"]
    path = tmp_path / "ref16k.wav"
    from metalgen.tts.audio import resample

    sf.write(str(path), resample(clip, 24000, 16000), 16000, subtype="FLOAT")
    tts = base["tts"]
    wav, sr = tts.synthesize("Hello.", ref_audio=str(path), ref_text="This is the reference clip.", seed=0,
                             max_frames=5)
    assert sr == 24000 and wav.dtype == np.float32 and wav.shape[0] > 0
    chunks = list(tts.stream("Hello.", ref_audio=str(path), seed=0, max_frames=5, chunk_frames=2))
    assert sum(c.shape[0] for c in chunks) == 5 * tts.speech.decoder.total_upsample
