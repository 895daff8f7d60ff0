"""PPO killed mid-run resumes to the weights (policy and critic/), history and metrics of an uninterrupted run;
the kill falls inside the critic's warm-up, so the resumed run finishes the warm-up and then moves the policy."""

from __future__ import annotations

import pytest

from helpers import copy_outputs, kill_resume_and_compare, micro_params

pytestmark = pytest.mark.slow


def test_ppo_resume_after_kill_matches_uninterrupted_run(pipeline_outputs, tmp_path):
    steps = 4
    roots = []
    for name in ("straight", "resumed"):
        copy_outputs(pipeline_outputs, tmp_path / name)
        micro_params(tmp_path / name, rl={"steps": steps, "checkpoint_every": 1, "preset": "ppo", "critic": {"path": None, "lr": 0.0005, "warmup_steps": 2}})
        roots.append(tmp_path / name)
    history = kill_resume_and_compare(*roots, "rl", [], kill_at=1, in_process=True)
    assert [h["critic_warmup"] for h in history] == [1.0] * 2 + [0.0] * 2
    assert (roots[0] / "outputs" / "rl" / "critic" / "model.safetensors").is_file()  # compared with the policy
