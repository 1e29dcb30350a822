"""A request's answer from the engine's jobs, one job a choice (`n` of them): each job's text split into
reasoning, content and tool calls (reasoning.py, tools.py), its token logprobs collected (logprobs.py), and
the choices put together as one JSON answer (`answer`) or interleaved as server-sent events (`events`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Dict, List, Tuple

from .logprobs import TokenLogprobs, TokenStrings
from .protocol import GenerationRequest, choice, chunk, completion, usage
from .reasoning import ReasoningSplitter
from .tools import ToolCallParser

FIELDS = {"content": "content", "reasoning": "reasoning_content"}


class Choice:
    """One choice: its job (events ("token", id, logprob, top), ("text", str), then ("done", finish,
    usage) or ("error", RequestError)) turned into ("piece", kind, payload) items, kind "content" or
    "reasoning" (text) or "tool_call" (a tools.ToolCall), then the job's last event."""

    def __init__(self, index: int, job, strings: TokenStrings):
        req: GenerationRequest = job.req
        self.index, self.job = index, job
        self.reasoning = ReasoningSplitter(job.in_reasoning) if req.kind == "chat" else None
        # streamed, a call's arguments go out as they are written (tools.ToolCallParser)
        self.tools = ToolCallParser(req.tool_prefix, stream=req.stream) if req.tools else None
        self.logprobs = TokenLogprobs(strings, req.kind, req.top_logprobs) if req.logprobs else None

    async def items(self) -> AsyncIterator[Tuple]:
        while True:
            # with it, whatever queued since: a loop that fell behind the engine (many streams) sends one chunk
            # for all their text, not a chunk a token
            ready = [await self.job.events.get()]
            while not self.job.events.empty():
                ready.append(self.job.events.get_nowait())
            text = []
            for event in ready:
                if event[0] == "token":
                    if self.logprobs is not None:
                        self.logprobs.add(*event[1:])
                    continue
                if event[0] == "text":
                    text.append(event[1])
                    continue
                for item in self._split("".join(text), False) if text else ():
                    yield item
                if event[0] == "done":
                    for item in self._split("", True):
                        yield item
                    if self.tools is not None and self.tools.calls and event[1] == "stop":
                        event = ("done", "tool_calls", event[2])
                yield event
                return
            for item in self._split("".join(text), False):
                yield item

    def _split(self, text: str, end: bool) -> List[Tuple]:
        if self.reasoning is None:
            pieces = [("content", text)] if text else []
        else:
            pieces = self.reasoning.finish() if end else self.reasoning.feed(text)
        out = []
        for kind, piece in pieces:
            if kind == "content" and self.tools is not None:  # calls are parsed out of the answer only
                out += [("piece",) + item for item in self.tools.feed(piece)]
            else:
                out.append(("piece", kind, piece))
        if end and self.tools is not None:
            out += [("piece",) + item for item in self.tools.finish()]
        return out


async def _merged(choices: List[Choice]) -> AsyncIterator[Tuple[Choice, Tuple]]:
    """Every choice's items as they come, each with its choice; until every choice is done or failed."""
    if len(choices) == 1:  # the usual request: no task and queue a token in between
        async for item in choices[0].items():
            yield choices[0], item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
        async for item in c.items():
            await queue.put((c, item))

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        left = len(choices)
        while left:
            c, item = await queue.get()
            if item[0] in ("done", "error"):
                left -= 1
            yield c, item
    finally:
        for task in tasks:
            task.cancel()


def _total(uses: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One usage for the choices: the prompt once, the completions summed, the prompt's cached tokens
    as few as any choice had."""
    return usage(uses[0]["prompt_tokens"], sum(u["completion_tokens"] for u in uses),
                 min(u["prompt_tokens_details"]["cached_tokens"] for u in uses))


def _delta(req: GenerationRequest, kind: str, payload) -> Dict[str, Any]:
    if kind == "tool_call":
        return {"tool_calls": [payload.delta()]}
    return {FIELDS[kind]: payload} if req.kind == "chat" else {"text": payload}


async def answer(req: GenerationRequest, rid: str, choices: List[Choice]):
    """The whole answer (a JSON object), or the RequestError that failed it."""
    parts = {c.index: {"content": [], "reasoning": [], "tool_call": []} for c in choices}
    finished: Dict[int, Tuple[str, Dict[str, Any]]] = {}
    try:
        async for c, item in _merged(choices):
            if item[0] == "piece":
                parts[c.index][item[1]].append(item[2])
            elif item[0] == "error":
                return item[1]
            else:
                finished[c.index] = item[1], item[2]
    finally:
        for c in choices:
            c.job.cancelled.set()  # a no-op once done; stops a generation whose client went away
    out = []
    for c in choices:
        p = parts[c.index]
        calls = [call.message() for call in p["tool_call"]]
        text = "".join(p["content"])
        if calls and not text:
            text = None  # an answer that only calls tools has no content
        logprobs = c.logprobs.take() if c.logprobs is not None else None
        if c.logprobs is not None and logprobs is None:
            logprobs = {"content": []} if req.kind == "chat" else None
        out.append(choice(req, c.index, text, finished[c.index][0], "".join(p["reasoning"]) or None, calls,
                          logprobs))
    return completion(req, rid, out, _total([finished[c.index][1] for c in choices]))


async def events(req: GenerationRequest, rid: str, choices: List[Choice]) -> AsyncIterator[str]:
    """Server-sent events of a streamed answer, the choices' chunks interleaved as they come (each with
    its index), the usage chunk if asked for, then [DONE]. A closed connection cancels the generations."""

    def sse(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    fresh = {c.index for c in choices}  # choices that sent nothing yet (a chat's first delta names the role)
    uses = []
    try:
        async for c, item in _merged(choices):
            if item[0] == "error":
                yield sse(item[1].body())
                break
            logprobs = c.logprobs.take() if c.logprobs is not None else None
            first = c.index in fresh and req.kind == "chat"
            fresh.discard(c.index)
            if item[0] == "piece":
                yield sse(chunk(req, rid, _delta(req, item[1], item[2]), None, c.index, first, logprobs=logprobs))
                continue
            _, finish, use = item
            uses.append(use)
            if first:
                yield sse(chunk(req, rid, {}, None, c.index, True))
            yield sse(chunk(req, rid, None, finish, c.index, logprobs=logprobs))
        else:
            if req.include_usage:
                yield sse(chunk(req, rid, None, None, use=_total(uses)))
        yield "data: [DONE]\n\n"
    finally:
        for c in choices:
            c.job.cancelled.set()

