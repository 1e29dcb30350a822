"""A uvicorn server on a free port, on a thread of its own, for the tests that talk to `metalgen serve`
over HTTP (the openai client, raw sockets)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


@contextlib.contextmanager
def live_server(app) -> Iterator[int]:
    """Serve the ASGI `app` on 127.0.0.1 at a free port; yields the port, stops the server on exit."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):  # 10 s at most
        if server.started:
            break
        time.sleep(0.05)
    if not server.started:
        raise RuntimeError("the test server did not start")
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
