"""`POST /v1/audio/speech` against the official openai client, on a live server over `dummy:qwen3-tts-tiny`
(float32, random weights: 3 kHz audio, 240 samples a frame; CPU)."""

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
from metalgen.serve.protocol import RequestError  # noqa: E402
from metalgen.serve.speech import SpeechEngine, model_kind, parse_speech_request, parse_voices  # noqa: E402
from live_server import live_server  # noqa: E402

NAME = "tiny-tts"
FRAMES = 16  # the engine's frame cap: random weights seldom draw the codec EOS, so clips run to it
UP = 240  # samples a frame of the tiny speech decoder


@pytest.fixture(scope="module")
def served():
    """(base url, TTSModel, engine) of a speech server on a free port, for the module."""
    tts = metalgen.tts.load("dummy:qwen3-tts-tiny", dtype="float32")
    engine = SpeechEngine(tts, NAME, max_frames=FRAMES)
    with live_server(make_app(engine)) as port:
        yield f"http://127.0.0.1:{port}", tts, engine


@pytest.fixture()
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0)


def speak(client, seed=1, **kw):
    kw = dict(dict(model=NAME, voice="vivian", input="Hello there.", response_format="wav"), **kw)
    return client.audio.speech.create(extra_body={"seed": seed}, **kw).content


def test_models_lists_the_speech_model(served, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(served[0] + "/health").json()["model"] == NAME


def test_wav_is_the_one_shot_audio_at_the_model_rate(served, client):
    _, tts, engine = served
    data = speak(client, seed=1, voice="Vivian")  # voices are case-insensitive, as the TTS API's speakers
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    wav, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == tts.sample_rate == 3000
    assert wav.shape[0] % UP == 0 and 2 <= wav.shape[0] // UP <= FRAMES
    # the streamed chunks, joined, are the audio `synthesize` makes in one go with the same seed
    whole, _ = tts.synthesize("Hello there.", speaker="vivian", seed=1, max_frames=FRAMES)
    expected = np.rint(np.clip(whole, -1, 1) * 32767).astype(np.int16)
    assert wav.shape == expected.shape
    assert np.abs(wav.astype(np.int32) - expected).max() <= 1  # float rounding at a half step, at most
    assert engine.last == ("done", wav.shape[0] // UP)


def test_pcm_is_the_wavs_samples(client):
    wav = speak(client, seed=2)
    pcm = speak(client, seed=2, response_format="pcm")
    samples = sf.info(io.BytesIO(wav)).frames
    assert len(pcm) % 2 == 0 and len(pcm) == samples * 2
    assert pcm == wav[44:]  # 16-bit little-endian mono: the WAV's data chunk
    assert np.array_equal(np.frombuffer(pcm, "<i2"), sf.read(io.BytesIO(wav), dtype="int16")[0])


def test_streamed_bytes_equal_the_whole_response(client):
    whole = speak(client, seed=3)
    kw = dict(model=NAME, voice="vivian", input="Hello there.", response_format="wav", extra_body={"seed": 3})
    with client.audio.speech.with_streaming_response.create(**kw) as r:
        assert r.headers["content-type"] == "audio/wav"
        parts = list(r.iter_bytes())
    streamed = b"".join(parts)
    assert streamed == whole
    # the header says "length unknown", as streaming WAV servers send it
    assert streamed[4:8] == b"\xff\xff\xff\xff" and streamed[40:44] == b"\xff\xff\xff\xff"
    assert speak(client, seed=4) != whole  # the seed reaches the sampler


def test_sse_stream_format(client):
    pcm = speak(client, seed=5, response_format="pcm")
    r = httpx.post(client.base_url.join("audio/speech").__str__(), json={
        "model": NAME, "voice": "vivian", "input": "Hello there.", "response_format": "pcm",
        "stream_format": "sse", "seed": 5}, timeout=60)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events[-1:]] == ["speech.audio.done"]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"} and len(events) > 2
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == pcm
    assert events[-1]["usage"]["output_tokens"] == len(pcm) // 2 // UP


def test_flac_is_encoded_and_what_soundfile_cannot_write_is_refused(served, client):
    wav = sf.read(io.BytesIO(speak(client, seed=6)), dtype="int16")[0]
    flac, sr = sf.read(io.BytesIO(speak(client, seed=6, response_format="flac")), dtype="int16")
    assert sr == 3000 and flac.shape == wav.shape
    assert np.abs(flac.astype(np.int32) - wav).max() <= 1  # libsndfile rounds float -> 16 bits itself
    for fmt, why in (("mp3", "only supports sample rates"), ("aac", "no encoder"), ("ogg", "must be one of")):
        with pytest.raises(openai.BadRequestError) as e:
            speak(client, response_format=fmt)
        assert e.value.body["param"] == "response_format" and why in e.value.body["message"]
    # OpenAI's default format is mp3: a 3 kHz model cannot give it, and says so rather than sending wav
    r = httpx.post(served[0] + "/v1/audio/speech", json={"model": NAME, "voice": "vivian", "input": "Hi"})
    assert r.status_code == 400 and "'mp3'" in r.json()["error"]["message"]


def test_temperature_and_top_k_reach_both_samplers(client):
    # temperature 0 makes the talker and the code predictor argmax: the seed no longer matters
    kw = dict(model=NAME, voice="vivian", input="Hello there.", response_format="pcm")
    one = client.audio.speech.create(extra_body={"seed": 1, "temperature": 0}, **kw).content
    assert client.audio.speech.create(extra_body={"seed": 2, "temperature": 0}, **kw).content == one
    assert client.audio.speech.create(extra_body={"seed": 2, "top_k": 1}, **kw).content == one


def test_instructions_reach_the_prompt(client):
    # the tiny shape is a 1.7B CustomVoice, which takes an instruction (0.6B: refused, below)
    assert speak(client, seed=7, instructions="Speak slowly.") != speak(client, seed=7)


def _body(**kw):
    return json.dumps(dict(dict(model=NAME, voice="vivian", input="Hello.", response_format="wav"), **kw))


@pytest.mark.parametrize("body,status,param,says", [
    (b"{not json", 400, None, "not valid JSON"),
    (b"[" * 100_000, 400, None, "not valid JSON"),  # past the parser's stack
    (_body()[:-1].encode() + b', "seed": 1' + b"0" * 5000 + b"}", 400, None, "not valid JSON"),  # > 4300 digits
    (_body(model="other"), 404, "model", "does not exist"),
    (_body(input=""), 400, "input", "empty"),
    (_body(input="   "), 400, "input", "empty"),
    (_body(input=["Hello"]), 400, "input", "must be a string"),
    (json.dumps({"model": NAME, "voice": "vivian"}), 400, "input", "required"),
    (_body(voice="alloy"), 400, "voice", "unknown voice 'alloy' (known: aiden, dylan, eric, ono_anna, ryan"),
    (_body(voice=None), 400, "voice", "'voice' is required (known: aiden"),
    (_body(voice=3), 400, "voice", "must be a string"),
    (_body(instructions=5), 400, "instructions", "must be a string"),
    (_body(speed=1.25), 400, "speed", "no rate control"),
    (_body(speed="fast"), 400, "speed", "must be a number"),
    (_body(stream_format="chunks"), 400, "stream_format", "'audio' or 'sse'"),
    (_body(seed="7"), 400, "seed", "integer"),
    (_body(language="klingon"), 400, "language", "unknown language 'klingon'"),
    (_body(cfg_scale=2.0), 400, "cfg_scale", "Qwen3-TTS has none"),
    (_body(temperature=-1), 400, "temperature", "between 0.0 and 2.0"),
    (_body(top_k=2.5), 400, "top_k", "must be an integer"),
    (_body(input="hello " * 33000), 400, "input", "past this model's limit"),
])
def test_bad_requests_get_openai_errors(served, body, status, param, says):
    r = httpx.post(served[0] + "/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"] and "\n" not in err["message"]


def test_text_routes_are_refused_on_a_speech_model_and_speech_on_a_text_model(served, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["param"] == "model" and "speech model" in e.value.body["message"]
    from starlette.testclient import TestClient

    from metalgen.serve.engine import Engine

    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    with TestClient(make_app(Engine(model, tok, "text"))) as text_server:
        r = text_server.post("/v1/audio/speech", json={"model": "text", "input": "Hi", "voice": "vivian"})
        assert r.status_code == 404 and "is a text model" in r.json()["error"]["message"]
        assert text_server.get("/v1/models").json()["data"][0]["id"] == "text"


def test_a_closed_stream_stops_its_generation(served, client):
    url, _, engine = served
    engine.last = None
    with httpx.stream("POST", url + "/v1/audio/speech", json={
            "model": NAME, "voice": "vivian", "input": "Hello there.", "response_format": "pcm"}) as r:
        assert r.status_code == 200
        next(r.iter_raw())  # the first chunk (2 frames); the connection closes here
    for _ in range(400):
        if engine.last is not None:
            break
        time.sleep(0.05)
    assert engine.last is not None and engine.last[0] == "cancelled" and engine.last[1] < FRAMES
    assert len(speak(client, seed=1, response_format="pcm")) > 0  # the server goes on


def test_the_body_size_and_queue_limits_apply_to_speech(served, client, monkeypatch):
    """A body past --max-request-bytes is a 413 error object; a request that would wait past --max-queue
    (here 0: none may wait) a 429 with Retry-After, while the first one generates."""
    import threading

    from starlette.testclient import TestClient

    url, tts, engine = served
    with TestClient(make_app(engine, max_request_bytes=200)) as c:
        r = c.post("/v1/audio/speech", json={"model": NAME, "voice": "vivian", "input": "x" * 300})
        assert r.status_code == 413 and "limit of 200 bytes" in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "invalid_request_error"
    gate, real, done = threading.Event(), tts.stream, []

    def held(*args, **kw):
        gate.wait(30)
        yield from real(*args, **kw)

    monkeypatch.setattr(tts, "stream", held)
    monkeypatch.setattr(engine.in_flight, "max_queue", 0)
    first = threading.Thread(target=lambda: done.append(speak(client, seed=1, response_format="pcm")))
    first.start()
    try:
        for _ in range(500):
            if len(engine.in_flight) == 1:
                break
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as e:
            speak(client, seed=2)
        assert e.value.response.headers["retry-after"] == "1"
        assert e.value.response.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        gate.set()
        first.join(60)
    assert len(done) == 1 and len(done[0]) > 0
    for _ in range(100):  # the worker lets go of the job right before its last event
        if len(engine.in_flight) == 0:
            break
        time.sleep(0.01)
    assert len(speak(client, seed=2, response_format="pcm")) > 0  # free again


def test_model_limits_by_checkpoint_type(tmp_path):
    """0.6B CustomVoice takes no instructions; VoiceDesign needs them (its `voice` names nothing); a Base
    model clones the voices the server was started with."""
    small = SpeechEngine(metalgen.tts.load("dummy:qwen3-tts-tiny-0b6"), "s")
    with pytest.raises(RequestError, match="does not take 'instructions'") as e:
        parse_speech_request({"model": "s", "input": "Hi", "voice": "ryan", "instructions": "Whisper.",
                              "response_format": "wav"}, small)
    assert e.value.param == "instructions"
    design = SpeechEngine(metalgen.tts.load("dummy:qwen3-tts-tiny-voicedesign"), "d")
    with pytest.raises(RequestError, match="needs 'instructions'"):
        parse_speech_request({"model": "d", "input": "Hi", "voice": "alloy", "response_format": "wav"}, design)
    req = parse_speech_request({"model": "d", "input": "Hi", "voice": "alloy", "instructions": "A calm voice.",
                                "response_format": "wav"}, design)
    assert req.voice is None and req.instructions == "A calm voice."

    t = np.arange(4500) / 3000
    sf.write(str(tmp_path / "ref.wav"), (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 3000)
    base = SpeechEngine(metalgen.tts.load("dummy:qwen3-tts-tiny-base"), "b", max_frames=3,
                        ref_voices=parse_voices([f"Me={tmp_path / 'ref.wav'}"]))
    with pytest.raises(RequestError, match=r"unknown voice 'vivian' \(known: Me\)"):
        parse_speech_request({"model": "b", "input": "Hi", "voice": "vivian", "response_format": "wav"}, base)
    from starlette.testclient import TestClient

    with TestClient(make_app(base)) as c:
        r = c.post("/v1/audio/speech", json={"model": "b", "input": "Hi", "voice": "me", "response_format": "wav",
                                             "seed": 0})
        assert r.status_code == 200 and sf.info(io.BytesIO(r.content)).frames == 3 * UP


def test_model_kind_comes_from_the_config(tmp_path):
    assert model_kind("dummy:qwen3-tts-tiny") == "speech" and model_kind("dummy:tiny-qwen3") == "text"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_tts"}))
    assert model_kind(str(tmp_path)) == "speech"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert model_kind(str(tmp_path)) == "text"
    with pytest.raises(metalgen.MetalgenError, match="speech shapes: qwen3-tts-0.6b"):
        model_kind("dummy:nope")


def test_serve_command_voice_flags_are_one_line_errors(capsys):
    from metalgen.cli import main

    assert main(["serve", "--model", "dummy:tiny-qwen3", "--voice", "me=ref.wav"]) == 1
    assert capsys.readouterr().err.strip() == ("metalgen: error: --voice is for a speech model (Qwen3-TTS Base, or "
                                               "Magpie with a context encoder)")
    assert main(["serve", "--model", "dummy:qwen3-tts-tiny-base", "--voice", "me"]) == 1
    assert "--voice takes NAME=VALUE" in capsys.readouterr().err
    assert main(["serve", "--model", "dummy:qwen3-tts-tiny-base", "--voice-text", "me=Hello"]) == 1
    assert "has no --voice me=CLIP" in capsys.readouterr().err


def test_generation_failures_before_and_after_the_audio_began(served, monkeypatch):
    """Before the first chunk: an error object (400 for the TTS API's own errors, 500 otherwise). After it:
    the connection is cut, so that a client never takes a truncated clip for a whole one."""
    url, tts, _ = served

    def failing(first_chunk, error):
        def stream(*args, **kw):
            if first_chunk:
                yield np.zeros(UP, np.float32)
            raise error
        return stream

    body = {"model": NAME, "voice": "vivian", "input": "Hi", "response_format": "pcm"}
    monkeypatch.setattr(tts, "stream", failing(False, metalgen.MetalgenError("the text is empty")))
    r = httpx.post(url + "/v1/audio/speech", json=body)
    assert r.status_code == 400 and r.json()["error"]["message"] == "the text is empty"
    monkeypatch.setattr(tts, "stream", failing(False, RuntimeError("boom")))
    r = httpx.post(url + "/v1/audio/speech", json=body)
    err = r.json()["error"]
    assert r.status_code == 500 and err["type"] == "server_error" and "boom" in err["message"]
    monkeypatch.setattr(tts, "stream", failing(True, RuntimeError("boom")))
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(url + "/v1/audio/speech", json=body)
    r = httpx.post(url + "/v1/audio/speech", json=dict(body, stream_format="sse"))
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "speech.audio.delta" and events[-1]["error"]["type"] == "server_error"


def test_the_serve_command_serves_a_speech_model(tmp_path):
    """`metalgen serve --model dummy:qwen3-tts-tiny`, as a process: detected as speech, served."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "metalgen", "serve", "--model", "dummy:qwen3-tts-tiny",
                             "--dtype", "float32", "--port", str(port)], cwd=root, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = httpx.post(url + "/v1/audio/speech", timeout=60, json={
            "model": "dummy:qwen3-tts-tiny", "voice": "ryan", "input": "Hi", "response_format": "pcm", "seed": 0})
        assert r.status_code == 200 and len(r.content) > 0 and len(r.content) % (2 * UP) == 0
        r = httpx.post(url + "/v1/chat/completions", json={"model": "dummy:qwen3-tts-tiny", "messages": []})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
