"""Structured output (metalgen.structured): the schema subset, the byte automaton, and the token masks on
the real Qwen3 vocabulary."""

from __future__ import annotations

import json
import random
import time

import mlx.core as mx
import numpy as np
import pytest

from metalgen.errors import MetalgenError
from metalgen.serve.protocol import RequestError, parse_request
from metalgen.structured import Grammar, JsonConstraint, SchemaError, compile_schema, grammar, json_object, token_index

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"], "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    "score": {"type": ["number", "null"]}, "kind": {"enum": ["a", "b", 3]}}}


def schema(s) -> Grammar:
    return Grammar(compile_schema(s))


@pytest.mark.parametrize("text", [
    '{"name": "Al", "age": 3}', '{"age":-3,"name":""}', '{"name": "é😀x", "age": 0, "tags": ["a"], "score": null}',
    '{"name": "a\\"b\\\\\\u00e9", "age": 1, "score": -1.5e+3, "kind": 3}', '{"kind": "b", "age": 12, "name": "x",'
    ' "tags": ["", "y"], "score": 0.25}',
])
def test_person_accepts(text):
    assert schema(PERSON).accepts(text.encode())
    json.loads(text)  # (and the texts are JSON)


@pytest.mark.parametrize("text, why", [
    ('{"name": "Al"}', "required age missing"), ('{"age": 3}', "required name missing"),
    ('{"name": "Al", "age": 3, "x": 1}', "undeclared key"), ('{"name": "Al", "age": 3,}', "trailing comma"),
    ('{"name": "Al", "age": 3.5}', "integer with a fraction"), ('{"name": "Al", "age": 03}', "leading zero"),
    ('{"name": "123456789", "age": 1}', "past maxLength"), ('{"name": "Al", "age": 1, "tags": []}', "minItems"),
    ('{"name": "Al", "age": 1, "tags": ["a", "b", "c"]}', "maxItems"), ('{"name":  "Al", "age": 1}', "two spaces"),
    ('{"name":\n"Al", "age": 1}', "newline"), ('{ "name": "Al", "age": 1}', "space after {"),
    ('{"name": "A\tl", "age": 1}', "raw tab in a string"), ('{"name": "Al", "age": 1, "kind": "c"}', "not in enum"),
    ('{"name": "Al", "name": "B", "age": 1}', "repeated key"), ('{"name": "\\x", "age": 1}', "bad escape"),
    ('{"name": "Al", "age": 1}x', "text after the value"), ('{"name": "Al", "age": 1, "score": true}', "wrong type"),
])
def test_person_rejects(text, why):
    assert not schema(PERSON).accepts(text.encode()), why


def test_every_byte_prefix_of_a_valid_text_is_a_valid_prefix_and_no_more():
    g = schema(PERSON)
    data = '{"name": "日本😀", "age": 42, "tags": ["\\ud83d\\ude00"]}'.encode()
    assert g.accepts(data)
    for i in range(len(data)):  # a token may end anywhere, inside a UTF-8 character or an escape included
        assert g.accepts_prefix(data[:i]) and not g.accepts(data[:i]), data[:i]


@pytest.mark.parametrize("data, ok", [
    (b'"\\ud83d\\ude00"', True), (b'"\\uD83D\\uDE00"', True), (b'"\\u00e9\\u0000"', True),
    (b'"\\ud83d"', False), (b'"\\ud83dx"', False), (b'"\\ude00"', False), (b'"\\ud83d\\u0041"', False),
    (b'"\\u12g4"', False), ('"\u00e9"'.encode(), True), (b'"\xc3"', False), (b'"\xc0\x80"', False),
    (b'"\xed\xa0\x80"', False), (b'"\xf4\x90\x80\x80"', False), (b'"\xe0\x80\x80"', False), (b'"\x80"', False),
])
def test_strings_unicode_escapes_and_utf8(data, ok):
    g = schema({"type": "string"})
    assert g.accepts(data) == ok
    if ok:
        json.loads(data)


def test_max_length_counts_characters_and_surrogate_pairs_once():
    g = schema({"type": "string", "minLength": 2, "maxLength": 2})
    assert g.accepts('"é😀"'.encode()) and g.accepts(b'"\\ud83d\\ude00x"') and g.accepts(b'"\\n\\""')
    assert not g.accepts(b'"abc"') and not g.accepts(b'"a"') and not g.accepts_prefix(b'"abc')


def test_numbers_literals_arrays_and_any_of():
    num, integer = schema({"type": "number"}), schema({"type": "integer"})
    for ok in (b"0", b"-0", b"12", b"1.5", b"-0.25e-7", b"3E+2"):
        assert num.accepts(ok), ok
    for bad in (b"01", b"1.", b".5", b"1e", b"+1", b"--1", b"1.5.5"):
        assert not num.accepts(bad), bad
    assert integer.accepts(b"-17") and not integer.accepts_prefix(b"1.") and not integer.accepts_prefix(b"1e")
    assert not num.accepts_prefix(b"1" * 16)  # digits are bounded: a model must come to an end
    enum = schema({"enum": [1, 12, "x", None, {"a": [1]}]})
    assert all(enum.accepts(t) for t in (b"1", b"12", b'"x"', b"null", b'{"a":[1]}'))
    assert not enum.accepts(b"2") and not enum.accepts(b"123")
    inside = schema({"type": "array", "items": {"enum": [1, 12]}})
    assert inside.accepts(b"[1, 12,1]") and not inside.accepts(b"[13]")
    union = schema({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                              {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "null"}}}]})
    assert union.accepts(b'{"a": 1}') and union.accepts(b'{"a": "s", "b": null}') and union.accepts(b"{}")
    assert not union.accepts(b'{"a": 1, "b": null}')
    assert schema({"type": "array", "maxItems": 0}).accepts(b"[]")
    assert not schema({"type": "array", "maxItems": 0}).accepts_prefix(b"[1")
    assert schema({"type": "boolean"}).accepts(b"false") and not schema({"type": "null"}).accepts(b"nul")


def test_json_object_takes_any_object_and_only_objects():
    g = Grammar(json_object())
    text = json.dumps({"a": [1, {"b": None, "c": [True, "x\u00e9"]}], "d": -1.5, "": {}})
    assert g.accepts(text.encode()) and g.accepts(json.dumps(json.loads(text), separators=(",", ":")).encode())
    assert not g.accepts(b"[1]") and not g.accepts(b'"x"') and not g.accepts(b"1") and not g.accepts(b'{"a"}')


@pytest.mark.parametrize("bad, word", [
    ({"type": "string", "pattern": "a(?=b)"}, "lookaround"), ({"type": "string", "format": "duration"}, "format"),
    ({"$ref": "#/x"}, "$ref"), ({"type": "integer", "minimum": 2, "maximum": 1}, "bounds"), ({"oneOf": [{}]}, "oneOf"),
    ({"type": "object", "properties": {"a": {"type": "xml"}}}, "type"), ("nope", "must be an object"),
    ({"type": "object", "properties": {}, "required": ["a"]}, "required"), ({"enum": []}, "enum"),
    ({"type": "string", "maxLength": -1}, "maxLength"),
])
def test_unsupported_or_invalid_schemas_are_refused(bad, word):
    with pytest.raises(SchemaError) as e:
        compile_schema(bad)
    assert word in str(e.value) and "\n" not in str(e.value)


# -- $ref ------------------------------------------------------------------------------------------------------

# what Pydantic writes for nested models (model_json_schema()): $defs, $ref with a sibling description, a
# recursive model, Optional as anyOf [$ref, null], and constr / conint / datetime fields
PYDANTIC = {
    "$defs": {
        "Addr": {"properties": {"street": {"title": "Street", "type": "string", "maxLength": 20},
                                "zip": {"pattern": "^\\d{5}$", "title": "Zip", "type": "string"}},
                 "required": ["street", "zip"], "title": "Addr", "type": "object"},
        "Node": {"properties": {"v": {"title": "V", "type": "integer", "minimum": 0},
                                "kids": {"default": [], "items": {"$ref": "#/$defs/Node"}, "title": "Kids",
                                         "type": "array"}},
                 "required": ["v"], "title": "Node", "type": "object"}},
    "properties": {
        "home": {"$ref": "#/$defs/Addr", "description": "where"},
        "other": {"anyOf": [{"$ref": "#/$defs/Addr"}, {"type": "null"}], "default": None},
        "tree": {"$ref": "#/$defs/Node"},
        "at": {"format": "date-time", "title": "At", "type": "string"},
        "age": {"exclusiveMaximum": 150, "minimum": 0, "title": "Age", "type": "integer"}},
    "required": ["home", "tree", "at", "age"], "title": "P", "type": "object"}


@pytest.mark.parametrize("text, ok", [
    ('{"home": {"street": "Main", "zip": "12345"}, "tree": {"v": 1}, "at": "2024-01-01T00:00:00Z", "age": 3}', True),
    ('{"home": {"street": "M", "zip": "12345"}, "other": null, "tree": {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]},'
     ' {"v": 0}]}, "at": "2024-01-01T00:00:00Z", "age": 149}', True),
    ('{"other": {"zip": "00000", "street": ""}, "home": {"street": "M", "zip": "12345"}, "tree": {"v": 1, "kids": []},'
     ' "at": "2024-01-01T00:00:00+01:00", "age": 0}', True),
    ('{"home": {"street": "Main", "zip": "1234"}, "tree": {"v": 1}, "at": "2024-01-01T00:00:00Z", "age": 3}', False),
    ('{"home": {"street": "Main", "zip": "12345"}, "tree": {"v": 1, "kids": [{"v": -2}]}, "at": "2024-01-01T00:00:00Z",'
     ' "age": 3}', False),  # the recursive model's bound, two levels down
    ('{"home": {"street": "Main", "zip": "12345"}, "tree": {"v": 1, "kids": [{}]}, "at": "2024-01-01T00:00:00Z",'
     ' "age": 3}', False),  # its required key
    ('{"home": {"street": "Main", "zip": "12345"}, "tree": {"v": 1}, "at": "2024-01-01", "age": 3}', False),
    ('{"home": {"street": "Main", "zip": "12345"}, "tree": {"v": 1}, "at": "2024-01-01T00:00:00Z", "age": 150}', False),
    ('{"home": {"street": "Main", "zip": "12345"}, "other": {"street": "x"}, "tree": {"v": 1}, '
     '"at": "2024-01-01T00:00:00Z", "age": 1}', False),
])
def test_pydantic_nested_schema_with_defs(text, ok):
    assert schema(PYDANTIC).accepts(text.encode()) == ok
    if ok:
        json.loads(text)


def test_refs_definitions_pointers_and_recursion():
    linked = {"definitions": {"list": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["v", "next"],
              "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/definitions/list"}}}]}},
              "$ref": "#/definitions/list"}
    g = schema(linked)
    assert g.accepts(b'{"v": 1, "next": {"v": 2, "next": null}}') and g.accepts(b"null")
    assert not g.accepts(b'{"v": 1, "next": {"v": 2}}') and not g.accepts(b'{"v": 1}')
    deep = b'{"v": 1, "next": ' * 30 + b"null" + b"}" * 30
    assert g.accepts(deep) and not g.accepts(deep[:-1])
    tree = schema({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}})  # the root
    assert tree.accepts(b'{"kids": [{}, {"kids": [{"kids": []}]}]}') and not tree.accepts(b'{"kids": [1]}')
    odd = schema({"$defs": {"a/b": {"type": "integer"}, "c%d": {"const": "x"}},
                  "type": "array", "items": {"anyOf": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c%25d"}]}})
    assert odd.accepts(b'[1, "x"]') and not odd.accepts(b'["y"]')
    shared = compile_schema({"$defs": {"A": {"type": "string", "maxLength": 1}}, "type": "object",
                             "properties": {"x": {"$ref": "#/$defs/A"}, "y": {"$ref": "#/$defs/A"}}})
    assert shared.props[b'"x"'] is shared.props[b'"y"']  # compiled once


def test_what_cannot_finish_is_never_started():
    """A recursive $ref can make a branch no finite value comes out of: it is pruned, so that the automaton
    never enters a state it cannot complete."""
    endless = {"type": "object", "properties": {"x": {"$ref": "#/$defs/inf"}}, "required": ["x"]}
    g = schema({"$defs": {"inf": endless}, "type": "array",
                "items": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/inf"}]}})
    assert g.accepts(b"[null, null]") and not g.accepts_prefix(b"[{")
    g = schema({"$defs": {"inf": endless}, "type": "object", "properties": {"a": {"$ref": "#/$defs/inf"},
                                                                           "b": {"type": "null"}}})
    assert g.accepts(b'{"b": null}') and not g.accepts_prefix(b'{"a')
    g = schema({"$defs": {"inf": endless}, "type": "array", "items": {"$ref": "#/$defs/inf"}})
    assert g.accepts(b"[]") and not g.accepts_prefix(b"[{")
    with pytest.raises(SchemaError) as e:
        compile_schema({"$defs": {"inf": endless}, "$ref": "#/$defs/inf"})
    assert "finite" in str(e.value)


@pytest.mark.parametrize("bad, word", [
    ({"$ref": "https://example.com/s.json"}, "remote"), ({"$ref": "other.json#/a"}, "remote"),
    ({"$ref": "#node"}, "anchors"), ({"$ref": "#/$defs/missing"}, "points to nothing"), ({"$ref": 3}, "string"),
    ({"$ref": "#"}, "left recursion"), ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"},
                                        {"type": "null"}]}}, "$ref": "#/$defs/a"}, "left recursion"),
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 3}, "next to 'minimum'"),
    ({"$defs": {"a": {"type": "string", "pattern": "(?=x)"}}, "$ref": "#/$defs/a"}, "#/$defs/a"),
])
def test_bad_refs_are_refused(bad, word):
    with pytest.raises(SchemaError) as e:
        compile_schema(bad)
    assert word in str(e.value) and "\n" not in str(e.value)


def test_enum_keeps_the_values_the_rest_of_the_schema_accepts():
    assert schema({"type": "string", "enum": ["a", "bb", 1], "maxLength": 1}).root.values == (b'"a"',)
    g = schema({"type": "integer", "enum": [1, 5, 12, "x"], "minimum": 2, "maximum": 9})
    assert g.accepts(b"5") and not g.accepts(b"1") and not g.accepts(b"12")
    assert schema({"type": "string", "format": "date", "const": "2024-01-01"}).accepts(b'"2024-01-01"')
    with pytest.raises(SchemaError):
        compile_schema({"type": "string", "pattern": "^a", "enum": ["b"]})


def test_parse_request_response_format():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_request(dict(body, response_format={"type": "text"}), "chat", 8).response_format is None
    assert parse_request(dict(body, response_format={"type": "json_object"}), "chat", 8).response_format is grammar(None)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    req = parse_request(dict(body, response_format=fmt), "chat", 8)
    assert req.response_format is grammar(PERSON)  # compiled once: requests share its masks
    backref = {"type": "string", "pattern": "(a)\\1"}
    for bad in ({"type": "json_schema", "json_schema": {"name": "p", "schema": backref}},
                {"type": "json_schema", "json_schema": {"schema": {}}}, {"type": "xml"}, "json", 3):
        with pytest.raises(RequestError) as e:
            parse_request(dict(body, response_format=bad), "chat", 8)
        assert e.value.param == "response_format" and e.value.status == 400


# -- token masks on the real Qwen3 vocabulary -----------------------------------------------------------------

V = 151936  # Qwen3's model vocabulary, padded past the tokenizer's 151669 ids


@pytest.fixture(scope="module")
def index(ours):
    return token_index(ours, V)


def _states(g: Grammar, text: str):
    """The automaton's state before each byte prefix worth checking (every few bytes of `text`)."""
    data, out = text.encode(), []
    for i in range(0, len(data) + 1):
        s = g.feed(g.start, data[:i])
        if s is not None:
            out.append((data[:i], s))
    return out


def test_masks_are_exact_on_a_sample_of_tokens(ours, index):
    """Every allowed token keeps the prefix valid, every refused one does not (a random sample of each, in
    states along a text: structure, keys, a free string, an escape, a split UTF-8 character, numbers)."""
    rng = random.Random(0)
    g = grammar(PERSON)
    special = {t.id for t in ours.added_tokens}
    text = '{"name": "é\\u00e9", "age": -12, "tags": ["x"], "score": 1.5e3, "kind": "b"}'
    states = _states(g, text)
    assert len(states) > 40
    for prefix, state in states:
        mask = index.mask(g, state)
        allowed = np.flatnonzero(mask)
        assert not any(t in special and t not in index.eos_ids for t in allowed.tolist())
        assert not mask[ours.vocab_size:].any()  # padding ids past the tokenizer
        refused = np.flatnonzero(~mask[:ours.vocab_size])
        for t in rng.sample(allowed.tolist(), min(40, allowed.size)):
            if t not in index.eos_ids:
                assert g.feed(state, index.token_bytes[t]) is not None, (prefix, ours.decode([t]))
        for t in rng.sample(refused.tolist(), 40):
            if t not in special:
                assert g.feed(state, index.token_bytes[t]) is None, (prefix, ours.decode([t]))
        assert bool(mask[index.eos_ids].all()) == g.can_end(state)


def test_must_allow_and_must_reject_tokens(ours, index):
    g = grammar(PERSON)
    one = lambda text: ours.encode(text, add_special_tokens=False)  # noqa: E731
    (open_key,) = one('{"')
    start = index.mask(g, g.start)
    assert start[open_key] and not start[one("[")[0]] and not start[index.eos_ids].any()
    after_open = g.feed(g.start, b'{"')
    mask = index.mask(g, after_open)
    assert mask[one("name")[0]] and mask[one("age")[0]] and not mask[one("foo")[0]]
    in_string = g.feed(g.start, b'{"name": "a')
    mask = index.mask(g, in_string)
    for ok in ("hello", " world", '",', "é", "\\n"):
        assert mask[one(ok)[0]], ok
    assert not mask[one('"}')[0]]  # age is required: the object cannot close yet
    assert not mask[one("\n")[0]] and not mask[ours.token_to_id("<think>")] and not mask[index.eos_ids].any()
    done = g.feed(g.start, b'{"name": "a", "age": 1}')
    assert np.flatnonzero(index.mask(g, done)).tolist() == sorted(index.eos_ids.tolist())  # EOS alone


def test_mask_time_on_the_qwen3_vocabulary(index):
    """Per-step mask times, for the docs' numbers: a fresh state within a few ms, a memoized one in µs (the
    bounds are loose: this is a 2-core CI machine)."""
    g = Grammar(compile_schema(PERSON))  # a fresh grammar: nothing memoized
    fresh = []
    for _, state in _states(g, '{"name": "abc", "age": 12, "tags": ["xy"]}'):
        tic = time.perf_counter()
        index.mask(g, state)
        fresh.append(time.perf_counter() - tic)
    tic = time.perf_counter()
    index.mask(g, state)
    again = time.perf_counter() - tic
    assert np.median(fresh) < 0.02 and again < 0.002


def test_constraint_masks_logits_and_follows_the_history(ours, index):
    g = grammar(PERSON)
    c = JsonConstraint(g, index)
    prompt = mx.array([1, 2, 3], mx.int32)
    out = c(prompt, mx.zeros((1, V)))
    assert np.isfinite(np.array(out[0])).sum() == index.mask(g, g.start).sum()
    (tok,) = ours.encode('{"', add_special_tokens=False)
    out = c(mx.concatenate([prompt, mx.array([tok], mx.int32)]), mx.zeros((1, V)))
    assert c.state == g.feed(g.start, b'{"')
    assert np.isfinite(np.array(out[0])).sum() == index.mask(g, c.state).sum()
    with pytest.raises(MetalgenError):  # a token the mask refused cannot have been drawn
        c(mx.array([1, 2, 3, tok, tok], mx.int32), mx.zeros((1, V)))
