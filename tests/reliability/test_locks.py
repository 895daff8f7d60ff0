"""One writer per output: a second writer is refused at once, naming the holder; a dead writer's lock is taken over.

The holders are small Python processes that take the lock and wait (a stage run would spend seconds importing
torch); `execute` itself is run in this process on a stand-in stage.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from posttrain.errors import UserError
from posttrain.locks import OutputLock, lock_path

HOLD = """
import os, sys, time
from pathlib import Path
from posttrain.locks import OutputLock

lock = OutputLock(Path(sys.argv[1]), command="posttrain sft --out " + sys.argv[1]).__enter__()
{after_lock}
print(os.getpid(), flush=True)
time.sleep(120)
"""


def hold(out: Path, after_lock: str = "") -> tuple[subprocess.Popen, list[int]]:
    """A process holding the lock on `out`; returns it and the pids it printed once locked."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(after_lock=textwrap.dedent(after_lock)), str(out)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert pids, "the holder did not take the lock"
    return proc, pids


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_second_writer_fails_at_once_with_one_line_naming_the_holder(tmp_path):
    out = tmp_path / "outputs" / "sft"
    proc, (pid,) = hold(out)
    try:
        start = time.monotonic()
        with pytest.raises(UserError) as refused:
            with OutputLock(out):
                pass
        assert time.monotonic() - start < 1.0
        message = str(refused.value)
        assert "\n" not in message and f"pid {pid}" in message and "posttrain sft --out" in message and "started" in message
        assert json.loads(lock_path(out).read_text())["pid"] == pid  # the refused writer left the holder's record alone
    finally:
        kill(proc)


def test_the_lock_of_a_killed_writer_is_taken_over(tmp_path):
    out = tmp_path / "outputs" / "sft"
    proc, (pid,) = hold(out)
    kill(proc)  # SIGKILL: no clean-up ran; the kernel dropped the flock, the file still names the dead writer
    assert json.loads(lock_path(out).read_text())["pid"] == pid
    with OutputLock(out) as lock:
        assert lock.previous is not None and lock.previous.pid == pid
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    assert not lock_path(out).exists()  # released: removed


def test_a_lock_still_held_by_an_orphan_of_a_killed_writer_is_taken_over(tmp_path):
    """A child forked by the writer (a data loader worker, say) keeps the flock after the writer is killed."""
    out = tmp_path / "outputs" / "rl"
    orphan_code = """
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    print(child, end=" ")
    """
    proc, (child, _writer) = hold(out, orphan_code)
    try:
        kill(proc)
        os.kill(child, 0)  # the orphan lives on, holding the lock
        with OutputLock(out) as lock:
            assert lock.previous is None  # a fresh lock file: the orphan keeps the old one
            assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    finally:
        os.kill(child, signal.SIGKILL)


def test_execute_holds_the_lock_while_the_stage_runs_and_releases_it_on_every_exit(tmp_path, monkeypatch, stand_in_stage):
    from posttrain import stages

    out = tmp_path / "outputs" / "probe"
    seen = {}

    def nested_writer(cfg, inputs, out_dir, tracker, resume=False):
        with pytest.raises(UserError) as refused:  # a second writer of the same output, while the first runs
            stages.execute("probe", cfg, {}, out)
        seen["message"] = str(refused.value)
        (out_dir / "done").write_text("yes")
        return {"ok": 1.0}

    def crash(cfg, inputs, out_dir, tracker, resume=False):
        raise RuntimeError("the stage broke")

    cfg = stand_in_stage(nested_writer, tracking=False)
    assert stages.execute("probe", cfg, {}, out) == {"ok": 1.0}
    assert f"pid {os.getpid()}" in seen["message"] and "\n" not in seen["message"]
    assert (out / "done").read_text() == "yes" and not lock_path(out).exists()

    cfg = stand_in_stage(crash, tracking=False)
    with pytest.raises(RuntimeError):
        stages.execute("probe", cfg, {}, out)
    assert not lock_path(out).exists() and (out / "done").is_file()  # released; the previous output untouched


def test_the_cli_refuses_a_second_writer_in_under_a_second(tmp_path):
    """Issue 38 item 3: the lock is the first thing the stage command takes after parsing its arguments (it was
    taken after the imports, the settings and the store check: 17-27 s). Timed from the second process's start."""
    out = tmp_path / "sft"
    proc, (pid,) = hold(out)
    try:
        started = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "posttrain.cli", "sft", "--out", str(out)],
                                capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
        elapsed = time.monotonic() - started
    finally:
        kill(proc)
    assert second.returncode != 0 and f"pid {pid}" in second.stderr, second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert elapsed < 1.0, f"the second writer was refused after {elapsed:.2f} s"
