"""`task.name: reasoning_gym`: seeded, disjoint train / held-out draws from a weighted list of reasoning-gym datasets,
and the `reasoning_gym` reward equal to the library's own `score_answer` on the library's generated answers (right,
wrong, partly right, missing)."""

from __future__ import annotations

import json

import pytest
import reasoning_gym

from helpers import REPO
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.rewards import reward_matrix
from posttrain.config import RewardSpec
from posttrain.tasks import build_task

DATASETS = [{"name": "basic_arithmetic", "weight": 2.0, "config": {"min_terms": 2, "max_terms": 3, "max_digits": 2}},
            {"name": "chain_sum", "weight": 1.0, "config": {"max_terms": 3}},
            {"name": "spell_backward", "weight": 1.0, "config": {}}]


def make_task(n_train: int = 40, n_heldout: int = 12, **options):
    overrides = ["task.name=reasoning_gym", f"task.n_train={n_train}", f"task.n_heldout={n_heldout}",
                 f"task.options.reasoning_gym.datasets={json.dumps(DATASETS)}"]
    overrides += [f"task.options.reasoning_gym.{k}={json.dumps(v)}" for k, v in options.items()]
    return build_task(resolve.load(REPO / "params.yaml", overrides).task)


def test_splits_are_seeded_weighted_and_disjoint():
    task = make_task()
    splits = task.splits(0)
    assert splits == make_task().splits(0) and splits != make_task().splits(1)
    train, heldout = splits["train"], splits["heldout"]
    assert len(heldout) == 12 and 0 < len(train) <= 40 and task.expected_sizes() == {"train": len(train), "heldout": 12}
    assert not {e.prompt for e in train} & {e.prompt for e in heldout}
    sources = [e.metadata["reasoning_gym"]["entry"]["metadata"]["source_dataset"] for e in heldout]
    assert sources.count("basic_arithmetic") == 6 and sources.count("chain_sum") == 3 and sources.count("spell_backward") == 3
    assert all(e.system == task.opts.system_prompt and e.completion == f"#### {e.answer}" for e in train)
    fixed = make_task(heldout_seed=7)
    assert fixed.splits(0)["heldout"] == fixed.splits(1)["heldout"]  # one held-out set for every pipeline seed


def test_the_reward_is_the_librarys_score_answer():
    task = make_task()
    examples = task.splits(0)["heldout"]
    libraries = [reasoning_gym.create_dataset(d["name"], size=1, seed=0, **d["config"]) for d in DATASETS]
    completions, expected = [], []
    for i, e in enumerate(examples):
        held = e.metadata["reasoning_gym"]
        answer = {0: e.answer, 1: e.answer + "1", 2: e.answer[:-1], 3: None}[i % 4]  # right, wrong, cut short, missing
        completions.append("Let me think.\n#### " + answer if answer is not None else "I do not know.")
        expected.append(libraries[held["spec"]].score_answer(answer, held["entry"]))
    scores, names, _ = reward_matrix([RewardSpec(name="reasoning_gym", weight=1.0)], task, examples, completions, [True] * len(examples))
    assert names == ("reasoning_gym",) and scores[:, 0].tolist() == pytest.approx(expected)
    assert 0 < sum(expected) < len(expected)
    assert [task.correctness_reward(c, True, e) for c, e in zip(completions, examples)] == [float(x >= 1.0) for x in expected]


def test_the_reward_refuses_another_task():
    task = build_task(resolve.load(REPO / "params.yaml").task)
    example = task.splits(0)["heldout"][0]
    with pytest.raises(UserError, match="reward reasoning_gym scores task.name reasoning_gym"):
        reward_matrix([RewardSpec(name="reasoning_gym", weight=1.0)], task, [example], ["#### 1"], [True])


@pytest.mark.parametrize("datasets, says", [
    ([{"name": "no_such_dataset"}], "unknown reasoning-gym dataset 'no_such_dataset'"),
    ([], "needs at least one dataset"),
])
def test_bad_settings_are_one_line(datasets, says):
    with pytest.raises(UserError, match=says):
        resolve.load(REPO / "params.yaml", ["task.name=reasoning_gym", f"task.options.reasoning_gym.datasets={json.dumps(datasets)}"])


def test_a_bad_dataset_config_is_one_line():
    task = build_task(resolve.load(REPO / "params.yaml", ["task.name=reasoning_gym", "task.n_train=4", "task.n_heldout=2",
                                                          'task.options.reasoning_gym.datasets=[{"name": "basic_arithmetic", "config": {"no_such_key": 1}}]']).task)
    with pytest.raises(UserError, match=r"task.options.reasoning_gym.datasets\[0\] \(basic_arithmetic\)"):
        task.splits(0)
