"""Kill RL mid-run, resume from its checkpoint, finish: weights and metrics equal an uninterrupted run; the same
for the distillation methods that keep state between updates (declared states and side modules)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import POSTTRAIN, copy_outputs, fork_safe_params, kill_resume_and_compare, micro_params, posttrain

pytestmark = pytest.mark.slow
RL = {"steps": 40, "checkpoint_every": 5}


def prepare(pipeline_outputs: Path, root: Path) -> Path:
    copy_outputs(pipeline_outputs, root)
    micro_params(root, rl=RL)
    return root


def test_resume_after_kill_matches_uninterrupted_run(pipeline_outputs, tmp_path):
    straight, resumed = prepare(pipeline_outputs, tmp_path / "straight"), prepare(pipeline_outputs, tmp_path / "resumed")
    assert len(kill_resume_and_compare(straight, resumed, "rl", [], kill_at=10)) == RL["steps"]


# the methods with memory across updates: PR-OPD's projectors (a side module in the optimiser), GATS's success EMA
# and UniOPSD's correlation EMA (declared provider states); short warm start so the projectors train before the kill
STATEFUL = {
    "pr_opd": ["--set", "rl.options.pr_opd.warm_start=2"],
    "gats": [],  # rl.options.gats.teacher_success is null: S_T is measured by sampling the teacher at step 1
    "uniopsd": [],
}


@pytest.mark.parametrize("method", sorted(STATEFUL))
def test_stateful_distillation_resumes_bit_for_bit(pipeline_outputs, tmp_path, method):
    steps = 8
    sections = {"rl": {**RL, "checkpoint_every": 2}, "distill": {"method": method, "steps": steps, "prompts_per_step": 4}}
    roots = []
    for name in ("straight", "resumed"):
        copy_outputs(pipeline_outputs, tmp_path / name)
        fork_safe_params(tmp_path / name, **sections)
        roots.append(tmp_path / name)
    # in this process and a fork of it (the CLI's own kill -9 of a subprocess is the test above): the state under test
    # is the method's, which the in-process run keeps in the same checkpoints
    history = kill_resume_and_compare(*roots, "distill", STATEFUL[method], kill_at=4, in_process=True)
    assert len(history) == steps
    if method == "pr_opd":  # the representation term (and so the projectors) was live on both sides of the kill
        assert [h["pr_opd/rep_loss"] > 0 for h in history] == [False, False] + [True] * (steps - 2)


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
