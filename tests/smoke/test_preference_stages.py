"""The reward_model and preference stages on the micro config, and the `bt` reward inside RL (their user errors:
tests/reliability/test_bad_inputs.py)."""

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
    assert metrics["pair_prompts_in_rl"] == 0.0  # reward_model.prompts: disjoint (the default): no pair asks an RL prompt
    assert (upstream / "outputs" / "reward_model" / "model" / "bt_pooling.json").is_file()
    posttrain("rl_rm", "--set", "rl.steps=2", cwd=upstream)  # reward_model.rl_rewards: bt + correctness at weight 0
    history = json.loads((upstream / "outputs" / "rl_rm" / "history.json").read_text())
    assert len(history) == 2 and all("reward/bt_mean" in h and "accuracy" in h for h in history)



def test_rl_rm_reads_a_plain_reward_model_checkpoint(upstream):
    """`--in reward_model=DIR` takes a published reward model as it is: a plain `save_pretrained` sequence-classification
    checkpoint with one label (here a random one with the policy's tokenizer), no reward_model stage run."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    sft = upstream / "outputs" / "sft" / "model"
    config = AutoConfig.from_pretrained(sft, num_labels=1)
    plain = upstream / "published_rm"
    AutoModelForSequenceClassification.from_config(config).save_pretrained(plain)
    AutoTokenizer.from_pretrained(sft).save_pretrained(plain)
    posttrain("rl_rm", "--set", "rl.steps=2", "--in", f"reward_model={plain}", cwd=upstream)
    history = json.loads((upstream / "outputs" / "rl_rm" / "history.json").read_text())
    assert len(history) == 2 and all(h["reward/bt_std"] > 0 for h in history)  # it scores, and completions differ
    failed = posttrain("rl_rm", "--set", "rl.steps=2", "--set", "rl.options.bt.clip=true", "--in", f"reward_model={plain}",
                       "--out", str(upstream / "outputs" / "rl_rm_clip"), cwd=upstream, check=False)
    assert failed.returncode != 0 and "no held-out range" in failed.stderr.strip().splitlines()[-1]
