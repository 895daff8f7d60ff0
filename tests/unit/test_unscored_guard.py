"""A reward that scores nothing trains nothing: more than `training.max_unscored_steps` consecutive RL steps in which
no completion was scored (every reward None/NaN) stop the run with one line naming the silent reward; a step with
some unscored completions warns once with their share (issue 38, item 1)."""

from __future__ import annotations

import sys

import pytest

from helpers import micro_rl_parts
from posttrain.errors import UserError
from posttrain.rewards import rewards
from posttrain.trainers.online_rl import RLRun
from posttrain.trainers.rl import train_online_rl

USER_MODULE = '''
def nothing(prompts, completions, **metadata):
    return [None] * len(completions)

def half(prompts, completions, **metadata):
    return [None if i % 2 else 1.0 for i in range(len(completions))]
'''
RL = ["rl.max_new_tokens=4", "rl.prompts_per_step=2", "rl.group_size=2", "rl.steps=6", "rl.warmup_steps=0"]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    monkeypatch.setattr(rewards, "_entries", dict(rewards._entries))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    name = f"unscored_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def run(directory, reward: str, **run_fields):
    cfg, task, examples, tokenizer, _, model = micro_rl_parts(directory, [*RL, f"rl.rewards=[{{name: '{reward}'}}]"], 8)
    rl_run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=directory / "ckpt", config_hash="x", **run_fields)
    return train_online_rl(rl_run, False, on_log=lambda step, m: None)


def test_a_reward_that_scores_nothing_stops_the_run_in_one_line_naming_it(tmp_path, user_module):
    with pytest.raises(UserError) as stopped:
        run(tmp_path, f"{user_module}:nothing", max_unscored_steps=2)
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("step 3: no completion was scored on 3 consecutive steps"), message
    assert f"reward '{user_module}:nothing' returned nothing" in message and "training.max_unscored_steps is 2" in message


def test_some_unscored_completions_warn_once_with_their_share(tmp_path, user_module, capsys):
    history, _ = run(tmp_path, f"{user_module}:half", max_unscored_steps=0)
    assert len(history) == 6
    warnings = [line for line in capsys.readouterr().err.splitlines() if "got no score" in line]
    assert len(warnings) == 1 and "50% of the completions" in warnings[0], warnings


@pytest.mark.slow
def test_the_rl_stage_stops_with_one_line_when_its_only_reward_scores_nothing(tmp_path, monkeypatch, capsys, user_module):
    """The installed CLI on the micro config: training.max_unscored_steps reaches the trainer; exit 2, one line."""
    from helpers import micro_params, posttrain, posttrain_main

    micro_params(tmp_path, tracking={"enabled": False})
    for stage in ("data", "sft"):
        assert posttrain_main(monkeypatch, capsys, stage)[0] == 0
    result = posttrain("rl", "--set", f"rl.rewards=[{{name: '{user_module}:nothing'}}]", "--set", "rl.steps=4",
                       "--set", "training.max_unscored_steps=1", cwd=tmp_path, check=False)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("posttrain: error: step 2: no completion was scored on 2 consecutive steps"), lines[0]
    assert f"reward '{user_module}:nothing' returned nothing" in lines[0]
