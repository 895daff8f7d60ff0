"""One writer per stage output: an exclusive lock on `.<out>.lock`, next to the output directory.

Two runs into one `--out` would share the staging directory `.<out>.partial`, delete each other's files and swap
half of each into place. The lock covers the staging directory and the swap; a second writer stops at once with one
line naming the holder.

The lock is `fcntl.flock` on the lock file, so the kernel drops it when its holder dies, however it dies (kill -9,
OOM killer, a node going away on a local disk): a crashed writer never leaves a lock behind. The file records the
holder (pid, host, command, start time) for that one line, and for one more case: a forked child that outlived a
killed writer still holds the flock; when the recorded writer is gone (same host, no such pid) the lock is stale and
is taken over. The file is removed on release; a writer that opened it just before checks, once it holds the flock,
that the path still names the file it locked, and starts over if not.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from posttrain.errors import UserError
from posttrain.uris import redact_uri


def lock_path(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}.lock"


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    command: str
    started: str  # ISO 8601, UTC

    @classmethod
    def me(cls, command: str) -> Holder:
        return cls(os.getpid(), socket.gethostname(), command, datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def is_gone(self) -> bool:
        """Known to have exited: on this host and no such process (on another host we cannot tell)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} ({self.command!r}, started {self.started})"


class OutputLock:
    """`with OutputLock(out_dir, command):` holds the output for this process; `UserError` if another writer has it.

    `previous` is the holder recorded by a writer that died without releasing the lock (None after a clean exit).
    """

    def __init__(self, out_dir: Path, command: str | None = None):
        self.out_dir = Path(out_dir)
        self.path = lock_path(self.out_dir)
        self.command = redact_uri(command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
        self.previous: Holder | None = None
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):  # each retry follows a lock file removed under us (released, or stale and broken)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                if holder is None or not holder.is_gone():
                    os.close(fd)
                    who = holder.describe() if holder else "another process (starting)"
                    raise UserError(f"{self.out_dir} is being written by {who}; wait for it or choose another --out") from None
                if _names(self.path, fd):  # held by an orphan of a dead writer: break it
                    self.path.unlink(missing_ok=True)
                os.close(fd)
                continue
            if not _names(self.path, fd):
                os.close(fd)
                continue
            self.previous = _read(fd)
            _write(fd, Holder.me(self.command))
            self._fd = fd
            return self
        raise UserError(f"cannot lock {self.path}: it keeps being replaced; is another writer starting over and over?")

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            if _names(self.path, self._fd):  # unlink before the close: whoever locks the old file next sees it is gone
                self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def _read(fd: int) -> Holder | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return Holder(**json.loads(os.read(fd, 65536) or b"null"))
    except (TypeError, ValueError, OSError):  # empty (a writer between create and write) or not ours
        return None


def _write(fd: int, holder: Holder) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(asdict(holder)).encode(), 0)


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (not removed or replaced since it was opened)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
