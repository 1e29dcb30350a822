"""Tool calls of Qwen2.5 and Qwen3 replies (the Hermes format), parsed out of the text as it streams.

The chat template lists the request's tools in the system prompt and asks for each call as

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

possibly several, with text around them. `ToolCallParser` takes the reply's answer text in pieces and
hands back ("content", text) and ("tool_call", ...) items, holding back what could still be the start
of a tag and the whitespace that may come before a call. A call whose body is not such a JSON object (bad
JSON, no name) stays in the content as written, tags included.

A call's `arguments` is the JSON object as `json.dumps(..., ensure_ascii=False)` writes it, made by
`CanonicalJson` a character at a time, so that a streamed reply can send it as the model writes it (OpenAI's
streaming: a first delta with the call's id, type, name and `arguments: ""`, then fragments of `arguments`)
and a whole reply gets the same string: the fragments joined are the whole reply's `arguments`, exactly.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from .reasoning import partial_tail

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def forced_prefix(name: Optional[str] = None) -> str:
    """What a reply that must call a tool starts with, appended to the prompt: the opening tag, and with
    `name` the call up to its arguments (the model writes the rest). No constrained decoding is here yet:
    this makes the call's start certain, not its JSON."""
    if name is None:
        return OPEN + "\n"
    return OPEN + '\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


@dataclasses.dataclass
class ToolCall:
    """One parsed call: its position in the reply, its id, the function's name and arguments (JSON text)."""

    index: int
    id: str
    name: str
    arguments: str

    def message(self) -> Dict[str, Any]:
        """The call as an OpenAI message's `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def delta(self) -> Dict[str, Any]:
        """The call as one streamed `delta.tool_calls` entry (the whole call in one chunk)."""
        return {"index": self.index, **self.message()}


def parse_call(body: str) -> Optional[Tuple[str, str]]:
    """(name, arguments as JSON text) of a call's body, or None where it is not a call."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # arguments written as a JSON string: kept if it holds an object
        try:
            if isinstance(json.loads(args), dict):
                return obj["name"], args
        except ValueError:
            pass
        return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


# ---- a JSON value read a character at a time, written back as json.dumps writes it ------------------------

_WS = " \t\n\r"
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_ENCODED = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")  # (json.loads takes the last three)


class NotJson(ValueError):
    """The text read so far is not the start of a JSON value that json.loads would take."""


def _encoded(c: str) -> str:
    """One character as json.dumps(..., ensure_ascii=False) writes it inside a string."""
    e = _ENCODED.get(c)
    if e is not None:
        return e
    return "\\u%04x" % ord(c) if c < " " else c


class CanonicalJson:
    """One JSON value read a character at a time (`char`), as json.loads reads it (no control characters
    in strings, surrogate escapes paired where they can be, NaN and Infinity taken), and written back as
    `json.dumps(value, ensure_ascii=False)` writes it: ", " and ": " between items, strings re-escaped, numbers
    as Python prints them (1.50 -> 1.5, 1e2 -> 100.0). Each piece of that text goes to `sink(path, text)` as
    soon as it is certain: `path` is the keys from the top down to the value the text belongs to (None for an
    array's item or between an object's items: a key, the ", " and ": " are its object's own text). A number
    or a literal is written once it ends, an escape once it is read (a high surrogate once what follows it is
    known). NotJson where json.loads would refuse the text. Duplicate keys are written as they come (json.loads
    keeps the last one's value)."""

    def __init__(self, sink: Callable[[tuple, str], None], on_top_key: Optional[Callable[[str], None]] = None):
        self.sink, self.on_top_key = sink, on_top_key
        self.stack: List[str] = []  # the open containers, "{" or "["
        self.keys: List[Optional[str]] = []  # per open container, the key whose value is being read
        self.mode = "value"  # value, key, colon, next, string, number, literal, done
        self.first = False  # just after "{" or "[": the container may close at once
        self.tok = ""  # a number, a literal, or a string's escape, being read
        self.key: Optional[List[str]] = None  # the decoded key being read (None inside a value's string)
        self.key_done: Optional[str] = None  # the key read, until its ":"
        self.high: Optional[int] = None  # a high surrogate escape, until what follows it is known
        self.escape_at = 0  # where the escape being read began
        self.read = 0  # characters read
        self.pending: Optional[int] = None  # where the text read but not yet written began (None: none)

    @property
    def done(self) -> bool:
        return self.mode == "done"

    def feed(self, text: str) -> None:
        for c in text:
            self.char(c)

    def char(self, c: str) -> None:
        mode = self.mode
        if mode == "string":
            self._string(c)
        elif mode == "number" and (c in _NUMBER_CHARS or (self.tok == "-" and c == "I")):
            if c == "I":  # -Infinity
                self.mode = "literal"
            self.tok += c
        elif mode == "literal":
            self.tok += c
            if not any(lit.startswith(self.tok) for lit in _LITERALS):
                raise NotJson(self.tok)
            if self.tok in _LITERALS:
                self._write(self.tok)
                self._value_end()
        else:
            if mode == "number":  # c ends it, and is then read where the value ended
                self._number_end()
                mode = self.mode
            if c in _WS:
                pass
            elif mode == "value":
                self._value(c)
            elif mode == "key" and c == '"':
                self.mode, self.key = "string", []
                self._write('"')
            elif mode == "key" and c == "}" and self.first:
                self._close()
            elif mode == "colon" and c == ":":
                self._write(": ")
                self.keys[-1], self.key_done = self.key_done, None
                self.mode, self.first = "value", False
            elif mode == "next" and c == ",":
                self._write(", ")
                self.mode, self.first = ("key" if self.stack[-1] == "{" else "value"), False
            elif mode == "next" and c == ("}" if self.stack[-1] == "{" else "]"):
                self._close()
            else:
                raise NotJson(c)
        self.read += 1

    def _write(self, text: str) -> None:
        self.sink(tuple(self.keys), text)

    def _value(self, c: str) -> None:
        if c in "{[":
            self._write(c)
            self.stack.append(c)
            self.keys.append(None)
            self.mode, self.first = ("key" if c == "{" else "value"), True
        elif c == "]" and self.first and self.stack and self.stack[-1] == "[":
            self._close()
        elif c == '"':
            self.mode, self.key = "string", None
            self._write('"')
        elif c in "-0123456789" or c in "tfnNI":
            self.mode, self.tok, self.pending = ("number" if c in "-0123456789" else "literal"), c, self.read
        else:
            raise NotJson(c)

    def _number_end(self) -> None:
        if not _NUMBER.fullmatch(self.tok):
            raise NotJson(self.tok)
        try:
            value = json.loads(self.tok)
        except ValueError:  # an integer past Python's digit limit
            raise NotJson(self.tok[:20])
        self._write(json.dumps(value))
        self._value_end()

    def _value_end(self) -> None:
        self.tok, self.pending = "", None
        if not self.stack:
            self.mode = "done"
            return
        self.mode = "next"
        self.keys[-1] = None

    def _close(self) -> None:
        c = self.stack.pop()
        self.keys.pop()
        self._write("}" if c == "{" else "]")
        self._value_end()

    def _string(self, c: str) -> None:
        if self.tok:  # an escape
            self.tok += c
            if len(self.tok) == 2:
                if c == "u":
                    return
                if c not in _ESCAPES:
                    raise NotJson(self.tok)
                self.tok = ""
                self._flush_high()
                self._out(_ESCAPES[c])
                return
            if c not in _HEX:
                raise NotJson(self.tok)
            if len(self.tok) == 6:
                code, self.tok = int(self.tok[2:], 16), ""
                self._code(code)
            return
        if c == "\\":
            self.tok, self.escape_at = c, self.read
            if self.pending is None:
                self.pending = self.read
            return
        if c < " ":
            raise NotJson(repr(c))
        self._flush_high()
        if c != '"':
            self._out(c)
            return
        self._write('"')
        if self.key is None:
            self._value_end()
            return
        key, self.key = "".join(self.key), None
        if len(self.stack) == 1 and self.on_top_key is not None:
            self.on_top_key(key)
        self.mode, self.key_done = "colon", key

    def _code(self, code: int) -> None:
        """A \\\\uXXXX escape's code: a low surrogate after a high one makes one character with it."""
        if self.high is not None and 0xDC00 <= code <= 0xDFFF:
            code, self.high = 0x10000 + ((self.high - 0xD800) << 10) + (code - 0xDC00), None
        else:
            self._flush_high()
        if 0xD800 <= code <= 0xDBFF:
            # written once the next character shows whether a low surrogate follows
            self.high, self.pending = code, self.escape_at if self.pending is None else self.pending
            return
        self._out(chr(code))

    def _flush_high(self) -> None:
        if self.high is not None:
            c, self.high = chr(self.high), None
            self._out(c)

    def _out(self, c: str) -> None:
        """A string's decoded character, written (and kept, in a key)."""
        if self.key is not None:
            self.key.append(c)
        self._write(_encoded(c))
        if self.high is None and not self.tok:
            self.pending = None


class _Fallback(Exception):
    """A call body not of the shape that streams: it is read whole at its closing tag instead."""


class CallBody:
    """The text between a call's tags, read as it comes. While it has the shape `{"name": "...",
    "arguments": {...}}` (whitespace anywhere, other keys before or after, but "name" before "arguments" and
    each once), the arguments' canonical text (CanonicalJson) is available as it is read, from the moment the
    arguments' "{" is read ("committed"): `take()` hands out what is new. Any other shape falls back to reading
    the body whole at the end (`parse_call`), streaming nothing. `end()` says how it ended: "valid" (committed
    and a whole JSON object), "broken" (committed, then not JSON: `rest` is the text from where it broke, or
    was cut off) or "fallback"."""

    def __init__(self):
        self._raw: List[str] = []  # the body's text, as it came
        self._length = 0
        self.state = "reading"  # reading, fallback, broken
        self.name: Optional[str] = None  # set when committed
        self._arguments: List[str] = []  # the arguments' canonical text so far, in pieces
        self._given = 0  # how many of them take() has handed out
        self.rest = ""
        self._name_text = ""
        self._top_keys: List[str] = []
        self._json = CanonicalJson(self._sink, self._top_key)

    @property
    def raw(self) -> str:
        return "".join(self._raw)

    def feed(self, text: str) -> None:
        start = self._length
        self._raw.append(text)
        self._length += len(text)
        if self.state != "reading":
            return
        for i, c in enumerate(text):
            try:
                self._json.char(c)
            except _Fallback:
                self.state = "fallback"
                return
            except NotJson:
                self._broke(start + i)
                return

    def take(self) -> str:
        """The arguments' text read since the last take."""
        new, self._given = "".join(self._arguments[self._given:]), len(self._arguments)
        return new

    @property
    def committed(self) -> bool:
        return self.name is not None

    def end(self) -> str:
        if self.state == "reading" and self.committed and not self._json.done:
            self._broke(self._length)  # cut off
        if self.state == "reading" and self.committed:
            return "valid"
        return "fallback" if self.state == "reading" else self.state

    def _broke(self, at: int) -> None:
        if not self.committed:
            self.state = "fallback"
            return
        pending = self._json.pending
        self.state, self.rest = "broken", self.raw[at if pending is None else min(pending, at):]

    def _top_key(self, key: str) -> None:
        if key in ("name", "arguments") and key in self._top_keys:
            raise NotJson(f"a second '{key}'")  # json.loads keeps the last: not what was streamed
        self._top_keys.append(key)

    def _sink(self, path: tuple, text: str) -> None:
        if not path:
            if text not in ("{", "}"):
                raise _Fallback()  # not an object
            return
        if path[0] == "name" and not self.committed:
            self._name_text += text
        elif path[0] == "arguments":
            if not self.committed:
                try:
                    name = json.loads(self._name_text)
                except ValueError:
                    name = None  # no name yet (it may come after the arguments), or not a string
                if text != "{" or not isinstance(name, str) or not name:
                    raise _Fallback()
                self.name = name
            self._arguments.append(text)


class ToolCallParser:
    """Feed the reply's text; get ("content", str) and ("tool_call", ...) items. `prefix`: text the
    prompt already wrote of the reply (`forced_prefix`), parsed as if the model had.

    Whole (`stream` False), each call is one ToolCall item, at its closing tag. Streamed, a call of the shape
    that streams (CallBody) is a ToolCallDelta item with its id, type, name and `arguments: ""` once its
    arguments' "{" is read, then one with each fragment of the arguments as it comes (only what could still
    be part of the closing tag, or a number or escape not yet ended, is held back); a call of another shape
    is one ToolCall at its closing tag, as whole. A streamed call whose JSON breaks after it began (bad JSON,
    a second "name", the reply cut off) stays a call, with the arguments sent so far, and the text from where
    it broke (with the closing tag) is content."""

    def __init__(self, prefix: str = "", stream: bool = False):
        self.buf = prefix
        self.stream = stream
        self.body: Optional[CallBody] = None  # the call being read (None: outside a call)
        self.current: Optional[ToolCall] = None  # the call being streamed
        self.ws = ""  # whitespace held back: it is dropped if a call follows
        self.after_call = False  # the whitespace right after a call is dropped too
        self.calls: List[ToolCall] = []

    @property
    def in_call(self) -> bool:
        return self.body is not None

    def feed(self, text: str) -> List[Tuple[str, Any]]:
        self.buf += text
        out: List[Tuple[str, Any]] = []
        while True:
            if self.in_call:
                j = self.buf.find(CLOSE)
                if j < 0:  # all but what could begin the closing tag is read now
                    keep = partial_tail(self.buf, CLOSE)
                    self._call_text(self.buf[:len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep:]
                    return out
                self._call_text(self.buf[:j], out)
                self.buf = self.buf[j + len(CLOSE):]
                self._end_call(CLOSE, out)
                continue
            i = self.buf.find(OPEN)
            if i >= 0:
                self._content(self.buf[:i], out, hold=True)
                self.buf, self.body = self.buf[i + len(OPEN):], CallBody()
                continue
            keep = partial_tail(self.buf, OPEN)
            self._content(self.buf[:len(self.buf) - keep], out, hold=True)
            self.buf = self.buf[len(self.buf) - keep:]
            return out

    def finish(self) -> List[Tuple[str, Any]]:
        """What is still held back, at the end of the reply: a call never closed counts if its JSON is
        whole (a reply may end right after it), else it is content."""
        out: List[Tuple[str, Any]] = []
        rest, self.buf = self.buf, ""
        if self.in_call:
            self._call_text(rest, out)
            self._end_call("", out)
        else:
            self._content(rest, out, hold=False)
        return out

    def _content(self, text: str, out: List[Tuple[str, Any]], hold: bool) -> None:
        text = self.ws + text
        if self.after_call:
            text = text.lstrip()
        stripped = text.rstrip() if hold else text
        self.ws = text[len(stripped):]
        if stripped:
            self.after_call = False
            out.append(("content", stripped))

    def _call_text(self, text: str, out: List[Tuple[str, Any]]) -> None:
        self.body.feed(text)
        if not self.stream or not self.body.committed:
            return
        if self.current is None:  # its name is known and its arguments begin: the call's first delta
            self.current = self._new_call(self.body.name, "")
            self.ws = ""  # the whitespace before a call is dropped
            out.append(("tool_call", ToolCallDelta(self.current.index, self.current, "")))
        fragment = self.body.take()
        if fragment:
            self.current.arguments += fragment
            out.append(("tool_call", ToolCallDelta(self.current.index, None, fragment)))

    def _new_call(self, name: str, arguments: str) -> ToolCall:
        call = ToolCall(len(self.calls), "call_" + uuid.uuid4().hex[:24], name, arguments)
        self.calls.append(call)
        return call

    def _end_call(self, close: str, out: List[Tuple[str, Any]]) -> None:
        body, self.body = self.body, None
        ended = body.end()
        if self.current is not None:  # streamed: its deltas are sent, whatever comes now
            self.current = None
            if ended == "valid":
                self.ws, self.after_call = "", True
            else:  # broken after it began: the rest as written
                self.ws, self.after_call = "", False
                self._content(body.rest + close, out, hold=False)
            return
        if ended == "valid":  # as streamed: the canonical arguments
            parsed: Optional[Tuple[str, str]] = (body.name, body.take())
        else:
            parsed = parse_call(body.raw)
        if parsed is None:  # not a call: the text stays in the content as written
            self._content(OPEN + body.raw + close, out, hold=False)
            return
        self.ws, self.after_call = "", True
        out.append(("tool_call", self._new_call(*parsed)))


@dataclasses.dataclass
class ToolCallDelta:
    """A streamed call's piece: its first (`call` set: id, type, name, `arguments` "") or a fragment of its
    arguments."""

    index: int
    call: Optional[ToolCall]
    arguments: str

    def delta(self) -> Dict[str, Any]:
        """The piece as a streamed `delta.tool_calls` entry, as OpenAI's streaming sends them."""
        if self.call is not None:
            return {"index": self.index, "id": self.call.id, "type": "function",
                    "function": {"name": self.call.name, "arguments": ""}}
        return {"index": self.index, "function": {"arguments": self.arguments}}
