"""Numeric bounds in the automaton (metalgen.structured.numbers): the bytes allowed after each prefix are
exactly those that some in-range number continues with, checked against an oracle that reasons on value
intervals (not digits)."""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction as F
from typing import Optional

import pytest

from metalgen.structured import Grammar, SchemaError, compile_schema

UNIT = F(1, 10 ** 15)
ALPHABET = b"-.0123456789e"
_SHAPE = re.compile(r"-?(0|[1-9][0-9]*)?(\.[0-9]*)?")


def _range_has(lo_v: F, hi_v: F, schema: dict, integer: bool) -> bool:
    """Whether some value in [lo_v, hi_v] (on the grid: integers, or multiples of 1e-15) is in the schema's
    range (and a multiple of its multipleOf)."""
    lo, hi = lo_v, hi_v
    grid = F(1) if integer else UNIT
    dec = lambda key: F(str(schema[key])) if key in schema else None  # noqa: E731 (a bound as its decimal text)
    lo_b = [(dec("minimum"), False), (dec("exclusiveMinimum"), True)]
    hi_b = [(dec("maximum"), False), (dec("exclusiveMaximum"), True)]
    first = -((-lo) // grid)  # in grid units
    last = hi // grid
    for b, excl in lo_b:
        if b is not None:
            g = b / grid
            first = max(first, (g.numerator // g.denominator + 1) if excl or g.denominator != 1 else g.numerator)
    for b, excl in hi_b:
        if b is not None:
            g = b / grid
            c = -((-g.numerator) // g.denominator)  # ceil
            last = min(last, (c - 1) if excl or g.denominator != 1 else g.numerator)
    if first > last:
        return False
    q = schema.get("multipleOf")
    if q is None:
        return True
    s0 = first + (-first) % q
    return s0 <= last


def oracle(text: str, schema: dict, integer: bool, complete: bool = False) -> bool:
    """Whether `text` is a prefix (complete: the whole) of a JSON number (no exponent, at most 15 integer
    and 15 fraction digits) within the schema's bounds."""
    if not _SHAPE.fullmatch(text):
        return False
    neg = text.startswith("-")
    body = text[1:] if neg else text
    ip, _, fp = body.partition(".")
    dot = "." in body
    if len(ip) > 15 or len(fp) > 15 or (dot and (integer or not ip)):
        return False
    if complete:
        if not ip or (dot and not fp):
            return False
        v = F(int(ip)) + (F(int(fp), 10 ** len(fp)) if fp else 0)
        v = -v if neg else v
        return _range_has(v, v, schema, integer)
    unit = F(1) if integer else UNIT
    spans = []  # magnitude intervals of the completions
    if dot:
        v = F(int(ip)) + (F(int(fp), 10 ** len(fp)) if fp else 0)
        spans.append((v, v + F(1, 10 ** len(fp)) - UNIT))
    elif not ip:
        spans.append((F(0), F(10 ** 15) - unit))
    elif ip == "0":
        spans.append((F(0), F(1) - unit if not integer else F(0)))
    else:
        m, k = int(ip), len(ip)
        for L in range(k, 16):
            spans.append((F(m * 10 ** (L - k)), F((m + 1) * 10 ** (L - k)) - unit))
    for a, b in spans:
        if _range_has(-b if neg else a, -a if neg else b, schema, integer):
            return True
    return False


def _check_exact(schema: dict, depth: int = 6, keep: int = 100, seed: int = 0) -> int:
    """Walk prefixes breadth first (a sample of each depth) and compare the automaton's allowed next bytes,
    and whether the number may end, with the oracle's. Returns the prefixes checked."""
    integer = schema["type"] == "integer"
    g = Grammar(compile_schema(schema))
    # the number ended by its parent
    inside = Grammar(compile_schema({"type": "array", "items": schema, "minItems": 1}))
    rng = random.Random(seed)
    layer, checked = [""], 0
    for _ in range(depth):
        nxt = []
        for prefix in layer:
            state = g.feed(g.start, prefix.encode())
            assert state is not None, prefix
            assert g.can_end(state) == oracle(prefix, schema, integer, complete=True), prefix
            assert inside.accepts_prefix(b"[" + prefix.encode() + b"]") == oracle(prefix, schema, integer, True), prefix
            for c in ALPHABET:
                want = oracle(prefix + chr(c), schema, integer)
                got = g.advance(state, c) is not None
                assert got == want, (schema, prefix + chr(c), got)
                if want:
                    nxt.append(prefix + chr(c))
            checked += 1
        rng.shuffle(nxt)
        layer = nxt[:keep]
    return checked


INTEGERS = [
    {"minimum": -50, "maximum": 1234}, {"exclusiveMinimum": 7, "exclusiveMaximum": 100}, {"minimum": 0},
    {"maximum": -3}, {"minimum": 100, "maximum": 100}, {"minimum": -7, "maximum": 7, "multipleOf": 3},
    {"minimum": 1000, "multipleOf": 250}, {"minimum": 1.5, "maximum": 7.2}, {"exclusiveMinimum": -1, "maximum": 0},
    {"minimum": 95, "maximum": 1005}, {"multipleOf": 7}, {"minimum": -999999999999999, "maximum": -999999999999990},
]
NUMBERS = [
    {"minimum": 0, "maximum": 1}, {"exclusiveMinimum": 0, "maximum": 1.5}, {"minimum": -2.25, "maximum": 3.125},
    {"exclusiveMinimum": 0.1, "maximum": 0.3}, {"minimum": 12.5}, {"maximum": -0.5},
    {"minimum": 99.99, "maximum": 100.01},
    {"minimum": -0.001, "exclusiveMaximum": 0.001}, {"minimum": 0.5, "maximum": 0.5}, {"exclusiveMaximum": 10},
]


@pytest.mark.parametrize("bounds", INTEGERS, ids=[json.dumps(b) for b in INTEGERS])
def test_integer_bounds_are_exact_byte_by_byte(bounds):
    assert _check_exact(dict(bounds, type="integer")) > 3


@pytest.mark.parametrize("bounds", NUMBERS, ids=[json.dumps(b) for b in NUMBERS])
def test_number_bounds_are_exact_byte_by_byte(bounds):
    assert _check_exact(dict(bounds, type="number"), depth=7) > 3


def test_the_oracle_can_tell():
    """(The oracle itself: a few prefixes it must accept or refuse, so that agreeing with it means something.)"""
    s = {"minimum": -50, "maximum": 1234}
    assert oracle("12", s, True) and oracle("123", s, True) and oracle("1234", s, True, complete=True)
    assert not oracle("1235", s, True) and not oracle("-51", s, True) and oracle("-5", s, True)
    assert not oracle("-", {"minimum": 1}, True) and oracle("-0", {"minimum": 0}, True, complete=True)
    assert oracle("0.3", {"exclusiveMinimum": 0.1, "maximum": 0.3}, False, complete=True)
    assert not oracle("0.30000000000001", {"exclusiveMinimum": 0.1, "maximum": 0.3}, False)


@pytest.mark.parametrize("schema, ok, bad", [
    ({"type": "integer", "minimum": 0, "exclusiveMaximum": 150}, [b"0", b"149", b"-0", b"7"],
     [b"150", b"-1", b"1e2", b"007"]),
    ({"type": "integer", "multipleOf": 5, "minimum": -10, "maximum": 10}, [b"-10", b"-5", b"0", b"5", b"10"],
     [b"-15", b"3", b"15", b"11"]),
    ({"type": "integer", "multipleOf": 0.5}, [b"1", b"-3"], [b"1.5"]),  # every integer is a multiple of 1/2
    ({"type": "integer", "multipleOf": 2.5}, [b"5", b"-10"], [b"2", b"3"]),  # 5/2: the integers that 5 divides
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 1.5}, [b"1.5", b"0.000000000000001", b"1", b"1.50"],
     [b"0", b"-0.0", b"1.51", b"1e0", b"2"]),
    ({"type": "number", "minimum": 0.1, "maximum": 0.1}, [b"0.1", b"0.10"], [b"0.11", b"0.09"]),
    ({"type": ["integer", "null"], "minimum": 10}, [b"10", b"null"], [b"9"]),
    ({"type": "number", "exclusiveMinimum": True, "minimum": 1}, [b"1.1"], [b"1", b"1.0"]),  # draft 4's flag
])
def test_bounded_values(schema, ok, bad):
    g = Grammar(compile_schema(schema))
    for text in ok:
        assert g.accepts(text), text
    for text in bad:
        assert not g.accepts(text), text


def test_bounded_number_in_an_object_ends_where_the_object_goes_on():
    g = Grammar(compile_schema({"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer", "minimum": 1, "maximum": 12}, "b": {"type": "number", "maximum": 0}}}))
    assert g.accepts(b'{"a": 12, "b": -0.5}') and g.accepts(b'{"b":0,"a":1}')
    assert not g.accepts_prefix(b'{"a": 13') and not g.accepts_prefix(b'{"a": 0') and not g.accepts_prefix(b'{"b": 1')
    state = g.feed(g.start, b'{"a": 1')  # 1, or 10..12: a digit 0-2, or the end of the value (b must follow)
    assert {chr(b) for b in range(256) if g.advance(state, b) is not None} == set("012,")


@pytest.mark.parametrize("schema, word", [
    ({"type": "integer", "minimum": 5, "maximum": 4}, "bounds"),
    ({"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5}, "bounds"),
    ({"type": "integer", "minimum": 10 ** 15}, "bounds"),  # past the 15 digits the automaton writes
    ({"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5}, "bounds"),
    ({"type": "number", "multipleOf": 0.5}, "integers only"), ({"type": "integer", "multipleOf": 0}, "greater than 0"),
    ({"type": "integer", "minimum": "1"}, "finite number"), ({"type": "integer", "maximum": True}, "finite number"),
    ({"type": "number", "exclusiveMaximum": True}, "without 'maximum'"), ({"type": "string", "minimum": 1}, "minimum"),
])
def test_bad_bounds_are_refused(schema, word):
    with pytest.raises(SchemaError) as e:
        compile_schema(schema)
    assert word in str(e.value)


def test_states_stay_few():
    """Digits are kept as their relation to the bounds, not as digits: a long run of digits in the free
    middle of a range makes one state per position."""
    g = Grammar(compile_schema({"type": "integer", "minimum": 3, "maximum": 10 ** 14}))
    states = {g.feed(g.start, str(n).encode()) for n in range(200000, 200500)}
    assert len(states) == 1
    multiple: Optional[object] = Grammar(compile_schema({"type": "integer", "multipleOf": 7}))
    assert len({multiple.feed(multiple.start, str(n).encode()) for n in range(1000, 2000)}) == 7
