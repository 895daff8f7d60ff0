"""Helpers for the orchestration tests: a tiny config and the tools of this environment on PATH."""

from __future__ import annotations

import contextlib
import os
import threading
from http.server import ThreadingHTTPServer
import subprocess
import sys
from pathlib import Path

from helpers import micro_params

# smaller than MICRO still: these tests check wiring and equality across launchers, not learning
TINY = {
    "task": {"n_train": 120, "n_heldout": 20},
    "sft": {"steps": 10, "batch_size": 16, "n_examples": 0, "log_every": 5, "warmup_steps": 1},
    "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 1, "warmup_steps": 0},
    "eval": {"n_prompts": 20, "batch_size": 20, "n_table": 2},
    "distill": {"steps": 2, "prompts_per_step": 2},
}
BIN = Path(sys.executable).parent


def tool_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **extra}


def tiny_params(directory: Path, **sections: dict) -> Path:
    return micro_params(directory, **{**TINY, **sections})


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
