"""The warm `posttrain` (tests/warm_cli.py) that the launchers' tests find on PATH behaves like the installed script:
the same output and exit status, a user error's one line, signals passed on, and a kill -9 of it ends the run."""

from __future__ import annotations

import difflib
import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import POSTTRAIN, tiny_params, tool_env


def _both(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    env = tool_env()
    warm = subprocess.run(["posttrain", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    real = subprocess.run([POSTTRAIN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return warm, real


def test_the_warm_cli_prints_and_exits_like_the_script(tmp_path):
    # against the script itself, not this process's CLI: a pytest worker's registries hold what its earlier tests
    # registered (a CI run once differed there), a fresh process's do not
    warm, real = _both("registry", "--json", cwd=tmp_path)
    assert warm.returncode == real.returncode == 0 and '"advantages"' in warm.stdout
    assert warm.stdout == real.stdout, "".join(difflib.unified_diff(real.stdout.splitlines(True), warm.stdout.splitlines(True), "script", "warm"))
    warm, real = _both("rl", "--params", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert warm.returncode == real.returncode == 2
    assert warm.stderr == real.stderr == f"posttrain: error: params file not found: {tmp_path / 'missing.yaml'}\n"


def _running_in(directory: Path) -> list[int]:
    """The processes whose working directory is `directory`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(directory):
                found.append(int(pid))
        except OSError:
            continue
    return found


def _start_sft(tmp_path: Path) -> subprocess.Popen:
    """A micro data stage, then an SFT long enough to be caught while it trains."""
    env = tool_env()
    tmp_path.mkdir()
    params = tiny_params(tmp_path)
    subprocess.run(["posttrain", "data", "--params", str(params), "--out", "outputs/data"], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    argv = ["posttrain", "sft", "--params", str(params), "--in", "data=outputs/data", "--out", "outputs/sft", "--set", "sft.steps=100000"]
    process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(_running_in(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # into its training
    assert process.poll() is None and len(_running_in(tmp_path)) == 2  # the shim and the stage it stands for
    return process


def test_kill_9_of_the_warm_cli_ends_its_stage_and_a_term_reaches_it(tmp_path):
    process = _start_sft(tmp_path / "kill")
    os.killpg(process.pid, signal.SIGKILL)  # as a launcher kills a task
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _running_in(tmp_path / "kill") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running_in(tmp_path / "kill")

    process = _start_sft(tmp_path / "term")
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    assert process.returncode in (-signal.SIGTERM, 143), process.stderr.read()[-2000:]  # the TERM ended the stage (the CLI exits 143, its run KILLED)
    assert not _running_in(tmp_path / "term")
