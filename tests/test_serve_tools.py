"""Tool calls (metalgen.serve.tools): the parser alone on any piece-split, the request checks, the chat
template's rendering of tools and tool turns, and the calls through a live server (a scripted engine: the
tiny random model never calls a tool)."""

from __future__ import annotations

import json

import pytest

from metalgen.serve.protocol import RequestError, parse_request
from metalgen.serve.tools import ToolCallParser, forced_prefix, parse_call

from live_server import live_server

CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def parse(pieces, prefix=""):
    """(content joined, [(index, name, arguments)]) of a reply fed in `pieces`."""
    p = ToolCallParser(prefix)
    items = [item for piece in pieces for item in p.feed(piece)] + p.finish()
    content = "".join(v for k, v in items if k == "content")
    calls = [(v.index, v.name, json.loads(v.arguments)) for k, v in items if k == "tool_call"]
    assert len({v.id for k, v in items if k == "tool_call"}) == len(calls)  # ids differ
    return content, calls


def splits(text):
    """The text whole, a character a piece, and cut at every tag boundary's middle."""
    yield [text]
    yield list(text)
    yield [text[i:i + 5] for i in range(0, len(text), 5)]
    yield [text[i:i + 7] for i in range(0, len(text), 7)]


@pytest.mark.parametrize("pieces", list(splits(CALLS)))
def test_calls_streamed_in_any_pieces_parse_the_same(pieces):
    assert parse(pieces) == ("Let me check.", [(0, "get_weather", {"city": "Paris"}), (1, "get_time", {})])


def test_text_without_calls_is_all_content_and_nothing_is_lost():
    text = "A <b>bold</b> claim,\n  with <tool_ or <tool_call without a close and trailing space \n"
    for pieces in splits(text):
        assert parse(pieces) == (text, [])


def test_a_malformed_call_stays_in_the_content():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    assert parse(["Sure: ", bad]) == ("Sure: " + bad, [])
    no_name = '<tool_call>\n{"arguments": {}}\n</tool_call>'
    assert parse([no_name + " then " + CALLS[14:]])[0].startswith(no_name + " then")
    assert parse(['<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'])[1] == []  # arguments not an object
    assert parse_call('{"name": "f", "arguments": "{\\"a\\": 1}"}') == ("f", '{"a": 1}')  # a JSON string of one
    assert parse_call('{"name": "f", "arguments": "not json"}') is None


def test_a_call_left_open_counts_only_if_its_json_is_whole():
    assert parse(['<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n']) == ("", [(0, "f", {"x": 1})])
    cut = '<tool_call>\n{"name": "f", "argu'
    assert parse([cut]) == (cut, [])


def test_a_forced_prefix_parses_as_if_the_model_wrote_it():
    assert parse(['{"city": "Oslo"}}\n</tool_call>'], forced_prefix("get_weather")) == (
        "", [(0, "get_weather", {"city": "Oslo"})])
    assert parse(['{"name": "get_time", "arguments": {}}\n</tool_call>'], forced_prefix()) == (
        "", [(0, "get_time", {})])


def body(**kw):
    return {"model": "t", "messages": [{"role": "user", "content": "x"}], **kw}


def test_tool_choice_decides_what_is_rendered_and_forced():
    req = parse_request(body(tools=TOOLS), "chat", 16)
    assert req.tools == TOOLS and req.tool_prefix == ""
    assert parse_request(body(tools=TOOLS, tool_choice="none"), "chat", 16).tools is None
    assert parse_request(body(tools=TOOLS, tool_choice="required"), "chat", 16).tool_prefix == "<tool_call>\n"
    named = parse_request(body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}),
                          "chat", 16)
    assert named.tool_prefix == '<tool_call>\n{"name": "get_time", "arguments": '
    for bad, param in [(dict(tools="get_weather"), "tools"), (dict(tools=[{"type": "function"}]), "tools"),
                       (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
                       (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
                        "tool_choice")]:
        with pytest.raises(RequestError) as e:
            parse_request(body(**bad), "chat", 16)
        assert e.value.param == param
    with pytest.raises(RequestError) as e:
        parse_request({"model": "t", "prompt": "x", "tools": TOOLS}, "text", 16)
    assert e.value.param == "tools"


TURNS = [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


def test_tools_and_tool_turns_reach_the_qwen_template():
    import metalgen
    from metalgen.serve.engine import Engine

    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    engine = Engine(model, tok, "t", decode="plain")
    req = parse_request({"model": "t", "messages": TURNS, "tools": TOOLS}, "chat", 16)
    assert req.messages[1]["content"] == "" and req.messages[1]["tool_calls"][0]["id"] == "call_1"
    text = tok.decode(engine.encode(req)[0])
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    none = parse_request({"model": "t", "messages": TURNS, "tools": TOOLS, "tool_choice": "none"}, "chat", 16)
    assert "<tools>" not in tok.decode(engine.encode(none)[0])
    forced = parse_request({"model": "t", "messages": TURNS, "tools": TOOLS, "tool_choice": "required"}, "chat", 16)
    assert tok.decode(engine.encode(forced)[0]).endswith("<|im_start|>assistant\n<tool_call>\n")


@pytest.fixture(scope="module")
def scripted():
    """An openai client on a live server whose engine replies with a script chosen by the last message."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    import metalgen
    from metalgen.serve.app import make_app
    from metalgen.serve.engine import Engine
    from metalgen.serve.protocol import usage

    replies = {
        "calls": ["<think>\nweigh", "</think>\n\n", CALLS[:20], CALLS[20:47], CALLS[47:90], CALLS[90:]],
        "bad": ["Hmm <tool_call>\n{\"name\": ", "\"f\", oops}\n</tool_call>"],
        "forced": ['{"city": "Oslo"}}\n</tool', "_call>"],
    }

    class Scripted(Engine):
        def _generate(self, job):
            script = replies[job.req.messages[-1]["content"]]
            for piece in script:
                job.put("text", piece)
            job.put("done", "stop", usage(len(job.ids), len(script), 0))

    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    with live_server(make_app(Scripted(model, tok, "t", decode="plain"))) as port:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


def ask(client, say, **kw):
    return dict(model="t", messages=[{"role": "user", "content": say}], tools=TOOLS, **kw)


def test_the_server_returns_tool_calls_whole(scripted):
    r = scripted.chat.completions.create(**ask(scripted, "calls"))
    msg, c = r.choices[0].message, r.choices[0]
    assert c.finish_reason == "tool_calls" and msg.content == "Let me check."
    assert msg.model_extra["reasoning_content"] == "\nweigh"
    assert [(t.type, t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})]
    assert all(t.id.startswith("call_") for t in msg.tool_calls)


def test_the_server_streams_tool_call_deltas(scripted):
    chunks = list(scripted.chat.completions.create(stream=True, **ask(scripted, "calls")))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        (0, "get_weather", {"city": "Paris"}), (1, "get_time", {})]
    assert all(t.id and t.type == "function" for t in calls)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_malformed_call_and_tool_choice_none_leave_the_text_as_content(scripted):
    r = scripted.chat.completions.create(**ask(scripted, "bad"))
    assert r.choices[0].message.content == 'Hmm <tool_call>\n{"name": "f", oops}\n</tool_call>'
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"
    r = scripted.chat.completions.create(**ask(scripted, "calls", tool_choice="none"))
    assert r.choices[0].message.content == CALLS and not r.choices[0].message.tool_calls


def test_a_named_tool_choice_gets_its_call(scripted):
    r = scripted.chat.completions.create(**ask(scripted, "forced", tool_choice={
        "type": "function", "function": {"name": "get_weather"}}))
    call = r.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo"})
    assert r.choices[0].message.content is None


def test_a_conversation_with_tool_turns_is_accepted(scripted):
    # the openai client sends the assistant's tool-call turn with content null
    r = scripted.chat.completions.create(model="t", messages=TURNS + [{"role": "user", "content": "calls"}],
                                         tools=TOOLS)
    assert r.choices[0].finish_reason == "tool_calls"
