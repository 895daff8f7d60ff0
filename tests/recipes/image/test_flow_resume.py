"""flow_rl resume at micro size: a run stopped after a checkpoint and resumed ends with the same weights and
the same history as an uninterrupted run; a checkpoint made under other settings is refused."""

from __future__ import annotations

import pytest
import torch

from helpers import deterministic, micro_edits, repo_params
from posttrain.recipes.image.settings import FlowModelConfig, FlowRLConfig
from posttrain.recipes.image.vigor.edits import Edits
from posttrain.errors import UserError
from posttrain.recipes.image.flow import build_flow_model
from posttrain.recipes.image.grpo import train_flow_rl
from posttrain.trainers.loop import TrainLoop

PARAMS = repo_params()
MODEL = FlowModelConfig.model_validate({**PARAMS["flow"], "block_channels": [8, 16], "text_dim": 16})
RL = FlowRLConfig.model_validate({**PARAMS["flow_rl"], "steps": 4, "prompts_per_step": 2, "group_size": 2, "sampling_steps": 3,
                                  "checkpoint_every": 2, "lr": 1e-3})
SIZE = 8


class Stop(Exception):
    pass


def edits(n: int = 3) -> Edits:
    return micro_edits(n, SIZE)


def fresh_model():
    torch.manual_seed(0)
    return build_flow_model(MODEL, SIZE)


def checkpoints(directory, config_hash: str, resume: bool) -> TrainLoop:
    return TrainLoop(directory, config_hash, RL.checkpoint_every, resume)


def stop_at(step: int):
    def on_log(index: int, metrics: dict) -> None:
        if index == step:
            raise Stop

    return on_log


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    straight = fresh_model()
    history = train_flow_rl(straight, edits(), RL, 0, on_log=lambda *_: None, loop=checkpoints(tmp_path / "a", "h", False))

    with pytest.raises(Stop):  # dies in step 3, after the step-2 checkpoint
        train_flow_rl(fresh_model(), edits(), RL, 0, on_log=stop_at(3), loop=checkpoints(tmp_path / "b", "h", False))
    assert sorted(p.name for p in (tmp_path / "b").glob("step-*")) == ["step-000002"]
    torch.manual_seed(123)  # a new process: other global RNG state, restored from the checkpoint
    resumed = fresh_model()
    resumed_history = train_flow_rl(resumed, edits(), RL, 0, on_log=lambda *_: None, loop=checkpoints(tmp_path / "b", "h", True))

    assert [row["step"] for row in resumed_history] == [1, 2, 3, 4]
    assert deterministic(resumed_history) == deterministic(history)  # all but the wall-clock keys (step_seconds, tokens_per_s)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs after resume"
    assert sorted(p.name for p in (tmp_path / "a").glob("step-*")) == ["step-000002"]  # none at the last step


def test_resume_refuses_a_checkpoint_made_with_other_settings(tmp_path):
    with pytest.raises(Stop):
        train_flow_rl(fresh_model(), edits(), RL, 0, on_log=stop_at(3), loop=checkpoints(tmp_path, "h", False))
    with pytest.raises(UserError, match="other settings"):
        train_flow_rl(fresh_model(), edits(), RL, 0, on_log=lambda *_: None, loop=checkpoints(tmp_path, "other", True))
