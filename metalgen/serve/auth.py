"""API keys (`metalgen serve --api-key`, or METALGEN_API_KEY): every route but /health then needs
`Authorization: Bearer KEY`; a request without it gets OpenAI's 401 error object."""

from __future__ import annotations

import hashlib
import hmac

from starlette.responses import JSONResponse

from .protocol import RequestError

# open without a key: a load balancer's or orchestrator's probe carries none
OPEN_PATHS = frozenset({"/health"})


def _digest(value: bytes) -> bytes:
    # both sides hashed first, so that compare_digest's time depends on neither the key's length nor its bytes
    return hashlib.sha256(value).digest()


class ApiKeyMiddleware:
    """ASGI middleware over `app`: HTTP requests to any path outside OPEN_PATHS need the bearer token
    `api_key`, compared in constant time; a missing or wrong one is answered 401, as OpenAI answers it
    (type "invalid_request_error", code "invalid_api_key"), and never reaches the app."""

    def __init__(self, app, api_key: str):
        if not api_key:
            raise ValueError("the API key is empty")
        self.app = app
        self.expected = _digest(api_key.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        scheme, _, token = (header or b"").partition(b" ")
        if header is not None and scheme.lower() == b"bearer" and hmac.compare_digest(
                _digest(token.strip()), self.expected):
            return await self.app(scope, receive, send)
        # the message never echoes what was sent: it may be another service's secret
        message = ("you didn't provide an API key: send it in an Authorization header (Authorization: Bearer KEY)"
                   if header is None else "incorrect API key provided")
        error = RequestError(message, 401, code="invalid_api_key")
        response = JSONResponse(error.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
