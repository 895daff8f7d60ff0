"""Kill RL mid-run, resume from its checkpoint, finish: weights and metrics equal an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import POSTTRAIN, copy_outputs, micro_params, posttrain

pytestmark = pytest.mark.slow
RL = {"steps": 40, "checkpoint_every": 5}
TIMING_KEYS = {"tokens_per_s"}  # wall-clock dependent; everything else must match exactly


def deterministic(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in step.items() if k not in TIMING_KEYS} for step in history]


def prepare(pipeline_outputs: Path, root: Path) -> Path:
    copy_outputs(pipeline_outputs, root)
    micro_params(root, rl=RL)
    return root


def test_resume_after_kill_matches_uninterrupted_run(pipeline_outputs, tmp_path):
    straight = prepare(pipeline_outputs, tmp_path / "straight")
    posttrain("rl", cwd=straight)

    resumed = prepare(pipeline_outputs, tmp_path / "resumed")
    checkpoints = resumed / "outputs" / ".rl.partial" / "checkpoints"
    proc = subprocess.Popen([POSTTRAIN, "rl"], cwd=resumed, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (checkpoints / "step-000010").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be interrupted"
    stopped_at = sorted(p.name for p in checkpoints.glob("step-*"))
    assert stopped_at and stopped_at[-1] < "step-000040"

    posttrain("rl", "--resume", cwd=resumed)
    a = load_file(straight / "outputs" / "rl" / "model" / "model.safetensors")
    b = load_file(resumed / "outputs" / "rl" / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] == b[name]).all(), f"{name} differs after resume"
    history_a = json.loads((straight / "outputs" / "rl" / "history.json").read_text())
    history_b = json.loads((resumed / "outputs" / "rl" / "history.json").read_text())
    assert len(history_b) == RL["steps"]
    assert deterministic(history_a) == deterministic(history_b)
    metrics_a = json.loads((straight / "outputs" / "rl" / "metrics.json").read_text())
    assert metrics_a == json.loads((resumed / "outputs" / "rl" / "metrics.json").read_text())
    assert not (resumed / "outputs" / ".rl.partial").exists()


def test_resume_refuses_a_checkpoint_made_with_other_settings(pipeline_outputs, tmp_path):
    root = prepare(pipeline_outputs, tmp_path)
    checkpoints = root / "outputs" / ".rl.partial" / "checkpoints"
    proc = subprocess.Popen([POSTTRAIN, "rl"], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (checkpoints / "step-000005").is_dir() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = sorted(p.name for p in checkpoints.glob("step-*"))
    result = posttrain("rl", "--resume", "--set", "rl.lr=0.01", cwd=root, check=False)
    assert result.returncode == 2 and "other settings" in result.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in checkpoints.glob("step-*")) == kept, "checkpoints must survive a refused resume"
