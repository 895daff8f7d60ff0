"""The arithmetic task, its verifier, and the registered reward functions."""

from __future__ import annotations

import operator
import re

import pytest
import torch

from posttrain.config import RewardSpec, TaskConfig
from posttrain.errors import UserError
from posttrain.rewards import reward_matrix, rewards
from posttrain.tasks import Example, build_task, tasks
from posttrain.tasks.arithmetic import Arithmetic

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def task_cfg(**kw) -> TaskConfig:
    base = dict(name="arithmetic", digits=2, operations=("+", "-", "*"), n_train=300, n_heldout=100, options={})
    return TaskConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def task() -> Arithmetic:
    return build_task(task_cfg())


def solve(prompt: str, digits: int) -> str:
    m = re.fullmatch(rf"(\d{{{digits}}})([-+*])(\d{{{digits}}})=", prompt)
    assert m, prompt
    return str(OPS[m.group(2)](int(m.group(1)), int(m.group(3))))


def test_registered():
    assert tasks.get("arithmetic") is Arithmetic
    assert isinstance(build_task(task_cfg()), Arithmetic)


def test_splits_sizes_and_disjoint(task):
    splits = task.splits(seed=0)
    assert set(splits) == {"train", "heldout"}
    assert len(splits["train"]) == 300 and len(splits["heldout"]) == 100
    train, heldout = {e.prompt for e in splits["train"]}, {e.prompt for e in splits["heldout"]}
    assert len(train) == 300 and len(heldout) == 100  # no duplicates inside a split
    assert not train & heldout


def test_splits_deterministic_in_seed(task):
    assert task.splits(0) == task.splits(0)
    assert task.splits(0) != task.splits(1)
    assert build_task(task_cfg()).splits(7) == task.splits(7)


def test_answers_are_correct(task):
    splits = task.splits(3)
    ops_seen = set()
    for example in splits["train"] + splits["heldout"]:
        assert len(example.prompt) == 2 * 2 + 2
        assert example.answer == example.completion == solve(example.prompt, 2)
        assert set(example.prompt) <= set(task.alphabet())
        assert set(example.completion) <= set(task.alphabet())
        ops_seen.add(example.prompt[2])
    assert ops_seen == {"+", "-", "*"}


def test_exhaustive_split_covers_every_problem():
    task = build_task(task_cfg(digits=1, operations=("+",), n_train=90, n_heldout=10))
    splits = task.splits(0)
    prompts = {e.prompt for e in splits["train"] + splits["heldout"]}
    assert prompts == {f"{a}+{b}=" for a in range(10) for b in range(10)}


def test_too_many_requested():
    with pytest.raises(UserError, match="exceeds"):
        build_task(task_cfg(digits=1, operations=("+",), n_train=90, n_heldout=11)).splits(0)


def test_zero_padded_operands():
    task = build_task(task_cfg(digits=3, operations=("-",), n_train=2000, n_heldout=1))
    prompts = [e.prompt for e in task.splits(0)["train"]]
    assert all(re.fullmatch(r"\d{3}-\d{3}=", p) for p in prompts)
    assert any(p.startswith("0") for p in prompts)
    assert any(solve(p, 3).startswith("-") for p in prompts)


EX = Example(prompt="37+48=", completion="85", answer="85")
NEG = Example(prompt="05-08=", completion="-3", answer="-3")


@pytest.mark.parametrize(
    ("completion", "finished", "example", "fmt", "correct"),
    [
        ("85", True, EX, 1.0, 1.0),
        ("85", False, EX, 0.0, 1.0),  # no EOS: badly formatted, but the answer is the right number
        ("085", True, EX, 0.0, 0.0),
        ("84", True, EX, 1.0, 0.0),
        ("-3", True, NEG, 1.0, 1.0),
        ("3", True, NEG, 1.0, 0.0),
        ("0", True, EX, 1.0, 0.0),
        ("", True, EX, 0.0, 0.0),
        ("8 5", True, EX, 0.0, 0.0),
        ("85=", True, EX, 0.0, 0.0),
        ("--3", True, NEG, 0.0, 0.0),
        ("+85", True, EX, 0.0, 0.0),
    ],
)
def test_format_and_correctness(task, completion, finished, example, fmt, correct):
    assert task.format_reward(completion, finished) == fmt
    assert task.correctness_reward(completion, finished, example) == correct


def test_parse(task):
    assert task.parse("85") == "85"
    assert task.parse("-3") == "-3"
    assert task.parse("085") is None
    assert task.parse("") is None


def test_reward_functions(task):
    examples = [EX, EX, NEG, EX]
    completions = ["85", "085", "-3", "85"]
    finished = [True, True, True, False]
    assert rewards.get("correctness")(task, examples, completions, finished).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert rewards.get("format")(task, examples, completions, finished).tolist() == [1.0, 0.0, 1.0, 0.0]


def test_reward_matrix(task):
    specs = (RewardSpec(name="format", weight=0.1), RewardSpec(name="correctness", weight=1.0))
    matrix, names, weights = reward_matrix(specs, task, [EX, EX, EX], ["85", "84", "x"], [True, True, True])
    assert names == ("format", "correctness")
    assert matrix.dtype == torch.float32 and matrix.shape == (3, 2)
    assert matrix.tolist() == [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]
    torch.testing.assert_close(weights, torch.tensor([0.1, 1.0]))
