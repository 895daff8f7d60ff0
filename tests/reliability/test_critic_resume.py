"""The `critic` stage (RFPO's success critic) killed after a checkpoint resumes to the weights, history and metrics of an
uninterrupted run (the labelled rollouts are drawn again from the seeded generator, the minibatch order is checkpointed)."""

from __future__ import annotations

import pytest

from helpers import copy_outputs, kill_resume_and_compare, micro_params

pytestmark = pytest.mark.slow
CRITIC = {"n_prompts": 8, "samples_per_prompt": 2, "n_heldout_prompts": 4, "steps": 6, "batch_size": 8, "lr": 0.01, "warmup_steps": 2,
          "max_grad_norm": 1.0, "log_every": 2, "checkpoint_every": 2}


def test_a_killed_critic_stage_resumes_bit_for_bit(pipeline_outputs, tmp_path):
    roots = []
    for name in ("straight", "resumed"):
        copy_outputs(pipeline_outputs, tmp_path / name)
        micro_params(tmp_path / name, critic=CRITIC)
        roots.append(tmp_path / name)
    history = kill_resume_and_compare(*roots, "critic", [], kill_at=2, in_process=True)
    assert len(history) == 6 and all(h["loss"] >= 0 for h in history)
