"""Qwen3-Omni served: its text routes on the thinker and `POST /v1/audio/speech` on its talker, one loaded model
(`dummy:qwen3-omni-tiny`, float32, random weights; CPU)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import metalgen.omni as omni  # noqa: E402
from metalgen.errors import MetalgenError  # noqa: E402
from metalgen.serve.app import make_app  # noqa: E402
from metalgen.serve.engine import Engine  # noqa: E402
import metalgen.serve.speech as sp  # noqa: E402
from metalgen.serve.speech import SpeechEngine, model_kind, parse_speech_request, pcm16  # noqa: E402
from live_server import live_server  # noqa: E402

NAME = "tiny-omni"
FRAMES = 6  # the speech engine's frame cap: random weights seldom draw the codec EOS
SAID = "Good morning, and welcome."


@pytest.fixture(scope="module")
def served():
    """(base url, OmniParts) of a server with both engines over one load."""
    parts = omni.load("dummy:qwen3-omni-tiny", dtype="float32", parts=("thinker", "talker", "code2wav"))
    text = Engine(parts.model.thinker, parts.tokenizer, NAME, decode="reference", max_batch=4)
    speech = SpeechEngine(parts, NAME, max_frames=FRAMES)
    with live_server(make_app(text, 16, speech=speech)) as port:
        yield f"http://127.0.0.1:{port}", parts


@pytest.fixture()
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0)


def test_the_model_kind_is_text_and_speech(tmp_path):
    assert model_kind("dummy:qwen3-omni-tiny") == "text+speech"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_omni_moe"}))
    assert model_kind(str(tmp_path)) == "text+speech"


def test_text_and_speech_from_one_server(served, client):
    url, parts = served
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens >= 1
    data = client.audio.speech.create(model=NAME, voice="Chelsie", input=SAID, response_format="wav",
                                      extra_body={"seed": 5}).content
    wav, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == omni.SAMPLE_RATE
    # the talker speaking the input as the reply to it, as metalgen.omni gives it
    talker = omni.talker_sampling(parts.generation_config, max_frames=FRAMES)
    want = omni.generate(parts, [{"role": "user", "content": SAID}], say=SAID, speaker="chelsie", seed=5,
                         talker=talker).audio
    assert wav.shape[0] > 0
    np.testing.assert_allclose(wav, np.frombuffer(pcm16(want), "<i2"), atol=1)
    other = client.audio.speech.create(model=NAME, voice="chelsie", input="Another sentence entirely.",
                                       response_format="wav", extra_body={"seed": 5}).content
    assert other != data


def test_the_request_reaches_the_talker_as_asked(served, monkeypatch):
    # the tiny checkpoint's speakers sound alike (its codes barely move with the speaker embedding), so what the
    # family hands metalgen.omni is checked here
    _, parts = served
    engine = SpeechEngine(parts, NAME, max_frames=FRAMES)
    seen = {}
    monkeypatch.setattr(omni, "stream", lambda parts, messages, **kw: seen.update(messages=messages, **kw) or iter(()))
    req = parse_speech_request({"model": NAME, "voice": "Aiden", "input": SAID, "response_format": "wav",
                                "seed": 9, "temperature": 0.5, "top_k": 7}, engine)
    assert list(engine.family.stream(req)) == []
    assert seen["messages"] == [{"role": "user", "content": SAID}] and seen["say"] == SAID
    assert seen["speaker"] == "aiden" and seen["seed"] == 9
    t = seen["talker"]
    assert (t.max_frames, t.temperature, t.top_k) == (FRAMES, 0.5, 7)


def test_streamed_pcm_is_the_same_audio(served, client):
    whole = client.audio.speech.create(model=NAME, voice="ethan", input=SAID, response_format="pcm",
                                       extra_body={"seed": 2}).content
    with httpx.stream("POST", served[0] + "/v1/audio/speech", json={
            "model": NAME, "voice": "ethan", "input": SAID, "response_format": "pcm", "seed": 2}) as r:
        assert r.status_code == 200
        streamed = b"".join(r.iter_bytes())
    assert streamed == whole and len(whole) > 0


@pytest.mark.parametrize("field,param,words", [
    ({"voice": "vivian"}, "voice", "known: aiden, chelsie, ethan"),
    ({"voice": 3}, "voice", "a voice name"),
    ({"instructions": "Whisper."}, "instructions", "does not take"),
    ({"language": "en"}, "language", "language of the input"),
    ({"cfg_scale": 2.0}, "cfg_scale", "Magpie"),
])
def test_what_omni_cannot_do_is_a_400(served, field, param, words):
    body = dict({"model": NAME, "voice": "ethan", "input": SAID, "response_format": "wav"}, **field)
    r = httpx.post(served[0] + "/v1/audio/speech", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_an_input_past_the_limit_is_a_400(served, monkeypatch):
    url, parts = served
    limit = len(parts.tokenizer.encode(SAID)) - 1
    # the limit of a checkpoint whose context is that short (the tiny one's is long)
    real = sp.OmniSpeech.__init__

    def short(self, *a, **k):
        real(self, *a, **k)
        self.input_limit = limit

    monkeypatch.setattr(sp.OmniSpeech, "__init__", short)
    engine = SpeechEngine(parts, NAME, max_frames=FRAMES)
    from starlette.testclient import TestClient

    with TestClient(make_app(engine)) as c:
        r = c.post("/v1/audio/speech", json={"model": NAME, "voice": "ethan", "input": SAID, "response_format": "wav"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input" and f"limit of {limit}" in r.text


def test_a_thinker_only_checkpoint_serves_text_only():
    parts = omni.load("dummy:qwen3-omni-tiny", dtype="float32", parts=("thinker",))
    with pytest.raises(MetalgenError, match="serves text only"):
        SpeechEngine(parts, NAME)
    from starlette.testclient import TestClient

    with TestClient(make_app(Engine(parts.model.thinker, parts.tokenizer, NAME, decode="reference"))) as c:
        r = c.post("/v1/audio/speech", json={"model": NAME, "voice": "ethan", "input": "Hi"})
    assert r.status_code == 404 and "is a text model" in r.json()["error"]["message"]


def test_serve_command_puts_both_routes_on_one_load(monkeypatch):
    from starlette.testclient import TestClient

    from metalgen.cli import main

    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.update(app=app, **kw))
    assert main(["serve", "--model", "dummy:qwen3-omni-tiny", "--dtype", "float32", "--no-warmup"]) == 0
    with TestClient(ran["app"]) as c:
        r = c.post("/v1/chat/completions", json={"model": "dummy:qwen3-omni-tiny", "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
        # the speech route is Omni's (its speakers), checked before anything is generated
        r = c.post("/v1/audio/speech", json={"model": "dummy:qwen3-omni-tiny", "voice": "nobody", "input": "Hi"})
        assert r.status_code == 400 and "known: aiden, chelsie, ethan" in r.json()["error"]["message"]
