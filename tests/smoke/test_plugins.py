"""Your own reward and a plugin, end to end: `posttrain rl` with a reward and an advantage estimator from an
installed plugin (entry point `posttrain.plugins`, found by importlib.metadata), a `module:attr` reward from the
working directory and the math_verify verifier, all picked with --set."""

from __future__ import annotations

import json
import os
import subprocess

from helpers import POSTTRAIN, copy_outputs, install_plugin, micro_params

PLUGIN = '''
import torch


def register(registries):
    @registries["rewards"].register("completion_length")
    def completion_length(task, examples, completions, finished):
        """The completion's length in characters."""
        return torch.tensor([float(len(c)) for c in completions])

    @registries["advantages"].register("constant_quarter", needs=())
    def constant_quarter(batch, cfg):
        """Advantage 0.25 for every sample (visible as advantage_abs_mean)."""
        return torch.full((batch.size,), 0.25, device=batch.rewards.device)
'''

USER_REWARDS = '''
def first_digit_odd(prompts, completions, answer, **metadata):
    """1 when the completion starts with an odd digit; None (unscored) for one that starts with none."""
    return [float(int(c[0]) % 2) if c[:1].isdigit() else None for c in completions]
'''


def test_rl_with_a_plugin_reward_and_estimator_and_a_module_attr_reward(pipeline_outputs, tmp_path):
    copy_outputs(pipeline_outputs, tmp_path)
    # no MLflow: a fresh store costs seconds (a reward's `module:attr` name is a valid MLflow metric key: colons pass)
    micro_params(tmp_path, rl={"steps": 2, "checkpoint_every": 0, "prompts_per_step": 4, "group_size": 4}, tracking={"enabled": False})
    install_plugin(tmp_path / "site", "demo_posttrain_plugin", PLUGIN, "demo = demo_posttrain_plugin:register")
    (tmp_path / "my_rewards.py").write_text(USER_REWARDS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))}
    rewards = "[{name: completion_length, weight: 0.1}, {name: 'my_rewards:first_digit_odd'}, {name: math_verify}, {name: correctness}]"
    args = ["rl", "--set", f"rl.rewards={rewards}", "--set", "rl.advantage=constant_quarter", "--out", "outputs/rl_plugin"]
    result = subprocess.run([POSTTRAIN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    history = json.loads((tmp_path / "outputs" / "rl_plugin" / "history.json").read_text())
    assert len(history) == 2
    for metrics in history:
        assert metrics["advantage_abs_mean"] == 0.25  # the plugin's estimator made the advantages
        assert metrics["reward/completion_length_mean"] > 0  # the plugin's reward scored the completions
        assert 0 <= metrics["reward/my_rewards:first_digit_odd_mean"] <= 1
        assert metrics["reward/math_verify_mean"] >= metrics["reward/correctness_mean"]  # it accepts what the task accepts (and "085")
    assert sum(m["reward/completion_length_std"] + m["reward/my_rewards:first_digit_odd_std"] for m in history) > 0
