"""The reward_model and preference stages on the micro config, the `bt` reward inside RL, and their user errors."""

from __future__ import annotations

import json

import pytest

from helpers import MICRO_PAIRS, copy_outputs, micro_params, posttrain

@pytest.fixture
def upstream(pipeline_outputs, tmp_path):
    copy_outputs(pipeline_outputs, tmp_path)
    micro_params(tmp_path, reward_model=MICRO_PAIRS, preference=MICRO_PAIRS)
    return tmp_path


def test_preference_stage_trains_and_reports(upstream):
    out = posttrain("preference", "--set", "preference.objective=gm_dpo", cwd=upstream)
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"heldout_pair_accuracy", "heldout_pair_accuracy_before", "greedy_accuracy", "greedy_accuracy_before"} <= set(metrics)
    assert metrics["heldout_pair_accuracy_before"] == 0.0  # policy == reference: every implicit margin is exactly 0
    stage = upstream / "outputs" / "preference"
    assert (stage / "model" / "config.json").is_file() and len((stage / "pairs_train.jsonl").read_text().splitlines()) == 40
    history = json.loads((stage / "history.json").read_text())
    assert len(history) == 3 and all("rewards/accuracy" in h for h in history)


def test_reward_model_stage_then_rl_with_the_bt_reward(upstream):
    metrics = json.loads(posttrain("reward_model", cwd=upstream).stdout.strip().splitlines()[-1])
    assert 0.0 <= metrics["heldout_pair_accuracy"] <= 1.0 and metrics["n_pairs"] > 0
    assert (upstream / "outputs" / "reward_model" / "model" / "bt_pooling.json").is_file()
    posttrain("rl_rm", "--set", "rl.steps=2", cwd=upstream)  # reward_model.rl_rewards: bt + correctness at weight 0
    history = json.loads((upstream / "outputs" / "rl_rm" / "history.json").read_text())
    assert len(history) == 2 and all("reward/bt_mean" in h and "accuracy" in h for h in history)


def one_line_error(result, *needles):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_malformed_pair_file_is_one_line_and_writes_nothing(upstream):
    bad = upstream / "pairs.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n" + json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n")
    result = posttrain("preference", "--set", f"preference.pairs={bad}", cwd=upstream, check=False)
    one_line_error(result, f"{bad}:2", "missing field 'rejected'")
    assert not (upstream / "outputs" / "preference").exists() and not (upstream / "outputs" / ".preference.partial").exists()


def test_rl_with_bt_but_no_reward_model_is_one_line(upstream):
    result = posttrain("rl", "--set", "rl.rewards=[{name: bt}]", "--set", "rl.options.bt.path=outputs/nothing_here", "--out", "outputs/rl_bt",
                       cwd=upstream, check=False)
    one_line_error(result, "rl.options.bt.path", "reward_model")
    assert not (upstream / "outputs" / "rl_bt").exists()
