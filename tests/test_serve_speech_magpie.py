"""`POST /v1/audio/speech` over Magpie TTS, on a live server over `dummy:magpie-tiny` (float32, random weights:
a 344 Hz codec of 16 samples a frame, NanoCodec's 21.5 frames a second; CPU). The route's shared machinery
(formats, SSE, failures) is tested over Qwen3-TTS in test_serve_speech.py; this file checks what differs for
Magpie: its voices, languages, sampling fields, limits and errors, and that what is served is what
`metalgen.tts.load(...).synthesize` makes with the same settings."""

from __future__ import annotations

import base64
import io
import json
import time

import numpy as np
import pytest
import soundfile as sf

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import metalgen  # noqa: E402
import metalgen.tts  # noqa: E402
from metalgen.serve.app import make_app  # noqa: E402
from metalgen.serve.speech import SpeechEngine, model_kind, parse_speech_request, parse_voices, pcm16  # noqa: E402
from live_server import live_server  # noqa: E402

NAME = "magpie"
FRAMES = 8  # the engine's frame cap (4 decoder steps of 2 frames); random weights seldom draw the audio EOS
SPF = 16  # samples a codec frame of the tiny codec


@pytest.fixture(scope="module")
def served():
    """(base url, MagpieTTS, engine) of a Magpie speech server on a free port, for the module."""
    tts = metalgen.tts.load("dummy:magpie-tiny")
    engine = SpeechEngine(tts, NAME, max_frames=FRAMES)
    with live_server(make_app(engine)) as port:
        yield f"http://127.0.0.1:{port}", tts, engine


def _body(**kw):
    return dict(dict(model=NAME, voice="Sofia", input="Hello.", response_format="wav"), **kw)


def post(served, **kw):
    body = dict(dict(model=NAME, voice="Sofia", input="Hello there.", response_format="wav", seed=1), **kw)
    r = httpx.post(served[0] + "/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


def int16(wav: np.ndarray) -> np.ndarray:
    return np.frombuffer(pcm16(wav), "<i2")


def test_models_lists_the_magpie_model(served):
    client = openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(served[0] + "/health").json()["model"] == NAME


def test_streamed_wav_is_synthesize_with_the_same_seed(served):
    url, tts, engine = served
    with httpx.stream("POST", url + "/v1/audio/speech", timeout=60, json={
            "model": NAME, "voice": "sofia", "input": "Hello there.", "response_format": "wav", "seed": 1}) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        pieces = list(r.iter_raw())
    data = b"".join(pieces)
    assert data[4:8] == b"\xff\xff\xff\xff"  # streamed: the length is not known in the header
    wav, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == tts.sample_rate == 344 and tts.samples_per_frame == SPF
    assert wav.shape == (FRAMES * SPF,)  # this seed draws no EOS: the clip runs to the frame cap
    assert engine.last == ("done", FRAMES)
    # the chunks, joined, are the clip `synthesize` makes in one go with the same seed (the codec is causal:
    # a chunk decoded with its left context is the whole decode's samples, up to float rounding)
    whole, _ = tts.synthesize("Hello there.", speaker="Sofia", seed=1, max_frames=FRAMES)
    assert np.abs(wav.astype(np.int32) - int16(whole)).max() <= 1


def test_sampling_fields_reach_magpie(served):
    _, tts, _ = served
    greedy = dict(temperature=0, top_k=5, cfg_scale=1.0)
    served_greedy = post(served, response_format="pcm", **greedy)
    whole, _ = tts.synthesize("Hello there.", speaker="Sofia", max_frames=FRAMES, **greedy)
    assert np.abs(np.frombuffer(served_greedy, "<i2").astype(np.int32) - int16(whole)).max() <= 1
    # temperature 0 is argmax: no seed matters; cfg_scale changes the guided logits, so the codes
    assert post(served, response_format="pcm", seed=2, **greedy) == served_greedy
    assert post(served, response_format="pcm", **dict(greedy, cfg_scale=2.5)) != served_greedy


def test_voice_is_a_name_in_any_case_or_an_index_and_language_a_code_or_name(served):
    engine = served[2]

    def parse(**kw):
        return parse_speech_request(_body(**kw), engine)

    assert {parse(voice=v).voice for v in ("SOFIA", "sofia", 4, "4", {"id": "Sofia"})} == {4}  # the speaker's row
    assert parse().language == "en" and parse(language="English").language == "en"
    assert parse(language="es", input="¿Qué tal?").input_tokens == len(served[1].encode("¿Qué tal?", "es"))
    assert parse(temperature=0, top_k=3, cfg_scale=1.5).sampling == {"temperature": 0.0, "top_k": 3,
                                                                      "cfg_scale": 1.5}
    assert post(served, voice=4) == post(served, voice="sofia") != post(served, voice="aria")


def test_pcm_sse_and_flac(served):
    wav = post(served, seed=2)
    pcm = post(served, seed=2, response_format="pcm")
    assert pcm == wav[44:]
    r = httpx.post(served[0] + "/v1/audio/speech", json=_body(input="Hello there.", seed=2, response_format="pcm",
                                                               stream_format="sse"))
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == pcm
    assert events[-1]["usage"]["output_tokens"] == len(pcm) // 2 // SPF  # codec frames
    assert events[-1]["usage"]["input_tokens"] == len(served[1].encode("Hello there."))
    flac, sr = sf.read(io.BytesIO(post(served, seed=2, response_format="flac")), dtype="int16")
    assert sr == 344 and np.abs(flac.astype(np.int32) - np.frombuffer(pcm, "<i2")).max() <= 1  # its own rounding


def test_a_closed_stream_frees_the_worker(served):
    """A client that goes away after the first chunk stops the generation at the next chunk, and the worker takes
    the next request. Its own engine, with room for 200 frames: long enough that only a cancellation ends it."""
    _, tts, _ = served
    engine = SpeechEngine(tts, NAME, max_frames=200)

    def first_chunk_then_close(url, **kw):
        engine.last = None
        with httpx.stream("POST", url, json=_body(response_format="pcm", **kw), timeout=60) as r:
            assert r.status_code == 200
            assert len(next(r.iter_raw())) == 4 * SPF * 2  # the first chunk: 4 frames; the connection closes here
        for _ in range(200):
            if engine.last is not None:
                break
            time.sleep(0.02)
        assert engine.last is not None and engine.last[0] == "cancelled" and engine.last[1] < 200

    with live_server(make_app(engine)) as port:
        url = f"http://127.0.0.1:{port}/v1/audio/speech"
        first_chunk_then_close(url)
        first_chunk_then_close(url, input="Hi.", voice="leo")


@pytest.mark.parametrize("body,status,param,says", [
    (_body(model="other"), 404, "model", "does not exist"),
    (_body(input=""), 400, "input", "empty"),
    (_body(input=5), 400, "input", "must be a string"),
    (_body(input="hello " * 100), 400, "input", "a sentence of 600 text tokens with its context, past this model's limit of 512"),
    (_body(input="Hello \u2603"), 400, "input", "cannot map 1 character: '\u2603' (U+2603)"),
    (_body(voice="alloy"), 400, "voice", "unknown voice 'alloy' (known: Aria, Jason, John, Leo, Sofia; or a speaker "
                                         "index 0..4)"),
    (_body(voice=5), 400, "voice", "unknown voice '5'"),
    (_body(voice=None), 400, "voice", "'voice' is required (known: Aria"),
    (_body(voice=True), 400, "voice", "must be a string"),
    (_body(language="klingon"), 400, "language", "unknown language 'klingon' (known: de, en, es, fr, hi, it, ja, vi)"),
    (_body(language=7), 400, "language", "must be a string"),
    (_body(instructions="Whisper."), 400, "instructions", "does not take 'instructions'"),
    (_body(speed=1.5), 400, "speed", "Magpie TTS has no rate control"),
    (_body(response_format="mp3"), 400, "response_format", "not available here"),  # libsndfile's MP3: no 344 Hz
    (_body(temperature=3), 400, "temperature", "between 0.0 and 2.0"),
    (_body(top_k=0), 400, "top_k", "at least 1"),
    (_body(cfg_scale="high"), 400, "cfg_scale", "must be a number"),
    (_body(seed=-1), 400, "seed", "integer"),
])
def test_bad_requests_get_openai_errors(served, body, status, param, says):
    r = httpx.post(served[0] + "/v1/audio/speech", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"] and "\n" not in err["message"]


def test_cloned_voices_need_a_context_encoder(served, monkeypatch, capsys):
    """--voice NAME=CLIP on the published layout (baked speakers only) is a start-up error naming why; on a
    checkpoint that clones, the clip's speaker context is made once and every request for NAME speaks with it."""
    _, tts, _ = served
    with pytest.raises(metalgen.MetalgenError, match="--voice me: voice cloning needs a Magpie checkpoint with a "
                                                     "context encoder; this one has only baked speakers"):
        SpeechEngine(tts, "m", ref_voices=parse_voices(["me=clip.wav"]))
    from metalgen.cli import main

    assert main(["serve", "--model", "dummy:magpie-tiny", "--voice", "me=clip.wav"]) == 1
    err = capsys.readouterr().err
    assert "needs a Magpie checkpoint with a context encoder" in err and err.count("\n") == 1
    with pytest.raises(metalgen.MetalgenError, match="Magpie clones a voice from the clip alone"):
        SpeechEngine(tts, "m", ref_voices=parse_voices(["me=clip.wav"], ["me=Hello."]))

    # stand in for a context encoder: the clip "clones" baked speaker 1 (Jason), whose context is known
    import metalgen.magpie.clone as clone

    monkeypatch.setattr(clone, "reference_context", lambda model, codec, clip: model.speaker_context(1))
    with pytest.raises(metalgen.MetalgenError, match="has a speaker of that name already"):
        SpeechEngine(tts, "m", ref_voices=parse_voices(["sofia=clip.wav"]))
    engine = SpeechEngine(tts, "m", max_frames=4, ref_voices=parse_voices(["Me=clip.wav"]))
    assert engine.voices == ["Aria", "Jason", "John", "Leo", "Sofia", "Me"]
    from starlette.testclient import TestClient

    with TestClient(make_app(engine)) as c:
        def speak(voice):
            r = c.post("/v1/audio/speech", json=_body(model="m", voice=voice, seed=3))
            assert r.status_code == 200
            return r.content

        assert speak("me") == speak("Jason") != speak("Aria")


def test_model_kind_tells_magpie_as_the_loader_does(tmp_path):
    assert model_kind("dummy:magpie-tiny") == model_kind("dummy:magpie-357m") == "speech"
    assert model_kind("nvidia/magpie_tts_multilingual_357m") == "speech"  # by the hub id, nothing fetched
    (tmp_path / "voice.nemo").write_bytes(b"")
    assert model_kind(str(tmp_path / "voice.nemo")) == model_kind(str(tmp_path)) == "speech"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert model_kind(str(tmp_path)) == "text"  # a text model's config decides, whatever lies beside it
    with pytest.raises(metalgen.MetalgenError, match="speech shapes: .*magpie-tiny"):
        model_kind("dummy:nope")


def test_the_serve_command_loads_magpie(monkeypatch, capsys):
    """`metalgen serve --model dummy:magpie-tiny`: detected as speech and served (uvicorn stubbed out)."""
    import uvicorn

    from metalgen.cli import main

    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    assert main(["serve", "--model", "dummy:magpie-tiny"]) == 0
    from starlette.testclient import TestClient

    with TestClient(apps[0]) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "dummy:magpie-tiny"
        r = c.post("/v1/chat/completions", json={"model": "dummy:magpie-tiny", "messages": []})
        assert r.status_code == 404 and "speech model" in r.json()["error"]["message"]
        r = c.post("/v1/audio/speech", json={"model": "dummy:magpie-tiny", "voice": "leo", "input": "Hi.",
                                             "response_format": "pcm", "seed": 0})
        assert r.status_code == 200 and len(r.content) > 0 and len(r.content) % (2 * SPF) == 0
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--codec", "codec.nemo"]) == 1
    assert capsys.readouterr().err.strip().endswith("error: --codec is for a Magpie TTS model")


def test_long_text_is_checked_per_sentence(served):
    # three sentences of ~200 text tokens: past the encoder's 512 positions together, within them one by
    # one (with the 20 history tokens a later chunk carries), so it is spoken chunk by chunk; the audio
    # is synthesize's for the same seed
    url, tts, engine = served
    text = " ".join(["hello " * 33 + "there."] * 3)
    chunks = tts.encode_chunks(text, "en")
    assert len(chunks) == 3 and sum(map(len, chunks)) > 512 and max(map(len, chunks)) + 20 <= 512
    r = httpx.post(url + "/v1/audio/speech", timeout=60,
                   json=dict(model=NAME, voice="Sofia", input=text, response_format="pcm", seed=2))
    assert r.status_code == 200, r.text
    got = np.frombuffer(r.content, "<i2")
    wav, _ = tts.synthesize(text, "en", "Sofia", seed=2, max_frames=FRAMES)
    np.testing.assert_allclose(got, int16(wav), atol=1)
    assert got.shape[0] > FRAMES * SPF  # more than one chunk's frame cap: every sentence was spoken


def test_japanese_without_pyopenjtalk_is_a_400(served, monkeypatch):
    # the dummy carries the published Japanese entry: where pyopenjtalk (or its dictionary) is missing, a
    # request in Japanese gets the front end's one-line error, not a 500
    import metalgen.magpie.ja_g2p as ja
    from metalgen.errors import MetalgenError

    def missing(name):
        raise MetalgenError(f"the Magpie tokenizer '{name}' (Japanese) needs pyopenjtalk, which is not installed")

    # where pyopenjtalk or its dictionary is missing, the server knew at start-up that it cannot speak Japanese
    # (the language is refused); where the front end works, the patched one fails on the text
    try:
        ja._frontend("japanese_phoneme")
        param = "input"
    except MetalgenError:
        param = "language"
    monkeypatch.setattr(ja, "_frontend", missing)
    r = httpx.post(served[0] + "/v1/audio/speech", json=_body(language="ja", input="こんにちは。"))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and "needs pyopenjtalk" in err["message"], err
