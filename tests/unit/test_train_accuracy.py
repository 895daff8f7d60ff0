"""The RL stage's train accuracy is the task verifier's, whatever rewards the run optimises, and is absent (not 0.0)
when nothing measured it."""

from __future__ import annotations

import math

import torch

from helpers import REPO, micro_rl_parts
from posttrain.rollout import RolloutBatch
from posttrain.stages.rl import history_accuracy
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun, train_accuracy


def _batch(names: tuple[str, ...], rewards: list[list[float]]) -> RolloutBatch:
    n = len(rewards)
    zeros = torch.zeros(n, 2)
    return RolloutBatch(prompt_ids=zeros.long(), prompt_mask=zeros.long(), completion_ids=zeros.long(), completion_mask=zeros.long(),
                        group=torch.zeros(n, dtype=torch.long), old_logp=zeros, rewards=torch.tensor(rewards), reward_names=names,
                        reward_weights=torch.ones(len(names)))


def test_accuracy_comes_from_the_verifier_without_a_correctness_reward(tmp_path):
    cfg, task, examples, *_ = micro_rl_parts(tmp_path, [], 4)
    texts = [examples[0].completion, "nonsense", examples[2].completion, examples[3].completion + "9"]
    expected = sum(task.correctness_reward(t, True, e) for t, e in zip(texts, examples)) / 4
    assert expected == 0.5
    # regex-like reward at 0.19 mean, no correctness column: the verifier still decides (the old code reported 0.0)
    batch = _batch(("format",), [[0.19]] * 4)
    assert train_accuracy(task, batch, examples, texts, [True] * 4) == expected
    # with the correctness column, its values are the measurement (the same verifier, not run twice)
    assert train_accuracy(task, _batch(("correctness", "format"), [[1, 0], [0, 0], [1, 1], [1, 1]]), examples, texts, [True] * 4) == 0.75
    # unjudged samples (NaN) are left out; none judged: NaN, not 0
    assert train_accuracy(task, _batch(("correctness",), [[1], [math.nan], [0], [math.nan]]), examples, texts, [True] * 4) == 0.5
    assert math.isnan(train_accuracy(task, _batch(("correctness",), [[math.nan]] * 4), examples, texts, [True] * 4))


def test_final_train_accuracy_is_absent_when_unmeasured():
    assert history_accuracy([{"loss": 1.0}, {"loss": 0.5}]) is None
    assert history_accuracy([{"accuracy": math.nan}, {"accuracy": 0.25}, {"accuracy": 0.75}]) == 0.5


def test_an_rl_step_without_correctness_reports_the_verifiers_accuracy(tmp_path):
    cfg, task, examples, tokenizer, state, model = micro_rl_parts(tmp_path, ["rl.rewards=[{name: format}]", "rl.max_new_tokens=4",
                                                                             "rl.prompts_per_step=3", "rl.group_size=2"], 12)
    run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x")
    metrics = OnlineRL(run, total_steps=1).step(PromptStream(examples, 0).take(3)).metrics
    assert "accuracy" in metrics and 0.0 <= metrics["accuracy"] <= 1.0
