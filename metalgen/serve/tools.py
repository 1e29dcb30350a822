"""Tool calls of Qwen2.5 and Qwen3 replies (the Hermes format), parsed out of the text as it streams.

The chat template lists the request's tools in the system prompt and asks for each call as

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

possibly several, with text around them. `ToolCallParser` takes the reply's answer text in pieces and
hands back ("content", text) and ("tool_call", ToolCall) items, holding back what could still be the start
of a tag and the whitespace that may come before a call. A call whose body is not such a JSON object (bad
JSON, no name) stays in the content as written, tags included.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, Dict, List, Optional, Tuple

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


class ToolCallParser:
    """Feed the reply's text; get ("content", str) and ("tool_call", ToolCall) items. `prefix`: text the
    prompt already wrote of the reply (`forced_prefix`), parsed as if the model had."""

    def __init__(self, prefix: str = ""):
        self.buf = prefix
        self.in_call = False
        self.ws = ""  # whitespace held back: it is dropped if a call follows
        self.after_call = False  # the whitespace right after a call is dropped too
        self.calls: List[ToolCall] = []

    def feed(self, text: str) -> List[Tuple[str, Any]]:
        self.buf += text
        out: List[Tuple[str, Any]] = []
        while True:
            if self.in_call:
                j = self.buf.find(CLOSE)
                if j < 0:
                    return out  # the call's JSON is read whole, at its closing tag
                body, self.buf = self.buf[:j], self.buf[j + len(CLOSE):]
                self._end_call(body, CLOSE, out)
                continue
            i = self.buf.find(OPEN)
            if i >= 0:
                self._content(self.buf[:i], out, hold=True)
                self.buf, self.in_call = self.buf[i + len(OPEN):], True
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
            self._end_call(rest, "", out)
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

    def _end_call(self, body: str, close: str, out: List[Tuple[str, Any]]) -> None:
        self.in_call = False
        parsed = parse_call(body)
        if parsed is None:  # not a call: the text stays in the content as written
            self._content(OPEN + body + close, out, hold=False)
            return
        self.ws, self.after_call = "", True
        call = ToolCall(len(self.calls), "call_" + uuid.uuid4().hex[:24], *parsed)
        self.calls.append(call)
        out.append(("tool_call", call))
