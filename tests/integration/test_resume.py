"""Kill RL mid-run, resume from its checkpoint, finish: weights and metrics equal an uninterrupted run; the same
for the distillation methods that keep state between updates (declared states and side modules)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
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


def test_a_killed_free_running_async_run_neither_loses_nor_repeats_a_prompt(pipeline_outputs, tmp_path, monkeypatch):
    """rl.mode async, free-running workers, pool_policy none (nothing rejected): the CLI in a fork of this process is
    SIGKILLed right after checkpoint 2 (workers alive, jobs in flight), then `--resume`d to the end. Every prompt
    the prompt stream handed out is trained exactly once across the two processes, or still pooled or in flight
    when the resumed run stops: counted, prompt by prompt."""
    from helpers import _kill_a_fork, posttrain_here
    from posttrain.cli import _register_stage_commands
    from posttrain.trainers import async_rl
    from posttrain.trainers.online_rl import PromptStream

    _register_stage_commands()  # imported here, once: not again in the fork and again after it

    record = tmp_path / "record.jsonl"  # appended by the killed process and the resumed one; survives a SIGKILL
    samples_of, stop = async_rl.AsyncRollouts.samples_of, async_rl.AsyncRollouts.stop

    def write(row):
        with record.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def trained(self, groups):
        out = samples_of(self, groups)
        write({"pid": os.getpid(), "trained": [self.run.examples[i].prompt for i in out[2]]})
        return out

    def stopped(self):
        left = [self.run.examples[j.example].prompt for j in self.pending.values()]
        left += [self.run.examples[p["example"]].prompt for p in self.payloads.values()]
        write({"pid": os.getpid(), "left": left, "handed_out": [e.prompt for e in PromptStream(self.run.examples, self.run.seed).take(self.next_number)]})
        stop(self)

    monkeypatch.setattr(async_rl.AsyncRollouts, "samples_of", trained)
    monkeypatch.setattr(async_rl.AsyncRollouts, "stop", stopped)
    copy_outputs(pipeline_outputs, tmp_path)
    workers = {"count": 2, "queued_groups": 8, "timeout_s": 60, "deterministic": False, "refresh_every_tokens": 2}
    fork_safe_params(tmp_path, rl={**RL, "steps": 4, "checkpoint_every": 2, "mode": "async", "pool_policy": "none", "workers": workers})
    _kill_a_fork("rl", [], tmp_path, tmp_path / "outputs" / ".rl.partial" / "checkpoints", kill_at=2)
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    killed = [r for r in rows if "trained" in r]
    assert len(killed) == 2 and not [r for r in rows if "left" in r], "the fork died right after checkpoint 2, before stopping"
    posttrain_here("rl", "--resume", cwd=tmp_path)
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    resumed = [r for r in rows[len(killed):] if "trained" in r]
    (end,) = [r for r in rows if "left" in r]
    assert len(resumed) == 2 and {r["pid"] for r in resumed} == {os.getpid()} != {r["pid"] for r in killed}
    every = Counter(p for r in killed + resumed for p in r["trained"])
    assert sum(every.values()) == 4 * 4 and end["left"]  # 4 prompts a step; jobs were still out when the run stopped
    assert every + Counter(end["left"]) == Counter(end["handed_out"])
    assert json.loads((tmp_path / "outputs" / "rl" / "history.json").read_text())[-1]["async/groups_rejected_total"] == 0
