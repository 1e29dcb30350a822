"""The Starlette application: the OpenAI routes over an Engine.

Starlette (with uvicorn serving it) is the field's own small ASGI stack: streaming responses for
server-sent events, disconnect detection that cancels a stream, and no framework beyond routing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Optional

import mlx.core as mx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .auth import ApiKeyMiddleware
from .choices import Choice, answer, events
from .engine import Engine
from .logprobs import TokenStrings
from .http import DEFAULT_MAX_REQUEST_BYTES, cancel_on_disconnect, error_response, read_body
from .protocol import RequestError, new_id, parse_request
from .speech import not_served, speech_route


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    # Starlette's own answers (an unknown route, a wrong method) as OpenAI error objects, not plain text
    return JSONResponse(RequestError(str(exc.detail), exc.status_code).body(), status_code=exc.status_code,
                        headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    # a fault the handlers did not catch: an error object naming its type, never a traceback (the log has it)
    return error_response(RequestError(f"internal error: {type(exc).__name__}", 500, "server_error"))


def _rss_bytes() -> Optional[int]:
    """The server process's resident memory now (Linux); None elsewhere (resource gives only the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def make_app(engine: Engine, default_max_tokens: int = 512, api_key: Optional[str] = None,
             max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, speech=None) -> Starlette:
    """The application serving `engine`'s model under its name; with `api_key`, every route but /health
    needs `Authorization: Bearer <api_key>` (auth.ApiKeyMiddleware). A request body past `max_request_bytes`
    is refused (413), and a request while the engine's queue is full (its `admit`) too (429). `speech`: a
    SpeechEngine of the same model (Qwen3-Omni speaks as well as writes) that serves /v1/audio/speech beside
    the text engine."""
    created = int(time.time())

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": engine.name})

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": engine.name, "object": "model", "created": created, "owned_by": "metalgen"}]})

    async def debug(request: Request):
        # the engine's load and the process's memory: what a stress run checks returns to idle
        state = engine.state() if hasattr(engine, "state") else {}
        return JSONResponse({"engine": state, "memory": {
            "active": mx.get_active_memory(), "cache": mx.get_cache_memory(), "peak": mx.get_peak_memory(),
            "rss": _rss_bytes()}})

    async def generate(request: Request, kind: str):
        if getattr(engine, "task", "text") != "text":  # a speech model serves /v1/audio/speech only
            return error_response(not_served(engine, request.url.path))
        try:
            raw = await read_body(request, max_request_bytes)
        except ClientDisconnect:  # gone before its body arrived: nothing to run, nobody to answer
            return Response(status_code=400)
        except RequestError as e:  # past the size limit
            return error_response(e)
        try:
            try:
                body = json.loads(raw)
            except ValueError as e:  # bad JSON or UTF-8, or an integer past Python's 4300 digits
                raise RequestError(f"the request body is not valid JSON ({str(e).splitlines()[0]})")
            except RecursionError:  # nesting deeper than the parser's stack
                raise RequestError("the request body is not valid JSON (nested too deeply)")
            req = parse_request(body, kind, default_max_tokens)
            if req.model != engine.name:
                raise RequestError(f"the model '{req.model}' does not exist here (this server has "
                                   f"'{engine.name}')", 404, "invalid_request_error", "model")
            engine.admit()  # 429 while the queue is full (nothing awaited from here to the submission)
            ids, opened = engine.encode(req)
            # a structured reply is the JSON text, content from its first token, even after a prompt that
            # opened a thinking block (the mask leaves no room for one)
            opened = opened and req.response_format is None
        except RequestError as e:
            return error_response(e)
        strings = TokenStrings(engine.tokenizer) if req.logprobs else None
        # n choices are n jobs sharing one prefill of the prompt (batched, n rows of the batch); with a seed,
        # choice i draws with seed + i
        choices = [Choice(i, job, strings) for i, job in enumerate(engine.submit(req, ids, opened, req.n))]
        rid = new_id("chatcmpl" if kind == "chat" else "cmpl")
        if req.stream:
            return StreamingResponse(events(req, rid, choices), media_type="text/event-stream")
        # until the answer is ready; a streamed answer's response watches for the disconnect itself
        watch = asyncio.ensure_future(cancel_on_disconnect(request, [c.job for c in choices]))
        try:
            result = await answer(req, rid, choices)
        finally:
            watch.cancel()
        return error_response(result) if isinstance(result, RequestError) else JSONResponse(result)

    async def chat(request: Request):
        return await generate(request, "chat")

    async def text(request: Request):
        return await generate(request, "text")

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models), Route("/debug/engine", debug),
        Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/completions", text, methods=["POST"]),
        Route("/v1/audio/speech", speech_route(speech or engine, max_request_bytes), methods=["POST"]),
    ], middleware=[Middleware(ApiKeyMiddleware, api_key=api_key)] if api_key else [],
        exception_handlers={HTTPException: _http_error, Exception: _server_error})

