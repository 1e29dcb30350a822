"""The Starlette application: the OpenAI routes over an Engine.

Starlette (with uvicorn serving it) is the field's own small ASGI stack: streaming responses for
server-sent events, disconnect detection that cancels a stream, and no framework beyond routing."""

from __future__ import annotations

import dataclasses
import json
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .choices import Choice, answer, events
from .engine import Engine
from .logprobs import TokenStrings
from .protocol import RequestError, new_id, parse_request
from .speech import not_served, speech_route


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
        if getattr(engine, "task", "text") != "text":  # a speech model serves /v1/audio/speech only
            return _error(not_served(engine, request.url.path))
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
        strings = TokenStrings(engine.tokenizer) if req.logprobs else None
        # n choices are n jobs (batched, n rows of the batch); with a seed, choice i draws with seed + i
        choices = [Choice(i, engine.submit(req if req.seed is None else dataclasses.replace(req, seed=req.seed + i),
                                           ids, opened), strings) for i in range(req.n)]
        rid = new_id("chatcmpl" if kind == "chat" else "cmpl")
        if req.stream:
            return StreamingResponse(events(req, rid, choices), media_type="text/event-stream")
        result = await answer(req, rid, choices)
        return _error(result) if isinstance(result, RequestError) else JSONResponse(result)

    async def chat(request: Request):
        return await generate(request, "chat")

    async def text(request: Request):
        return await generate(request, "text")

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/completions", text, methods=["POST"]),
        Route("/v1/audio/speech", speech_route(engine), methods=["POST"]),
    ])

