"""Helpers for the orchestration tests: a tiny config and the tools of this environment on PATH."""

from __future__ import annotations

import contextlib
import threading
from http.server import ThreadingHTTPServer

from helpers import BIN, TINY, dvc, git, tiny_params, tool_env  # noqa: F401  (re-exported for the orchestration tests)


@contextlib.contextmanager
def loopback_server(handler):
    """An HTTP stand-in for a cluster API on 127.0.0.1, served from a thread of this test; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
