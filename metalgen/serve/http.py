"""What the server's routes share over HTTP: a refused request as OpenAI's error object, the request body read
within its limit, and a watch that cancels a request's jobs when its client goes away before the answer is
ready."""

from __future__ import annotations

from typing import Iterable

from starlette.requests import Request
from starlette.responses import JSONResponse

from .protocol import RequestError

# a request body past this is refused (413) unless `metalgen serve --max-request-bytes` says otherwise: room
# for a long-context prompt (a 256k-token prompt of \uXXXX-escaped CJK is about 1.5 MB) and then some
DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20


def error_response(e: RequestError) -> JSONResponse:
    """`e` as OpenAI's error object, with its HTTP status (and its headers, where it has any)."""
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than this server's limit of {limit} bytes "
                        "(metalgen serve --max-request-bytes)", 413)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, at most `limit` bytes: a Content-Length past it is refused before anything is
    read, and a body without one (chunked) is refused once what has arrived passes it, so that no more than
    `limit` bytes are ever held (uvicorn discards what the client still sends). Raises RequestError (413),
    or starlette's ClientDisconnect."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def cancel_on_disconnect(request: Request, jobs: Iterable) -> None:
    """Until the response starts: a client that goes away cancels `jobs` (anything with a `cancelled`
    event). The body has been read, so the next message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for job in jobs:
        job.cancelled.set()
