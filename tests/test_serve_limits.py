"""What `metalgen serve` accepts (issue 17): the cap on a request body's size (413, read no further than the
limit) and on the requests waiting for the engine (429 with Retry-After), through the openai client against a
live server whose engine holds each request until the test lets it go; the queue's count alone; the flags."""

from __future__ import annotations

import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import metalgen  # noqa: E402
from metalgen.serve.app import make_app  # noqa: E402
from metalgen.serve.engine import Engine, InFlight  # noqa: E402
from metalgen.serve.protocol import RequestError, usage  # noqa: E402
from live_server import live_server  # noqa: E402

NAME = "t"
LIMIT = 4096  # bytes of request body


class Held(Engine):
    """Replies "ok" to each request once `gate` is set (one at a time: the first holds the worker, the
    others wait in the queue)."""

    gate = threading.Event()

    def _generate(self, job):
        self.gate.wait(30)
        job.put("text", "ok")
        self._end(job, "done", "stop", usage(len(job.ids), 1, 0))


@pytest.fixture(scope="module")
def held():
    """(client, url, engine): a server of one request at a time, at most 1 waiting, bodies of LIMIT bytes."""
    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    engine = Held(model, tok, NAME, decode="plain", max_queue=1)
    Held.gate.set()
    with live_server(make_app(engine, 16, max_request_bytes=LIMIT)) as port:
        url = f"http://127.0.0.1:{port}"
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0), url, engine
    Held.gate.set()


def chat(client, content="Hi", **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": content}], **kw)


# -- the body's size -----------------------------------------------------------------------------------------

def test_a_body_past_the_limit_is_a_413_error_object(held):
    client, url, _ = held
    assert chat(client, "x" * (LIMIT - 200)).choices[0].message.content == "ok"  # under it: served
    with pytest.raises(openai.APIStatusError) as e:
        chat(client, "x" * (LIMIT + 1))
    assert e.value.status_code == 413
    err = e.value.response.json()["error"]
    assert err["type"] == "invalid_request_error" and f"limit of {LIMIT} bytes" in err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    assert chat(client).choices[0].message.content == "ok"  # and the server goes on


def test_a_chunked_body_is_refused_once_it_passes_the_limit(held):
    _, url, _ = held
    sent = []

    def body(n):
        for _ in range(n):
            sent.append(1024)
            yield b" " * 1024  # (JSON whitespace: a body within the limit is still a valid request below)

    r = httpx.post(url + "/v1/completions", content=body(64), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit of 4096 bytes" in r.json()["error"]["message"]
    ok = httpx.post(url + "/v1/completions", headers={"content-type": "application/json"},
                    content=iter([b'{"model": "t", ', b'"prompt": "Hi", "max_tokens": 2}']))
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "ok"


def test_a_declared_length_past_the_limit_is_refused_before_the_body_is_read(held):
    """A Content-Length of a terabyte, and no body sent at all: the 413 comes at once."""
    _, url, _ = held
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000000000000\r\n\r\n{")
        reply = b""
        while not reply.endswith(b"}}"):  # the headers, then the error object
            data = s.recv(4096)
            if not data:
                break
            reply += data
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413") and '"type":"invalid_request_error"' in reply.replace(" ", "")


# -- the queue -----------------------------------------------------------------------------------------------

def test_a_full_queue_is_a_429_with_retry_after_and_frees_up(held):
    client, url, engine = held
    Held.gate.clear()
    results = {}

    def ask(key, **kw):
        try:
            results[key] = chat(client, **kw).choices[0].message.content
        except Exception as e:  # noqa: BLE001 - the test reads it
            results[key] = e

    threads = [threading.Thread(target=ask, args=("running",))]
    threads[0].start()
    try:
        for _ in range(500):  # the first holds the worker ...
            if engine.state()["rows"] == 1:
                break
            time.sleep(0.01)
        threads.append(threading.Thread(target=ask, args=("waiting",)))
        threads[1].start()
        for _ in range(500):  # ... the second waits: the queue (1) is full
            if engine.state()["jobs"] == 2:
                break
            time.sleep(0.01)
        assert engine.state()["jobs"] == 2 and engine.state()["queued"] == 1
        with pytest.raises(openai.RateLimitError) as e:
            chat(client)
        assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "1"
        err = e.value.response.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
        assert "--max-queue 1" in err["message"]
        with pytest.raises(openai.RateLimitError):  # streamed too: refused before the stream begins
            chat(client, stream=True)
        r = httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": "x"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert engine.state()["jobs"] == 2  # nothing refused was queued
    finally:
        Held.gate.set()
        for t in threads:
            t.join(30)
    assert results == {"running": "ok", "waiting": "ok"}
    assert chat(client).choices[0].message.content == "ok"


def test_the_queue_counts_what_waits_beyond_what_runs():
    class job:
        def __init__(self):
            self.cancelled = threading.Event()

    q = InFlight(running=2, max_queue=1)
    jobs = [job(), job()]
    for j in jobs:
        q.add(j)
    q.admit()  # two running, none waiting
    q.add(job())
    assert q.waiting() == 1
    with pytest.raises(RequestError) as e:
        q.admit()
    assert e.value.status == 429 and e.value.headers == {"Retry-After": "1"}
    jobs[0].cancelled.set()  # a client gone: its job will be skipped, so it does not hold a place
    q.admit()
    q.discard(jobs[1])
    assert q.waiting() == 0 and len(q) == 2
    none_wait = InFlight(running=1, max_queue=0)
    none_wait.admit()
    none_wait.add(job())
    with pytest.raises(RequestError):
        none_wait.admit()
    InFlight(running=1, max_queue=None).admit()  # no cap


# -- the flags -----------------------------------------------------------------------------------------------

def test_the_flags_reach_the_server_and_bad_ones_are_one_line_errors(monkeypatch, capsys):
    import uvicorn
    from starlette.testclient import TestClient

    from metalgen.cli import main

    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.update(app=app, **kw))
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--max-request-bytes", "100", "--max-queue", "3"]) == 0
    with TestClient(ran["app"]) as c:
        assert c.get("/debug/engine").json()["engine"]["max_queue"] == 3
        r = c.post("/v1/completions", json={"model": "dummy:tiny-qwen3", "prompt": "x" * 100})
        assert r.status_code == 413 and "limit of 100 bytes" in r.json()["error"]["message"]
    capsys.readouterr()
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--max-queue", "-1"]) == 1
    assert capsys.readouterr().err.strip() == "metalgen: error: --max-queue must be >= 0, got -1"
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--max-request-bytes", "0"]) == 1
    assert capsys.readouterr().err.strip() == "metalgen: error: --max-request-bytes must be >= 1, got 0"
