"""The reward_model / preference sections: registry names, per-method options and pair files are checked at load."""

from __future__ import annotations

import pytest
from helpers import repo_params

from posttrain.resolve import load
from posttrain.errors import UserError


@pytest.mark.parametrize("override,needle", [
    ("preference.objective=dpoo", "unknown preference objective 'dpoo'; did you mean 'dpo'"),
    ("preference.data=task_pair", "did you mean 'task_pairs'"),
    ("reward_model.kind=btt", "unknown reward model 'btt'"),
    ("reward_model.prompts=overlap", "reward_model.prompts"),
    ("preference.pairs=no/such/pairs.jsonl", "preference file not found: no/such/pairs.jsonl"),
    ("preference.options.gm_dpo.gamma=-1", "preference.options.gm_dpo.gamma"),
    ("preference.options.gm_dpo.zeta=1", "preference.options.gm_dpo.zeta"),
    ("preference.options.nobody={}", "preference.options.nobody: no registered preference objective named 'nobody'"),
    ("preference.options.abc_align.fixed_alpha=1.5", "preference.options.abc_align.fixed_alpha"),
    ("reward_model.options.bt.pooling=mean", "reward_model.options.bt.pooling"),
    ("reward_model.rl_rewards=[]", "reward_model.rl_rewards: needs at least one reward"),
    ("preference.beta=0", "preference.beta"),
])
def test_bad_settings_name_the_key(params_path, override, needle):
    with pytest.raises(UserError) as err:
        load(params_path, [override])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_selected_objective_without_a_block_runs_on_its_defaults(params_path, tmp_path):
    from posttrain.objectives.gm_dpo import GMDPOOptions

    cfg = load(params_path, ["preference.objective=gm_dpo", "preference.options={}"])
    assert cfg.preference.options_for("gm_dpo") == GMDPOOptions()


def test_defaults_resolve_per_method_options(cfg, params_path):
    written = repo_params(params_path)
    assert cfg.preference.options_for("gm_dpo").gamma == written["preference"]["options"]["gm_dpo"]["gamma"]
    assert cfg.reward_model.options_for("bt").pooling == written["reward_model"]["options"]["bt"]["pooling"] == "response_sum"


def test_rl_rm_reward_must_be_the_trained_kind(params_path):
    with pytest.raises(UserError, match="reward_model.rl_rewards: bt is not the trained reward_model.kind"):
        load(params_path, ["reward_model.kind=trm"])
    cfg = load(params_path, ["reward_model.kind=trm", "reward_model.rl_rewards=[{name: trm}]"])
    assert cfg.reward_model.options_for("trm").pairwise_reward in ("pd_grpo", "pairwise_margin")
