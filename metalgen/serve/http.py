"""What the server's routes share over HTTP: a refused request as OpenAI's error object, and a watch that
cancels a request's jobs when its client goes away before the answer is ready."""

from __future__ import annotations

from typing import Iterable

from starlette.requests import Request
from starlette.responses import JSONResponse

from .protocol import RequestError


def error_response(e: RequestError) -> JSONResponse:
    """`e` as OpenAI's error object, with its HTTP status."""
    return JSONResponse(e.body(), status_code=e.status)


async def cancel_on_disconnect(request: Request, jobs: Iterable) -> None:
    """Until the response starts: a client that goes away cancels `jobs` (anything with a `cancelled`
    event). The body has been read, so the next message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for job in jobs:
        job.cancelled.set()
