"""Tool calls (metalgen.serve.tools): the parser alone on any piece-split, whole and streamed (the arguments'
fragments as they are written, joined equal to the whole reply's arguments), the canonical JSON writer against
json.dumps(json.loads(...)), the request checks, the chat template's rendering of tools and tool turns, and
the calls through a live server (a scripted engine: the tiny random model never calls a tool)."""

from __future__ import annotations

import json
import random
import time

import pytest

from metalgen.serve.protocol import RequestError, parse_request
from metalgen.serve.tools import CanonicalJson, NotJson, ToolCallParser, forced_prefix, parse_call

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


# a call with a long argument, written as a model may write it (spaces, escapes, a trailing zero)
LONG = ('<tool_call>\n{"name": "run_code", "arguments": {"code": "for i in range(3):\\n    print(\\"h\\u00e9llo\\", i)'
        '  # ' + "x" * 120 + ' </tool_ end", "timeout":1.50, "tags": [ "a","b" ], "opts": {"deep": [1, {"x": null}],'
        ' "emoji": "\\ud83d\\ude00"}}}\n</tool_call>')


def stream_parse(pieces, prefix=""):
    """(content joined, [(index, id, name, arguments joined)], the fragments of each call, the items) of a
    reply fed in `pieces` to a streaming parser."""
    p = ToolCallParser(prefix, stream=True)
    items = [item for piece in pieces for item in p.feed(piece)] + p.finish()
    content = "".join(v for k, v in items if k == "content")
    calls, fragments = {}, {}
    for kind, v in items:
        if kind != "tool_call":
            continue
        d = v.delta()
        if "id" in d:  # a call's first delta: id, type, name (arguments "" where they stream)
            assert d["index"] not in calls and d["type"] == "function"
            calls[d["index"]] = [d["index"], d["id"], d["function"]["name"], d["function"]["arguments"]]
            fragments[d["index"]] = []
        else:
            assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
            calls[d["index"]][3] += d["function"]["arguments"]
            fragments[d["index"]].append(d["function"]["arguments"])
    return content, [tuple(c) for c in calls.values()], fragments, items


@pytest.mark.parametrize("pieces", list(splits(CALLS + "\n" + LONG)))
def test_streamed_arguments_join_to_the_whole_replys(pieces):
    text = "".join(pieces)
    whole = ToolCallParser()
    items = [item for piece in pieces for item in whole.feed(piece)] + whole.finish()
    content, calls, fragments, _ = stream_parse(pieces)
    assert content == "".join(v for k, v in items if k == "content") == "Let me check."
    assert [(i, name, args) for i, _, name, args in calls] == [(c.index, c.name, c.arguments) for c in whole.calls]
    assert calls[2][3] == json.dumps(json.loads(text[text.index('"arguments": {"code"') + 13:text.rindex("}")]),
                                     ensure_ascii=False)  # json.dumps's text: what the whole reply always gave
    if len(pieces) > 1:  # as the pieces come: a long argument in many fragments
        assert len(fragments[2]) > 10 and all(fragments[2])


def test_only_what_may_be_the_closing_tag_is_held_back():
    p = ToolCallParser(stream=True)
    p.feed('<tool_call>\n{"name": "f", "arguments": {"a": "x</tool')
    assert p.calls[0].arguments == '{"a": "x'  # the name went out with the first "{", then every byte read
    p.feed('_c')
    assert p.calls[0].arguments == '{"a": "x'
    p.feed('box", "n": 12')
    assert p.calls[0].arguments == '{"a": "x</tool_cbox", "n": '  # a number is written once it ends
    items = p.feed('}}\n</tool_call>')
    assert p.calls[0].arguments == '{"a": "x</tool_cbox", "n": 12}' and p.finish() == []
    assert [v.delta()["function"]["arguments"] for _, v in items] == ["12}"]


def test_a_streamed_call_that_breaks_keeps_what_was_sent():
    """Streamed, a call stays a call once its arguments began; the text from where its JSON broke is content.
    Whole, the call is content as written, as before."""
    bad = '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": tru}}\n</tool_call>'
    content, calls, _, _ = stream_parse(["Sure: ", bad[:30], bad[30:]])
    assert [(name, args) for _, _, name, args in calls] == [("f", '{"a": 1, "b": ')]
    assert content == "Sure:tru}}\n</tool_call>"  # (the space before a call is dropped, as ever)
    assert parse(["Sure: ", bad]) == ("Sure: " + bad, [])
    cut = '<tool_call>\n{"name": "f", "arguments": {"a": "abc'  # the reply ran out of tokens here
    content, calls, _, _ = stream_parse([cut])
    assert (content, calls[0][2:]) == ("", ("f", '{"a": "abc'))
    # shapes that do not stream come whole at the closing tag, as whole replies have them
    for body in ['{"arguments": {"a": 1}, "name": "f"}', '{"name": "f", "arguments": "{\\"a\\": 1}"}',
                 '{"name": "f"}']:
        content, calls, fragments, _ = stream_parse(["<tool_call>", body, "</tool_call>"])
        assert calls[0][2:] == ("f", parse_call(body)[1]) and fragments[0] == [] and content == ""


def _random_value(rng, depth=0):
    k = rng.randrange(8 if depth < 3 else 4)
    if k == 0:
        return rng.choice([0, -7, 10**20, 1.5, -0.0, 1e300, 1e-7, True, False, None])
    if k == 1:
        return "".join(rng.choice(['a', 'é', '"', '\\', '\n', '\x01', '😀', '\ud83d', '/', '中']) for _ in range(4))
    if k in (2, 3):
        return rng.randrange(100)
    if k in (4, 5):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {str(_random_value(rng, 3)): _random_value(rng, depth + 1) for _ in range(rng.randrange(3))}


def _written(rng, v) -> str:
    """`v` as JSON text, written in one of the many ways json.loads reads: spaces, escapes, number forms."""
    ws = lambda: rng.choice(["", "", " ", "\n  ", "\t"])  # noqa: E731
    if isinstance(v, dict):
        return "{" + ws() + ",".join(ws() + _written(rng, k) + ws() + ":" + ws() + _written(rng, x) + ws()
                                    for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ws() + ("," + ws()).join(_written(rng, x) for x in v) + ws() + "]"
    if isinstance(v, str):
        return '"' + "".join("\\u%04X" % ord(c) if ord(c) < 0x10000 and (c < " " or c in '"\\' or rng.random() < 0.2)
                             else json.dumps(c)[1:-1] for c in v) + '"'
    if isinstance(v, float) and rng.random() < 0.5:
        return "%.17e" % v
    return json.dumps(v)


def canonical(text: str) -> str:
    out = []
    w = CanonicalJson(lambda path, piece: out.append(piece))
    w.feed(text + " ")  # (a number at the top ends at the space)
    if not w.done:
        raise NotJson("unfinished")
    return "".join(out)


def test_the_canonical_writer_is_json_dumps_of_json_loads():
    rng = random.Random(0)
    for _ in range(1500):
        text = _written(rng, _random_value(rng))
        if rng.random() < 0.5:  # a character changed: refused where json.loads refuses it
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice(["", ",", "}", "]", '"', "\\", "x", "0", "-", ".", "e", "\x00"]) + text[i + 1:]
        try:
            expected = json.dumps(json.loads(text), ensure_ascii=False)
        except ValueError:
            expected = None
        try:
            got = canonical(text)
        except NotJson:
            got = None
        assert got == expected, text
    assert canonical('{"a":1.50,"b":[1E2,-0,"\\ud83d\\ude00\\ud800x"],"c":NaN,"d":-Infinity}') == (
        '{"a": 1.5, "b": [100.0, 0, "😀\ud800x"], "c": NaN, "d": -Infinity}')


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
        "long": ["Running it. "] + [LONG[i:i + 6] for i in range(0, len(LONG), 6)],
    }

    class Scripted(Engine):
        def _generate(self, job):
            script = replies[job.req.messages[-1]["content"]]
            for piece in script:
                job.put("text", piece)
                # a token's time: what queues while the handler is busy goes out as one chunk (choices.Choice)
                time.sleep(0.002)
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


def streamed_calls(chunks):
    """(content, {index: [id, type, name, arguments joined]}, {index: argument fragments}) of a streamed chat
    answer, as a client puts OpenAI's tool-call deltas together."""
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls, fragments = {}, {}
    for t in [t for d in deltas for t in d.tool_calls or []]:
        if t.id is not None:  # the first delta of a call: its id, type and name, and no arguments yet
            assert t.index not in calls and t.function.arguments == ""
            calls[t.index], fragments[t.index] = [t.id, t.type, t.function.name, ""], []
        else:
            assert t.function.name is None
            calls[t.index][3] += t.function.arguments
            fragments[t.index].append(t.function.arguments)
    return "".join(d.content or "" for d in deltas), calls, fragments


def test_the_server_streams_tool_call_deltas(scripted):
    chunks = list(scripted.chat.completions.create(stream=True, **ask(scripted, "calls")))
    content, calls, _ = streamed_calls(chunks)
    assert content == "Let me check."
    assert [(i, name, json.loads(args)) for i, (_, _, name, args) in calls.items()] == [
        (0, "get_weather", {"city": "Paris"}), (1, "get_time", {})]
    assert all(c[0].startswith("call_") and c[1] == "function" for c in calls.values())
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_streamed_arguments_come_as_written_and_join_to_the_whole_answers(scripted):
    whole = scripted.chat.completions.create(**ask(scripted, "long")).choices[0]
    chunks = list(scripted.chat.completions.create(stream=True, **ask(scripted, "long")))
    content, calls, fragments = streamed_calls(chunks)
    assert content == whole.message.content == "Running it."
    call = whole.message.tool_calls[0]
    assert calls[0][2:] == ["run_code", call.function.arguments]  # exactly the whole answer's string
    assert json.loads(call.function.arguments)["code"].startswith('for i in range(3):\n    print("héllo", i)')
    assert len(fragments[0]) > 10  # as the model wrote them, not in one piece
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    forced = scripted.chat.completions.create(stream=True, **ask(scripted, "forced", tool_choice={
        "type": "function", "function": {"name": "get_weather"}}))
    assert streamed_calls(list(forced))[1][0][2:] == ["get_weather", '{"city": "Oslo"}']


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
