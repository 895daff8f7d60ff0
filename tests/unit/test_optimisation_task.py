"""The optimisation task (tasks/optimisation.py): instances, the verifier, strategies that differ in success, and
a non-zero SDRL diversity bonus on it (on every other task the bonus is identically 0)."""

from __future__ import annotations

import pytest
import torch

from helpers import REPO
from posttrain import resolve
from posttrain.rewards import rewards
from posttrain.tasks import Example, build_task
from posttrain.tasks.optimisation import STRATEGIES, greedy, optimum

STRATEGY_PATTERNS = {"exact": ["^d:"], "greedy": ["^g:"], "search": ["^r:"]}


@pytest.fixture(scope="module")
def task():
    cfg = resolve.load(REPO / "params.yaml", ["task.name=optimisation", "task.n_train=300", "task.n_heldout=60"])
    return build_task(cfg.task)


def test_splits_are_deterministic_disjoint_and_mix_families_and_strategies(task):
    a = task.splits(0)
    assert a == task.splits(0) and a != task.splits(1)
    assert len(a["train"]) == 300 and len(a["heldout"]) == 60
    assert not {e.prompt for e in a["train"]} & {e.prompt for e in a["heldout"]}
    assert {e.prompt[0] for e in a["train"]} == {"k", "a"} and {e.completion[0] for e in a["train"]} == set(STRATEGIES)
    for e in a["train"][:50]:
        assert set(e.prompt + e.completion) <= set(task.alphabet())


def test_verifier_by_hand(task):
    knap = Example(prompt="k3312,5339,4>", completion="", answer="12")  # weights 3 3 1 2, values 5 3 3 9, capacity 4
    assert optimum("k", ([3, 3, 1, 2], [5, 3, 3, 9], 4)) == 12  # items 3 + 4: weight 3, value 12
    assert task.correctness_reward("d:0011", True, knap) == 1.0
    assert task.correctness_reward("g:0011", True, knap) == 1.0  # the strategy label does not change the verdict
    assert task.correctness_reward("d:1001", True, knap) == 0.0  # weight 5 > 4: infeasible
    assert task.correctness_reward("d:0001", True, knap) == 0.0  # feasible, value 9 < 12
    assert task.correctness_reward("d:00111", True, knap) == 0.0 and task.correctness_reward("x:0011", True, knap) == 0.0
    assign = Example(prompt="a295,517,741>", completion="", answer=str(optimum("a", [[2, 9, 5], [5, 1, 7], [7, 4, 1]])))
    assert assign.answer == "-4" and task.correctness_reward("g:012", True, assign) == 1.0  # 2 + 1 + 1
    assert task.correctness_reward("d:011", True, assign) == 0.0  # not a permutation
    # greedy by value/weight takes item 3 (5/3) first, then nothing fits: value 5, where items 1 + 2 give 6
    assert greedy("k", ([2, 2, 3], [3, 3, 5], 4)) == "001" and optimum("k", ([2, 2, 3], [3, 3, 5], 4)) == 6
    assert task.strategy("r:0101") == "r" and task.strategy("r0101") is None


def test_strategies_differ_in_success_and_by_family(task):
    rates = {}
    for e in task.splits(0)["train"]:
        rates.setdefault((e.prompt[0], e.completion[0]), []).append(task.correctness_reward(e.completion, True, e))
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    for family in ("k", "a"):
        assert mean[family, "d"] == 1.0 > mean[family, "g"] > mean[family, "r"]
    assert abs(mean["k", "g"] - mean["a", "g"]) > 0.05 or abs(mean["k", "r"] - mean["a", "r"]) > 0.05


def test_sdrl_bonus_is_non_zero_on_this_task(task):
    """Two correct rollouts of one instance that name different strategies: the between-strategy bonus pays the
    rarer one, so sdrl differs from correctness (on arithmetic every correct answer is the same string)."""
    cfg = resolve.load(REPO / "params.yaml", ["task.name=optimisation"])
    block = {**cfg.rl.options_for("sdrl").model_dump(), "strategies": STRATEGY_PATTERNS}
    rl = resolve.updated(cfg.rl, "rl", options={"sdrl": block})
    knap = Example(prompt="k3312,5339,4>", completion="d:0011", answer="12")
    completions = ["d:0011", "d:0011", "g:0011", "r:0001"]
    score = rewards.get("sdrl")(task, [knap] * 4, completions, [True] * 4, rl=rl)
    correct = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert score[3] == 0.0 and (score[:3] >= 1.0).all()
    bonus = score - correct
    assert bonus[2] > bonus[0] > 0  # the lone greedy success gets the largest between-strategy bonus
