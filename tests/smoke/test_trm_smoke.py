"""The reward_model stage with `reward_model.kind: trm` and the rl stage rewarded by the trained TRM, in-process on a
micro untrained SFT model (seconds): the stages run end to end and unparseable judgements score 0, never crash."""

from __future__ import annotations

import json

from helpers import MICRO_TRM, micro_params

from posttrain import resolve
from posttrain.data import write_examples
from posttrain.models import build_tiny, save_pretrained, train_char_tokenizer
from posttrain.stages import execute
from posttrain.tasks import build_task

def test_reward_model_kind_trm_then_rl_with_the_trm_reward(tmp_path):
    params = micro_params(tmp_path, reward_model={"kind": "trm", "data": "task_pairs", "n_pairs": 12, "n_heldout_pairs": 4, "steps": 2,
                                                  "batch_size": 8, "log_every": 1, "warmup_steps": 0,
                                                  "rl_rewards": [{"name": "trm"}, {"name": "correctness", "weight": 0.0}],
                                                  "options": {"bt": {"pooling": "last", "sft_weight": 0.0}, "trm": MICRO_TRM}})
    cfg = resolve.load(params, ["tracking.enabled=false", "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2",
                               "rl.rewards=[{name: trm}, {name: correctness, weight: 0.0}]", f"rl.options.trm.path={tmp_path / 'rm'}"])
    task = build_task(cfg.task)
    splits = task.splits(0)
    (tmp_path / "data").mkdir()
    for name, rows in splits.items():
        write_examples(tmp_path / "data" / f"{name}.jsonl", rows)
    tokenizer = train_char_tokenizer([task.alphabet()])
    save_pretrained(build_tiny(cfg.model, tokenizer), tokenizer, tmp_path / "sft" / "model")
    inputs = {"data": tmp_path / "data", "policy": tmp_path / "sft"}

    metrics = execute("reward_model", cfg, inputs, tmp_path / "rm")
    assert {"heldout_pair_accuracy", "heldout_pair_accuracy_warmup", "score_std", "score_extreme_fraction", "parse_rate"} <= set(metrics)
    assert 0.0 <= metrics["parse_rate"] <= 1.0 and (tmp_path / "rm" / "model" / "trm.json").is_file()

    execute("rl", cfg, inputs, tmp_path / "rl")
    history = json.loads((tmp_path / "rl" / "history.json").read_text())
    assert len(history) == 2 and all(0.0 <= h["reward/trm_mean"] <= 1.0 and "accuracy" in h for h in history)
