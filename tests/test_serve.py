"""`metalgen serve` against the official openai client, on a live server over a tiny model (CPU)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import metalgen  # noqa: E402
from metalgen.serve.app import make_app  # noqa: E402
from metalgen.serve.engine import Engine  # noqa: E402
from live_server import live_server  # noqa: E402

NAME = "tiny"


@pytest.fixture(scope="module", params=[1, 4], ids=["one-at-a-time", "batched"])
def served(request):
    """(base url, model, tokenizer, engine) of a server on a free port, for the module: every test runs
    against one serving a request at a time (max_batch 1) and one batching them (max_batch 4)."""
    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    # one at a time: the stacked prompt cache, as a GPU would serve; a batch takes the plain path
    engine = Engine(model, tok, NAME, decode="reference", max_batch=request.param)
    with live_server(make_app(engine, 16)) as port:
        yield f"http://127.0.0.1:{port}", model, tok, engine


@pytest.fixture()
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="none", max_retries=0)


def greedy(model, tok, ids, n, stop=()):
    return "".join(r.text for r in metalgen.stream_generate(model, tok, ids, max_tokens=n, stop_strings=stop))


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(served[0] + "/health").json()["status"] == "ok"


def test_chat_completion_is_the_engines_greedy_answer(served, client):
    _, model, tok, engine = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert r.choices[0].message.content == greedy(model, tok, ids, 8)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens == len(ids)
    # the next turn reuses the cached prefix (the system prompt and the first turn)
    messages += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "More"}]
    r2 = client.chat.completions.create(model=NAME, messages=messages, max_tokens=4, temperature=0)
    ids2 = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert r2.choices[0].message.content == greedy(model, tok, ids2, 4)
    # one at a time, the reused prompt cache; batched, the prefix cache (the first turn's prompt went in when
    # its prefill ended, its reply when it finished)
    assert r2.usage.prompt_tokens_details.cached_tokens >= len(ids) - 1
    if engine.max_batch > 1:
        assert engine.prefix_cache.match(ids2) >= len(ids)


def test_streamed_chat_with_usage_equals_the_whole_answer(client):
    messages = [{"role": "user", "content": "Stream this"}]
    whole = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0)
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_text_completion_and_stop(served, client):
    _, model, tok, _ = served
    full = greedy(model, tok, tok.encode("Once upon"), 12)
    assert client.completions.create(model=NAME, prompt="Once upon", max_tokens=12, temperature=0).choices[0].text == full
    stop = full[3:6] if len(full) >= 6 else None
    if stop:
        r = client.completions.create(model=NAME, prompt="Once upon", max_tokens=12, temperature=0, stop=[stop])
        assert r.choices[0].finish_reason == "stop" and r.choices[0].text == full[:full.index(stop)]


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model=NAME, messages=[{"role": "user", "content": "Pick"}], max_tokens=8, temperature=1.0, top_p=0.9)
    a = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    assert a == b


def reference(model, tok, ids, n, top=0, **kw):
    """The greedy tokens of `ids` alone, with their logprobs and top alternatives (metalgen.stream_generate)."""
    return [r for r in metalgen.stream_generate(model, tok, ids, max_tokens=n, top_logprobs=top, **kw)
            if r.token not in tok.eos_token_ids]


def test_chat_logprobs_are_the_tokens_and_their_alternatives(served, client):
    _, model, tok, _ = served
    messages = [{"role": "user", "content": "Logprobs"}]
    kw = dict(model=NAME, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    ref = reference(model, tok, tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True), 6, 3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == len(ref)
    assert bytes(b for e in entries for b in e.bytes).decode() == r.choices[0].message.content
    for e, want in zip(entries, ref):
        assert e.token == tok.decode([want.token]) and e.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert [t.token for t in e.top_logprobs] == [tok.decode([i]) for i, _ in want.top_logprobs]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx([v for _, v in want.top_logprobs], abs=1e-4)
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)  # greedy: the likeliest
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    # the streamed request meets the first one's prompt in the prefix cache, so its last prompt token is fed
    # alone: the same tokens, their logprobs equal on the CPU and within a GEMV's rounding of a GEMM's on CUDA
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-5)
    plain = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == r.choices[0].message.content


def test_text_completion_logprobs(served, client):
    _, model, tok, _ = served
    r = client.completions.create(model=NAME, prompt="Once upon", max_tokens=5, temperature=0, logprobs=2)
    lp, ref = r.choices[0].logprobs, reference(model, tok, tok.encode("Once upon"), 5, 2)
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.tokens) == len(ref)
    assert lp.token_logprobs == pytest.approx([x.logprob for x in ref], abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert [list(d) for d in lp.top_logprobs] == [[tok.decode([i]) for i, _ in x.top_logprobs] for x in ref]
    chunks = list(client.completions.create(model=NAME, prompt="Once upon", max_tokens=5, temperature=0,
                                            logprobs=2, stream=True))
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == lp.tokens


def test_n_choices_are_the_seeded_single_answers(client):
    kw = dict(model=NAME, messages=[{"role": "user", "content": "Pick"}], max_tokens=6, temperature=1.0)
    r = client.chat.completions.create(n=3, seed=11, **kw)
    alone = [client.chat.completions.create(seed=11 + i, **kw).choices[0].message.content for i in range(3)]
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == alone and len(set(alone)) > 1
    assert r.usage.completion_tokens == 18 and r.usage.prompt_tokens == client.chat.completions.create(
        seed=1, **kw).usage.prompt_tokens
    chunks = list(client.chat.completions.create(n=3, seed=11, stream=True, stream_options={"include_usage": True},
                                                 **kw))
    texts = ["", "", ""]
    for c in chunks[:-1]:
        texts[c.choices[0].index] += c.choices[0].delta.content or ""
    assert texts == alone and chunks[-1].usage.completion_tokens == 18
    assert sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason) == [0, 1, 2]


def test_n_choices_prefill_the_prompt_once(served, client):
    """n=3 feeds the prompt through the model once (the engine's prefilled_tokens): batched, the three rows
    share one prefill; one at a time, each later choice starts from the prompt's KV the one before left, and
    only the prompt's last token is fed again (its logits give the choice's first token). Each choice's
    tokens are those of an n=1 request with its seed; streamed, each chunk carries its choice's index."""
    url, _, tok, engine = served
    prompt = "Three choices of one prompt, long enough that feeding it three times would show: " * 3
    n_ids = len(tok.encode(prompt))
    kw = dict(model=NAME, prompt=prompt, max_tokens=5, temperature=1.0, logprobs=0)
    extra = 0 if engine.max_batch > 1 else 2  # one at a time: the last prompt token, again for choices 1, 2

    def fed(**more):
        before = httpx.get(url + "/debug/engine").json()["engine"]["prefilled_tokens"]
        r = client.completions.create(**kw, **more)
        after = httpx.get(url + "/debug/engine").json()["engine"]["prefilled_tokens"]
        return r, after - before

    r, delta = fed(n=3, seed=21)
    cached = r.usage.prompt_tokens_details.cached_tokens  # what an earlier request's prompt shares with it
    assert r.usage.prompt_tokens == n_ids and cached < 10 < n_ids
    assert delta == n_ids - cached + extra
    alone = []
    for i in range(3):
        one, delta = fed(seed=21 + i)
        assert delta == 1  # held (the reused cache or the prefix cache): its last token is fed again
        alone.append(one.choices[0].logprobs.tokens)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.logprobs.tokens for c in r.choices] == alone and len(set(map(tuple, alone))) == 3
    # streamed, with a prompt not held yet
    kw["prompt"] = "Streamed: " + prompt
    before = httpx.get(url + "/debug/engine").json()["engine"]["prefilled_tokens"]
    chunks = list(client.completions.create(n=3, seed=21, stream=True, stream_options={"include_usage": True}, **kw))
    delta = httpx.get(url + "/debug/engine").json()["engine"]["prefilled_tokens"] - before
    cached = chunks[-1].usage.prompt_tokens_details.cached_tokens
    chunks = chunks[:-1]
    streamed = [[], [], []]
    for c in chunks:
        if c.choices[0].logprobs:
            streamed[c.choices[0].index] += c.choices[0].logprobs.tokens
    want = [client.completions.create(seed=21 + i, **kw).choices[0].logprobs.tokens for i in range(3)]
    assert streamed == want
    assert delta == len(tok.encode(kw["prompt"])) - cached + extra
    assert sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason) == [0, 1, 2]


def test_presence_and_frequency_penalties(served, client):
    from metalgen.sampling import PresenceFrequencyPenalty

    _, model, tok, _ = served
    ids = tok.encode("Repeat")
    r = client.completions.create(model=NAME, prompt="Repeat", max_tokens=10, temperature=0, presence_penalty=0.5,
                                  frequency_penalty=1.5)
    want = greedy_with(model, tok, ids, 10, [PresenceFrequencyPenalty(0.5, 1.5, len(ids))])
    assert r.choices[0].text == want and want != greedy(model, tok, ids, 10)  # (the tiny model repeats itself)


def greedy_with(model, tok, ids, n, processors):
    return "".join(r.text for r in metalgen.stream_generate(model, tok, ids, max_tokens=n,
                                                            logits_processors=processors))


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    (json.dumps({"model": "other", "messages": [{"role": "user", "content": "x"}]}), 404, "model"),
    (json.dumps({"model": NAME, "messages": []}), 400, "messages"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}), 400,
     "temperature"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "n": 0}), 400, "n"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "n": 9}), 400, "n"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                 "top_logprobs": 30}), 400, "top_logprobs"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}), 400,
     "top_logprobs"),  # without logprobs: true
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "tools": {"type": "function"}}),
     400, "tools"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {
            "name": "g"}}}), 400, "tool_choice"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}), 400,
     "tool_choice"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x"}], "presence_penalty": 3}), 400,
     "presence_penalty"),
    (json.dumps({"model": NAME, "messages": [{"role": "user", "content": "x " * 3000}]}), 400, "messages"),
])
def test_bad_requests_get_openai_errors(served, body, status, param):
    r = httpx.post(served[0] + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and "\n" not in err["message"]


def test_the_client_sees_errors_as_exceptions(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_a_closed_stream_stops_its_generation_and_the_server_goes_on(served, client):
    with httpx.stream("POST", served[0] + "/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "user", "content": "Long"}], "max_tokens": 2000, "stream": True,
            "temperature": 0}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # the connection closes here, after the first chunk
    tic = time.perf_counter()
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Next"}], max_tokens=2,
                                       temperature=0)
    assert r.choices[0].message.content is not None
    assert time.perf_counter() - tic < 20  # not behind 2000 tokens of the closed stream


def test_concurrent_requests_each_get_the_answer_they_get_alone(served, client):
    """Requests sent together (one streamed) while a long stream runs: each answer is the one it gets
    alone; batched, they joined the running stream's batch, which its client then leaves."""
    url, model, tok, engine = served
    prompts = ["Once upon", "The sea is wide and", "Hello", "A longer prompt about the weather in the hills"]
    lengths = [12, 5, 9, 7]
    long = None
    if engine.max_batch > 1:  # (one at a time, the others would wait behind it)
        long = httpx.stream("POST", url + "/v1/completions", json={
            "model": NAME, "prompt": "Long", "max_tokens": 2000, "stream": True, "temperature": 0})
        lines = long.__enter__().iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))

    def ask(i):
        kw = dict(model=NAME, prompt=prompts[i], max_tokens=lengths[i], temperature=0)
        if i == 1:
            return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
        return client.completions.create(**kw).choices[0].text

    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            texts = list(pool.map(ask, range(len(prompts))))
    finally:
        if long is not None:
            long.__exit__(None, None, None)
    assert texts == [greedy(model, tok, tok.encode(p), n) for p, n in zip(prompts, lengths)]
    if long is not None:
        assert engine.peak_batch >= 2
    r = client.completions.create(model=NAME, prompt="After", max_tokens=3, temperature=0)
    assert r.choices[0].text == greedy(model, tok, tok.encode("After"), 3)


def test_serve_command_bad_flags_are_one_line_errors(capsys):
    from metalgen.cli import main

    assert main(["serve", "--model", "dummy:tiny-qwen3", "--port", "70000"]) == 1
    assert capsys.readouterr().err.strip() == "metalgen: error: --port must be in 0..65535, got 70000"
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--max-tokens", "0"]) == 1
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--max-batch", "0"]) == 1
    assert capsys.readouterr().err.strip().endswith("--max-batch must be >= 1, got 0")
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--prefix-cache-gb", "-1"]) == 1
    assert capsys.readouterr().err.strip().endswith("--prefix-cache-gb must be >= 0, got -1.0")
    assert main(["serve", "--model", "dummy:tiny-qwen3", "--prefill-step-size", "0"]) == 1
    assert capsys.readouterr().err.strip().endswith("--prefill-step-size must be >= 1, got 0")


def test_limits_name_their_field_and_bound():
    from metalgen.serve.protocol import RequestError, parse_request

    body = {"model": NAME, "messages": [{"role": "user", "content": "x"}]}
    assert parse_request(dict(body, max_completion_tokens=5, max_tokens=9), "chat", 16).max_tokens == 5
    assert parse_request(body, "chat", 16).max_tokens == 16
    with pytest.raises(RequestError, match="'max_tokens' must be at least 1, got 0") as e:
        parse_request(dict(body, max_tokens=0), "chat", 16)
    assert e.value.param == "max_tokens"
    with pytest.raises(RequestError, match="'top_p' must be between 0.0 and 1.0, got 2"):
        parse_request(dict(body, top_p=2), "chat", 16)


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_hybrid_models_n_choices_prefill_the_prompt_once(max_batch):
    """A hybrid stack, whose cache cannot be trimmed. One at a time it keeps a checkpoint at the prompt but
    its last token, so choices 1 and 2 of n=3 resume there and feed only that token again; batched, the
    three choices share one prefill. Either way a later request with the prompt is fed its last token only
    (batched, from the prefix cache's snapshot of the states there). Each choice is the n=1 request with its
    seed, and the usage says what was cached."""
    model, tok = metalgen.load("dummy:tiny-qwen3.5", dtype="float32")
    engine = Engine(model, tok, NAME, decode="plain", max_batch=max_batch)
    assert engine.max_batch == max_batch and (engine.prefix_cache is None) == (max_batch == 1)
    with live_server(make_app(engine, 16)) as port:
        url = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        kw = dict(model=NAME, prompt="Three choices of one hybrid prompt, long enough to show a second feed. " * 2,
                  max_tokens=4, temperature=1.0, logprobs=0)
        n_ids = len(tok.encode(kw["prompt"]))

        def fed(**more):
            before = httpx.get(url + "/debug/engine").json()["engine"]["prefilled_tokens"]
            r = client.completions.create(**kw, **more)
            return r, httpx.get(url + "/debug/engine").json()["engine"]["prefilled_tokens"] - before

        r, delta = fed(n=3, seed=5)
        assert delta == (n_ids + 2 if max_batch == 1 else n_ids) and r.usage.prompt_tokens_details.cached_tokens == 0
        alone = []
        for i in range(3):
            one, delta = fed(seed=5 + i)
            assert delta == 1 and one.usage.prompt_tokens_details.cached_tokens == n_ids - 1
            alone.append(one.choices[0].logprobs.tokens)
        assert [c.logprobs.tokens for c in r.choices] == alone and len(set(map(tuple, alone))) > 1


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_profiled_engine_traces_its_generation(max_batch):
    """`metalgen serve --profile`: the engine's tracer gets the generation's phases; batched, also each step's
    delivery of its tokens (as many rows as the batch held)."""
    import io

    from profiling import Tracer

    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    buf = io.StringIO()
    engine = Engine(model, tok, NAME, decode="reference", max_batch=max_batch, tracer=Tracer(buf))
    with live_server(make_app(engine, 16)) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda p: client.completions.create(model=NAME, prompt=p, max_tokens=5, temperature=0),
                          ["One prompt", "And another one"]))
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    phases = {e["phase"] for e in events}
    assert {"prefill", "readback"} <= phases
    delivered = [e["rows"] for e in events if e["phase"] == "deliver"]
    if max_batch == 1:
        assert not delivered
    else:
        assert "decode_step" in phases and sum(delivered) == 10 and max(delivered) <= 2


def test_a_rounds_events_reach_the_handlers_loop_in_one_call_in_order():
    import asyncio

    from metalgen.serve.engine import JobEvents, Outbox

    loop = asyncio.new_event_loop()
    try:
        calls = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: (calls.append(args), real(*args))[1]
        a, b = JobEvents(loop), JobEvents(loop)
        box = Outbox()
        for job, event in [(a, ("text", "x")), (b, ("text", "y")), (a, ("done", "stop", {}))]:
            box.put(job, event)
        assert calls == []  # nothing reaches the loop before the round ends
        box.flush()
        assert len(calls) == 1 and box.pending == []
        loop.run_until_complete(asyncio.sleep(0))
        assert [a.events.get_nowait() for _ in range(2)] == [("text", "x"), ("done", "stop", {})]
        assert b.events.get_nowait() == ("text", "y") and b.events.empty()
    finally:
        loop.close()


def test_a_choice_sends_the_text_queued_meanwhile_as_one_piece():
    # a handler that fell behind the engine: one chunk for the tokens it missed, then each as it comes
    import asyncio
    import types

    from metalgen.serve.choices import Choice
    from metalgen.serve.engine import JobEvents
    from metalgen.serve.protocol import parse_request

    async def run():
        job = JobEvents(asyncio.get_running_loop())
        job.req, job.in_reasoning = parse_request({"model": "t", "prompt": "hi"}, "text", 16), False
        for event in [("text", "a"), ("text", "b"), ("text", "c")]:
            job.events.put_nowait(event)
        items = Choice(0, job, types.SimpleNamespace()).items()
        first = await items.__anext__()
        job.events.put_nowait(("text", "d"))
        second = await items.__anext__()
        job.events.put_nowait(("done", "stop", {"n": 1}))
        return [first, second] + [item async for item in items]

    assert asyncio.run(run()) == [("piece", "content", "abc"), ("piece", "content", "d"), ("done", "stop", {"n": 1})]
