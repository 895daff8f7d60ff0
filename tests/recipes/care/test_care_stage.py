"""The care stage on a micro config, then its generator as the `care` reward of online RL on the dialogue task."""

from __future__ import annotations

import json

from helpers import MICRO_CARE, micro_params


def test_care_stage_trains_a_generator_that_rewards_dialogue_rl(tmp_path):
    from posttrain.resolve import load
    from posttrain.stages import execute

    params = micro_params(tmp_path, care=MICRO_CARE)
    out = tmp_path / "outputs" / "care"
    metrics = execute("care", load(params), {}, out)  # in process: what `posttrain care` runs, without a second interpreter
    for key in ("weight_error", "pair_accuracy", "top2_agreement", "parse_rate"):
        assert 0.0 <= metrics[key] <= 1.0 and f"{key}_sft" in metrics
    assert json.loads((out / "metrics.json").read_text()) == metrics and json.loads((out / "mlflow_run.json").read_text())["run_id"]
    assert (out / "model" / "config.json").is_file() and len(json.loads((out / "history.json").read_text())) == 2

    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task
    from posttrain.trainers.online_rl import OnlineRL, RLRun

    cfg = load(params, ["task.name=dialogue", "task.n_train=8", "task.n_heldout=2", "rl.max_new_tokens=5",
                        "rl.rewards=[{name: care}, {name: correctness, weight: 0.0}]", f"rl.options.care.path={out}"])
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    policy = build_tiny(cfg.model, tokenizer)
    run = RLRun(policy, tokenizer, task, task.splits(0)["train"], cfg.rl, 0, tmp_path / "ckpt", "h")
    result = OnlineRL(run, total_steps=2).step(run.examples[:4])
    assert result.batch.reward_names == ("care", "correctness")
    care = result.batch.rewards[:, 0]
    assert bool(((care >= 0) & (care <= 1)).all()) and "reward/care_mean" in result.metrics
