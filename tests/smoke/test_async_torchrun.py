"""`rl.mode: async` under torchrun on the CPU (gloo, trainers/async_dist.py): 1 trainer rank + 1 rollout rank gives
the weights and metrics of the local async run with 1 worker process (deterministic schedule, same seed), bit for
bit; a rollout rank killed with SIGKILL mid-run ends the run on every rank with one line within a bound; and
`--resume` then finishes with those same weights (exact resume across the failure). Free-running with two rollout
ranks, a trainer killed with SIGKILL after checkpoint 2 and resumed neither loses nor repeats a prompt (counted;
minutes: `make test-heavy`)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import micro_params, posttrain_in_process, tool_env

TORCHRUN = Path(sys.executable).with_name("torchrun")
WORKERS = {"count": 1, "queued_groups": 3, "timeout_s": 20, "deterministic": True, "refresh_every_tokens": 2}
RL = {"steps": 3, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4, "checkpoint_every": 1, "log_every": 1, "mode": "async",
      "pool_policy": "pace", "correction": "decoupled", "workers": WORKERS}
WALL = ("async/wait_s", "tokens_per_s")  # wall-clock figures


def _torchrun(*args: str, processes: int = 2, script: Path | None = None, **env: str) -> subprocess.Popen:
    """torchrun of `posttrain rl`: the warm CLI found on PATH (tests/warm_cli.py: each rank a fork of a server that has
    imported it, so a launch does not pay for the imports), or a Python `script` standing in for it."""
    program = ["--no-python", "posttrain"] if script is None else [str(script)]
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node", str(processes), *program, "rl", "--in", "policy=outputs/policy", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tool_env(OMP_NUM_THREADS="1", **env))


def _rank_pid(parent: int, rank: int) -> int:
    """The pid of torchrun's worker process of `rank` (its environment says RANK; killing the warm CLI's shim kills
    the rank it stands for)."""
    children = [int(c) for task in Path(f"/proc/{parent}/task").iterdir() for c in (task / "children").read_text().split()]
    for pid in children:
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        if env.get("RANK") == str(rank):
            return pid
    raise AssertionError(f"no rank {rank} among torchrun's children {children}")


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return {k: v for path in sorted(directory.glob("*.safetensors")) for k, v in load_file(path).items()}


def _history(directory: Path) -> list[dict[str, float]]:
    return [{k: v for k, v in h.items() if k not in WALL} for h in json.loads((directory / "history.json").read_text())]


def _data_and_a_random_policy(tmp_path: Path, rl: dict) -> None:
    from posttrain import resolve
    from posttrain.models import build_tiny, save_pretrained, train_char_tokenizer
    from posttrain.tasks import build_task

    micro_params(tmp_path, task={"n_train": 60, "n_heldout": 10}, rl=rl, tracking={"enabled": False})
    posttrain_in_process("data")
    cfg = resolve.load(tmp_path / "params.yaml")
    torch.manual_seed(0)
    tokenizer = train_char_tokenizer([build_task(cfg.task).alphabet()])
    save_pretrained(build_tiny(cfg.model, tokenizer), tokenizer, tmp_path / "outputs/policy/model")  # a random micro policy


@pytest.mark.slow
def test_async_under_torchrun_is_the_local_run_and_a_killed_rollout_rank_ends_it_with_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _data_and_a_random_policy(tmp_path, RL)
    posttrain_in_process("rl", "--in", "policy=outputs/policy", "--out", "outputs/rl_local")  # one machine: 1 worker process
    local = _weights(tmp_path / "outputs/rl_local/model")
    start = _weights(tmp_path / "outputs/policy/model")
    assert max(float((local[k] - start[k]).abs().max()) for k in local) > 1e-4  # the updates moved the weights
    history = _history(tmp_path / "outputs/rl_local")
    assert any(h["advantage_abs_mean"] > 0 for h in history) and history[-1]["async/token_lag_max"] == 1  # a signal; off-policy tokens

    # torchrun: rank 0 trains, rank 1 serves rollouts; rank 1 is killed once checkpoint 1 is on disk
    checkpoints = tmp_path / "outputs/.rl_dist.partial/checkpoints"
    run = _torchrun("--out", "outputs/rl_dist")
    deadline = time.monotonic() + 240
    while not (checkpoints / "step-000001").is_dir() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.poll() is None, run.communicate()[1][-3000:]
    os.kill(_rank_pid(run.pid, 1), signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = run.communicate(timeout=120)
    ended = time.monotonic() - killed
    assert run.returncode != 0 and ended < WORKERS["timeout_s"], (ended, stderr[-3000:])
    lines = [line for line in stderr.splitlines() if line.startswith("posttrain: error:")]
    # torchrun's SIGTERM, usually; gloo's closed connection when a broadcast to the dead rank was pending and noticed first;
    # the stage's own SIGTERM line when the kill lands after the trainer's loop (its signal context) has ended, as seen once
    # on a loaded box: the trainer was past its last step, saving, when torchrun stopped it
    sigterm = ("rl.mode async: torchrun stopped the trainer (SIGTERM): another rank of the job ended first "
               "(a rollout rank died or was killed; torchrun's summary names it)")
    after_loop = "terminated by SIGTERM (its MLflow run ends KILLED; a resumable stage goes on from its last checkpoint with --resume)"
    assert len(lines) == 1 and re.fullmatch(
        rf"posttrain: error: ({re.escape(sigterm)}|{re.escape(after_loop)}|rl.mode async: the weight broadcast of version \d+ failed: .+)",
        lines[0]), stderr[-3000:]
    assert not (tmp_path / "outputs/rl_dist").exists() and (checkpoints / "step-000001").is_dir()

    resumed = _torchrun("--out", "outputs/rl_dist", "--resume")
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr[-3000:]
    dist = _weights(tmp_path / "outputs/rl_dist/model")
    assert dist.keys() == local.keys() and all(torch.equal(dist[k], local[k]) for k in local)  # the same algorithm, bit for bit
    assert _history(tmp_path / "outputs/rl_dist") == history


@pytest.mark.heavy
def test_a_killed_free_running_torchrun_trainer_resumes_and_neither_loses_nor_repeats_a_prompt(tmp_path, monkeypatch):
    """Two rollout ranks, free-running, pool_policy none (nothing rejected), 4 updates of 2 prompts: the trainer
    SIGKILLs itself after checkpoint 2 (torchrun then stops the rollout ranks), and `--resume` runs to the end. The
    prompts trained by the two launches, plus those pooled or in flight when the resumed run stops, are exactly
    the prompts the stream handed out, prompt by prompt."""
    monkeypatch.chdir(tmp_path)
    free = {**WORKERS, "deterministic": False, "queued_groups": 4}
    _data_and_a_random_policy(tmp_path, {**RL, "steps": 4, "checkpoint_every": 2, "pool_policy": "none", "workers": free})
    record = tmp_path / "record.jsonl"
    script = Path(__file__).parents[1] / "async_record.py"
    killed = _torchrun("--out", "outputs/rl", processes=3, script=script, ASYNC_RECORD=str(record), ASYNC_KILL_AT="2")
    _, stderr = killed.communicate(timeout=300)
    assert killed.returncode != 0, stderr[-3000:]
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(rows) == 2 and all("trained" in r for r in rows), rows  # killed right after checkpoint 2, before stopping
    resumed = _torchrun("--out", "outputs/rl", "--resume", processes=3, script=script, ASYNC_RECORD=str(record))
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr[-3000:]
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    trained = [r for r in rows if "trained" in r]
    (end,) = [r for r in rows if "left" in r]
    assert len(trained) == 4 and len({r["pid"] for r in trained}) == 2
    every = Counter(p for r in trained for p in r["trained"])
    assert sum(every.values()) == 4 * 2 and every + Counter(end["left"]) == Counter(end["handed_out"])
    history = json.loads((tmp_path / "outputs/rl/history.json").read_text())
    assert len(history) == 4 and history[-1]["async/groups_rejected_total"] == 0 and history[-1]["async/groups_generated"] >= 8
