"""pass@k (the unbiased estimator of Chen et al. 2021) and majority@k over k samples, and their place in the
evaluation's metrics."""

from __future__ import annotations

import itertools
from math import comb
from types import SimpleNamespace

import pytest
import torch

from posttrain.eval import harness
from posttrain.eval.sampling import ks_for, majority_correct, pass_at_k, sample_metrics
from posttrain.rollout.samplers import Sampled
from posttrain.tasks import Example


@pytest.mark.parametrize("n, c, k", [(5, 2, 2), (8, 1, 4), (10, 3, 1), (4, 0, 2), (4, 4, 3), (6, 5, 2), (3, 1, 3)])
def test_pass_at_k_is_the_chance_that_k_draws_without_replacement_hold_a_correct_sample(n, c, k):
    samples = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_1_is_the_share_correct_and_bad_arguments_are_refused():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    assert ks_for(1) == [1] and ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6]


def test_majority_takes_the_most_common_parsed_answer_ties_to_the_first():
    assert majority_correct([("3", 0.0), ("4", 1.0), ("4", 1.0)]) == 1.0
    assert majority_correct([("3", 0.0), ("3", 0.0), ("4", 1.0), (None, 0.0), (None, 0.0)]) == 0.0  # no answer, no vote
    assert majority_correct([("4", 1.0), ("3", 0.0)]) == 1.0 and majority_correct([("3", 0.0), ("4", 1.0)]) == 0.0
    assert majority_correct([(None, 0.0)]) == 0.0


def test_the_evaluation_reports_pass_at_k_and_majority_over_its_samples(monkeypatch):
    texts = {1: ["7", "9"], 4: ["7", "1", "1", "x", "2", "2", "9", "9"]}  # greedy, then 4 samples for each of 2 prompts

    def fake_draw(name, model, tokenizer, prompts, request, options=None, generator=None):
        k = 1 if name == "greedy" else request.n
        n = len(texts[k])
        samples = SimpleNamespace(finished=torch.ones(n, dtype=torch.bool), completion_mask=torch.ones(n, 2))
        return Sampled(samples, texts[k], k, {"prompt": 2 * len(prompts), "generated": 2 * n})

    monkeypatch.setattr(harness, "draw", fake_draw)
    task = SimpleNamespace(
        correctness_reward=lambda text, finished, example: float(text == example.answer),
        format_reward=lambda text, finished: float(text.isdigit()),
        parse=lambda text: text if text.isdigit() else None,
        sample_metrics=lambda text, example: {},
    )
    model = torch.nn.Linear(1, 1)
    cfg = SimpleNamespace(n_prompts=2, samples_per_prompt=4, temperature=1.0, max_new_tokens=2, batch_size=2, n_table=0, stop=(),
                          sampler="temperature", group_by=())
    metrics, _ = harness.evaluate(model, None, task, [Example("a", "7", "7"), Example("b", "9", "9")], cfg, seed=0)
    # prompt a: 1 of 4 correct, majority "1" (wrong); prompt b: 2 of 4 correct, majority "2" first of a 2-2 tie (wrong)
    assert metrics["pass_at_1"] == pytest.approx(metrics["sampled_accuracy"]) == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert metrics["pass_at_2"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 2, 2)) / 2)
    assert metrics["pass_at_4"] == 1.0 and metrics["majority_at_4"] == 0.0
    # the chosen sampler (here the sampled pass itself) with its compute per answer: 2 prompt + 2 generated tokens
    assert metrics["sampler_pass_at_4"] == metrics["pass_at_4"] and metrics["sampler_forward_tokens_per_answer"] == pytest.approx(2.5)
    assert metrics["greedy_forward_tokens_per_answer"] == pytest.approx(4.0) and metrics["sampler_tokens_per_answer"] == 2.0
    assert sample_metrics([]) == {}
