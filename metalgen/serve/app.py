"""The Starlette application: the OpenAI routes over an Engine.

Starlette (with uvicorn serving it) is the field's own small ASGI stack: streaming responses for
server-sent events, disconnect detection that cancels a stream, and no framework beyond routing."""

from __future__ import annotations

import json
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .engine import Engine
from .protocol import RequestError, chunk, completion, new_id, parse_request
from .reasoning import ReasoningSplitter


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def make_app(engine: Engine, default_max_tokens: int = 512) -> Starlette:
    """The application serving `engine`'s model under its name."""
    created = int(time.time())

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": engine.name})

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": engine.name, "object": "model", "created": created, "owned_by": "metalgen"}]})

    async def generate(request: Request, kind: str):
        try:
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"the request body is not valid JSON ({e})")
            req = parse_request(body, kind, default_max_tokens)
            if req.model != engine.name:
                raise RequestError(f"the model '{req.model}' does not exist here (this server has "
                                   f"'{engine.name}')", 404, "invalid_request_error", "model")
            ids, opened = engine.encode(req)
        except RequestError as e:
            return _error(e)
        job = engine.submit(req, ids, opened)
        rid = new_id("chatcmpl" if kind == "chat" else "cmpl")
        if req.stream:
            return StreamingResponse(_events(job, req, rid), media_type="text/event-stream")
        parts = {"content": [], "reasoning": []}
        try:
            async for event in _pieces(job):
                if event[0] == "piece":
                    parts[event[1]].append(event[2])
                elif event[0] == "error":
                    return _error(event[1])
                else:
                    return JSONResponse(completion(req, rid, "".join(parts["content"]), event[1], event[2],
                                                   "".join(parts["reasoning"]) or None))
        finally:
            job.cancelled.set()  # a no-op once done; stops a generation whose client went away

    async def chat(request: Request):
        return await generate(request, "chat")

    async def text(request: Request):
        return await generate(request, "text")

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/completions", text, methods=["POST"]),
    ])


FIELDS = {"content": "content", "reasoning": "reasoning_content"}


async def _pieces(job):
    """A job's events with its text split into ("piece", kind, text), kind "content" or "reasoning" (a
    chat's thinking block, reasoning.py; a text completion's text is all content), then ("done", finish,
    usage) or ("error", RequestError)."""
    splitter = ReasoningSplitter(job.in_reasoning) if job.req.kind == "chat" else None
    while True:
        event = await job.events.get()
        if event[0] == "text":
            for kind, text in splitter.feed(event[1]) if splitter else [("content", event[1])]:
                yield ("piece", kind, text)
            continue
        if event[0] == "done" and splitter is not None:
            for kind, text in splitter.finish():
                yield ("piece", kind, text)
        yield event
        return


async def _events(job, req, rid):
    """Server-sent events of a streamed answer; a closed connection cancels the generation."""

    def sse(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    first = True
    try:
        async for event in _pieces(job):
            if event[0] == "piece":
                yield sse(chunk(req, rid, event[2], None, first=first, field=FIELDS[event[1]]))
                first = False
            elif event[0] == "error":
                yield sse(event[1].body())
                break
            else:
                _, finish, use = event
                if first and req.kind == "chat":
                    yield sse(chunk(req, rid, "", None, first=True))
                yield sse(chunk(req, rid, None, finish))
                if req.include_usage:
                    yield sse(chunk(req, rid, None, None, use=use))
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()
