"""Helpers for the orchestration tests: a tiny config and the tools of this environment on PATH."""

from __future__ import annotations

import contextlib
import os
import threading
from http.server import ThreadingHTTPServer
import subprocess
import sys
from pathlib import Path

from helpers import TINY, tiny_params  # noqa: F401  (re-exported for the orchestration tests)

BIN = Path(sys.executable).parent


def tool_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **extra}


def dvc(*args: str, cwd: Path) -> str:
    result = subprocess.run([str(BIN / "dvc"), *args], cwd=cwd, env=tool_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def git(*args: str, cwd: Path) -> None:
    identity = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@localhost", "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@localhost"}
    subprocess.run(["git", *args], cwd=cwd, env=tool_env(**identity), check=True, capture_output=True, timeout=60)


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
