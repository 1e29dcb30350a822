"""`pattern` and `format` (metalgen.structured.regex): the regex subset against Python's `re`, refusals,
the formats' strings against independent validators, and strings with a pattern in the automaton, byte by
byte against an enumerated oracle, and in the token masks on the Qwen3 vocabulary."""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import random
import re
import uuid

import numpy as np
import pytest

from metalgen.structured import Grammar, SchemaError, compile_schema, token_index
from metalgen.structured.regex import FORMATS, PatternError, compile_regex, format_dfa, utf8_sequences

# patterns whose meaning is the same in ECMA-262 and Python's re (ASCII mode, no newline in the strings)
SAME = [
    "ab", "^ab", "ab$", "^ab$", "a|b", "^a|b$", "(ab|ba)+", "^(ab|ba)+$", "a*b+c?", "^a{2}$", "^a{2,}$",
    "^a{1,3}b{0,2}$", "^[a-c]+$", "^[^a-c]+$", "^\\d{2,4}$", "\\w\\s\\w", "^.b.$", "^(?:a|bc)*$", "^(?<x>a)b$",
    "^a+?b??c*?$", "[\\d.]-", "^\\.\\*\\+$", "^[a\\-z]$", "^[-a]$", "^[a-]$", "x{", "^a{,$", "^\\x41\\u0042$",
    "c(a|b)*c", "^$", "^(a|)b$", "^[\\w.+-]+@[a-z]+$", "^\\D\\W\\S$", "^[^\\d]$", "^(a(b(c)?)?)?$",
]
ALPHABET = "abc1.-+ *@xé"


@pytest.mark.parametrize("pattern", SAME)
def test_dfa_agrees_with_python_re(pattern):
    dfa = compile_regex(pattern)
    py = re.compile(pattern.replace("(?<x>", "(?P<x>"), re.ASCII)
    rng = random.Random(pattern)
    strings = ["".join(p) for n in range(4) for p in itertools.product("ab1.", repeat=n)]
    strings += ["".join(rng.choice(ALPHABET) for _ in range(rng.randrange(9))) for _ in range(400)]
    for s in strings:
        assert dfa.matches(s) == bool(py.search(s)), (pattern, s)


def test_ecma_semantics_where_python_differs():
    assert not compile_regex("^a$").matches("a\n")  # ECMA's $ is the end only; Python's also before a last \n
    assert compile_regex("^.$").matches("😀") and not compile_regex("^.$").matches("\n")  # . is a code point
    assert not compile_regex("^.$").matches("\u2028") and compile_regex("^\\s$").matches("\u00a0")
    assert not compile_regex("^\\d$").matches("٣") and not compile_regex("^\\w$").matches("é")  # ASCII classes
    assert compile_regex("^[^a]$").matches("😀") and compile_regex("^\\u{1F600}$").matches("😀")
    assert compile_regex("^\\ud83d\\ude00$").matches("😀")  # a surrogate pair escape is one character
    assert compile_regex("^a\\nb\\t$").matches("a\nb\t") and compile_regex("[\\b]").matches("\b")


@pytest.mark.parametrize("pattern, word", [
    ("a(?=b)", "lookaround"), ("a(?!b)", "lookaround"), ("(?<=a)b", "lookaround"), ("(?<!a)b", "lookaround"),
    ("(a)\\1", "backreference"), ("(?<n>a)\\k<n>", "backreference"), ("\\bword\\b", "word boundar"),
    ("\\p{L}", "property"), ("(?i)abc", "inline flags"), ("[]a]", "opens with ']'"), ("a)", "unbalanced"),
    ("(a", "missing ')'"), ("*a", "nothing to repeat"), ("a**", "quantifier after a quantifier"),
    ("[a", "missing ']'"), ("a{3,2}", "n < m"), ("\\q", "unknown escape"), ("a{,3}", "{0,n}"),
    ("[[:alpha:]]", "POSIX"), ("\\cA", "control escapes"), ("a{2000}", "repetition"),
    ("(a|b)*a(a|b){12}", "too complex"), ("^$a", "matches no string"), ("^\\x01$", "matches no string"),
])
def test_unsupported_regex_features_are_refused(pattern, word):
    with pytest.raises(PatternError) as e:
        compile_regex(pattern)
    assert word in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SchemaError) as e:  # and through the schema: a 400 naming the keyword
        compile_schema({"type": "string", "pattern": pattern})
    assert "pattern" in str(e.value)


def test_utf8_sequences_cover_exactly_the_code_points():
    rng = random.Random(0)
    for lo, hi in [(0, 0x10FFFF), (0x7F, 0x80), (0x7FF, 0x800), (0xD000, 0xE100), (0x10000, 0x10010), (0xE9, 0xE9)]:
        seqs = utf8_sequences(lo, hi)
        for cp in [lo, hi, lo - 1, hi + 1] + [rng.randint(lo, hi) for _ in range(50)]:
            if 0 <= cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF:
                data = chr(cp).encode()
                covered = any(len(s) == len(data) and all(a <= b <= z for (a, z), b in zip(s, data)) for s in seqs)
                assert covered == (lo <= cp <= hi), (lo, hi, hex(cp))


# -- formats ------------------------------------------------------------------------------------------------

_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-](\d\d):(\d\d))")


def _valid(fmt: str, s: str) -> bool:
    """Independent checks of what each format means (RFC 3339, RFC 4122, RFC 5321's dot-atoms, dotted quads)."""
    try:
        if fmt == "date":
            y, m, d = s.split("-")
            return len(y) == 4 and len(m) == 2 and len(d) == 2 and bool(datetime.date(int(y), int(m), int(d)))
        if fmt == "time":
            t = _TIME.fullmatch(s)
            datetime.time(int(t[1]), int(t[2]), int(t[3]))
            return t[6] is None or (int(t[6]) < 24 and int(t[7]) < 60)
        if fmt == "date-time":
            d, sep, t = s.partition("T")
            return sep == "T" and _valid("date", d) and _valid("time", t)
        if fmt == "uuid":
            return len(s) == 36 and str(uuid.UUID(s)) == s.lower()
        if fmt == "ipv4":
            return str(ipaddress.IPv4Address(s)) == s
        local, _, domain = s.rpartition("@")
        labels = domain.split(".")
        atext = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+")
        return (all(atext.fullmatch(a) for a in local.split(".")) and len(labels) >= 2
                and all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?", x) and len(x) <= 63 for x in labels)
                and labels[-1].isalpha())
    except (ValueError, TypeError, AttributeError):
        return False


def _samples(dfa, rng: random.Random, n: int, max_len: int = 60):
    """Random strings of the DFA's language (random walks over printable ASCII that stop at accepting states)."""
    out = []
    for _ in range(n):
        s, text = dfa.start, ""
        while len(text) < max_len:
            if dfa.accept[s] and rng.random() < 0.15:
                break
            options = [b for b in range(0x20, 0x7F) if dfa.trans[s][b] >= 0]
            if not options:
                break
            b = rng.choice(options)
            s, text = dfa.trans[s][b], text + chr(b)
        if dfa.accept[s]:
            out.append(text)
    return out


GOOD = {
    "date": ["2024-02-29", "2000-02-29", "0001-01-01", "1999-12-31", "2023-04-30"],
    "time": ["23:59:59Z", "00:00:00+14:00", "12:30:05.123456-05:30", "08:00:00.5Z"],
    "date-time": ["2024-01-01T10:00:00Z", "1970-01-01T00:00:00.000+00:00"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "AB3E4567-E89B-12D3-A456-426614174000"],
    "email": ["john.doe@example.com", "a+b@mail.co.uk", "x_y@sub-1.example.org"],
    "ipv4": ["0.0.0.0", "255.255.255.255", "10.0.12.199"],
}
BAD = {
    "date": ["2023-02-29", "1900-02-29", "2024-04-31", "0000-01-01", "2024-13-01", "2024-1-01", "x2024-01-01"],
    "time": ["24:00:00Z", "12:60:00Z", "12:00:00", "12:00:00+24:00", "12:00:00.1234567Z"],
    "date-time": ["2024-01-01 10:00:00Z", "2024-01-01T10:00Z", "2024-01-01"],
    "uuid": ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
    "email": ["a@b", "a..b@example.com", ".a@example.com", "a@-b.com", "a@b.c1", "a b@example.com"],
    "ipv4": ["256.0.0.1", "01.2.3.4", "1.2.3", "1.2.3.4.5"],
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_formats_accept_only_valid_strings(fmt):
    dfa = format_dfa(fmt)
    for s in GOOD[fmt]:
        assert dfa.matches(s) and _valid(fmt, s), s
    for s in BAD[fmt]:
        assert not dfa.matches(s), s
    samples = _samples(dfa, random.Random(fmt), 400, max_len=80)
    assert len(samples) > 30
    for s in samples:
        assert _valid(fmt, s), (fmt, s)


def test_format_and_pattern_together_and_unknown_formats():
    g = Grammar(compile_schema({"type": "string", "format": "date", "pattern": "^2024-"}))
    assert g.accepts(b'"2024-02-29"') and not g.accepts(b'"2023-01-01"') and not g.accepts_prefix(b'"2023')
    with pytest.raises(SchemaError) as e:
        compile_schema({"type": "string", "format": "duration"})
    assert "format" in str(e.value) and "duration" in str(e.value)
    with pytest.raises(SchemaError):  # a uuid is 36 characters
        compile_schema({"type": "string", "format": "uuid", "maxLength": 35})


# -- strings with a pattern in the automaton ---------------------------------------------------------------

# the characters of the strings enumerated: those of the patterns, and those whose bytes appear in an escape
# (\n and \b are written as the escapes \n and \b, / raw or as \/, " and \ escaped)
SIGMA = ["a", "b", "c", "é", "\n", "/", "n", '"', "\\", "\b"]


def _encodings(s: str):
    """The JSON texts the automaton may write for s (raw UTF-8 and the short escapes; no \\u escapes)."""
    options = [{"\n": ["\\n"], "\b": ["\\b"], "/": ["/", "\\/"], '"': ['\\"'], "\\": ["\\\\"]}.get(ch, [ch])
               for ch in s]
    return ['"' + "".join(p) + '"' for p in itertools.product(*options)]


@pytest.mark.parametrize("schema", [
    {"pattern": "ab", "maxLength": 4}, {"pattern": "^a+b?$", "maxLength": 5}, {"pattern": "a|^b", "maxLength": 4},
    {"pattern": "c$", "maxLength": 3}, {"pattern": "^(ab|ba){1,2}$"}, {"pattern": "[^a]b", "maxLength": 3},
    {"pattern": "^.c", "maxLength": 3}, {"pattern": "é", "maxLength": 3}, {"pattern": "a\\nb", "maxLength": 4},
    {"pattern": "a", "minLength": 2, "maxLength": 4}, {"pattern": "^[ab]*$", "minLength": 3, "maxLength": 4},
    {"pattern": "^(aa)*$", "minLength": 1, "maxLength": 5}, {"pattern": "^a/?$"}, {"pattern": '^\\\\?"n$'},
], ids=lambda s: json.dumps(s, ensure_ascii=False))
def test_pattern_strings_are_exact_byte_by_byte(schema):
    """Every byte the automaton allows after a prefix leads to some accepted string, and every byte that does
    is allowed: the language enumerated over a small alphabet (the patterns only use its characters)."""
    schema = dict(schema, type="string")
    g = Grammar(compile_schema(schema))
    py = re.compile(schema["pattern"].replace("$", "\\Z"))  # (Python's $ also matches before a last \n)
    top = schema.get("maxLength", 4)
    language = [s for n in range(schema.get("minLength", 0), top + 1) for p in itertools.product(SIGMA, repeat=n)
                for s in ["".join(p)] if py.search(s)]
    texts = {e.encode() for s in language for e in _encodings(s)}
    prefixes = {t[:i] for t in texts for i in range(len(t) + 1)}
    candidates = {b for t in texts for b in t}  # (a raw u is not among them: after a \ it is refused, see below)
    for p in prefixes:
        state = g.feed(g.start, p)
        assert state is not None, p
        assert g.can_end(state) == (p in texts), p
        for b in candidates:
            assert (g.advance(state, b) is not None) == (p + bytes([b]) in prefixes), (p, chr(b))
        closed = schema["pattern"]
        if closed[0] == "^" and closed[-1] == "$" and "." not in closed:  # only sigma's characters can come
            assert all(g.advance(state, b) is None for b in range(256) if b not in candidates), p
    assert len(texts) > 1


def test_pattern_through_escapes_and_utf8():
    # a quote, a backslash, a slash, a newline
    g = Grammar(compile_schema({"type": "string", "pattern": '^"\\\\/\\n$'}))
    assert g.accepts(b'"\\"\\\\/\\n"') and g.accepts(b'"\\"\\\\\\/\\n"')
    assert not g.accepts_prefix(b'"\\u0022')  # \u escapes are not taken in a pattern string
    g = Grammar(compile_schema({"type": "string", "pattern": "^é😀$"}))
    data = '"é😀"'.encode()
    assert g.accepts(data) and all(g.accepts_prefix(data[:i]) for i in range(len(data)))
    assert not g.accepts_prefix('"è'.encode())  # the first byte of é and è is the same: the second differs


def test_pattern_masks_are_exact_on_a_sample_of_tokens(ours):
    """The token masks of pattern strings (a DFA run over all plain tokens at once, vocab.py) against the
    automaton, token by token: every allowed token continues, a sample of refused ones do not."""
    index = token_index(ours, 151936)
    special = {t.id for t in ours.added_tokens}
    eos = set(index.eos_ids.tolist())
    rng = random.Random(0)
    schema = {"type": "object", "required": ["e", "c", "d"], "properties": {
        "e": {"type": "string", "format": "email"}, "c": {"type": "string", "pattern": "^[A-Z][a-z ]{2,9}!$"},
        "d": {"type": "string", "format": "date-time"}, "n": {"type": "string", "pattern": "ab", "maxLength": 6}}}
    g = Grammar(compile_schema(schema))
    text = '{"e": "jo.doe@ex.com", "c": "Hi there!", "d": "2024-01-01T10:00:00Z", "n": "xabé"}'
    data = text.encode()
    for i in range(len(data) + 1):
        state = g.feed(g.start, data[:i])
        mask = index.mask(g, state)
        allowed = [t for t in np.flatnonzero(mask[:ours.vocab_size]).tolist() if t not in eos]
        for t in allowed if len(allowed) < 80 else rng.sample(allowed, 80):
            assert g.feed(state, index.token_bytes[t]) is not None, (data[:i], ours.decode([t]))
        refused = np.flatnonzero(~mask[:ours.vocab_size])
        for t in rng.sample(refused.tolist(), min(80, refused.size)):
            if t not in special:
                assert g.feed(state, index.token_bytes[t]) is None, (data[:i], ours.decode([t]))
    assert g.accepts(data)
