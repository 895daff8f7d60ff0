"""Rewards written as plain functions (`rl.rewards: [{name: "my_pkg.rewards:score"}]`), TRL-style:

    score(prompts: list[str], completions: list[str], **metadata) -> list[float | None]

called with keywords once per batch (the G samples of a prompt repeat its prompt), `metadata` holding one list
per extra column of the examples, aligned with `completions` (`answer`: the reference answer). A score of None
(or NaN, or an infinite one) means "could not score this completion": it becomes NaN, which the estimators treat
as unscored and `reward/nan_count` counts. A call that raises stops the run with one line naming the function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import UserError
from posttrain.tasks import Example

# the columns passed as metadata besides a dataset's own (`Example.metadata`): the reference answer; the prompt is
# an argument of its own and the reference completion is left out (as TRL does)
_COLUMNS = ("answer",)


def example_columns(examples: Sequence[Example]) -> dict[str, list[Any]]:
    """The examples' extra columns as per-row lists: `answer`, plus the keys of an example's `metadata` mapping
    when examples carry one (a key missing from some example is None there)."""
    columns: dict[str, list[Any]] = {name: [getattr(e, name) for e in examples] for name in _COLUMNS}
    extra = [getattr(e, "metadata", None) or {} for e in examples]
    for key in sorted({k for m in extra for k in m} - set(columns)):
        columns[key] = [m.get(key) for m in extra]
    return columns


def as_score(value: Any, name: str, index: int) -> float:
    """One returned score as a float: None, NaN and +-inf -> NaN (unscored); anything but a number is a UserError."""
    if value is None:
        return math.nan
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise UserError(f"reward {name}: score {index} is a {type(value).__name__} ({value!r:.40}), expected a number or None")
    score = float(value)
    return score if math.isfinite(score) else math.nan


def from_function(fn: Callable[..., Sequence[Any]], name: str):
    """`fn` (the signature above) as a registered reward: RewardFn(task, examples, completions, finished) -> [N]."""

    def reward(task, examples: Sequence[Example], completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
        try:
            scores = fn(prompts=[e.prompt for e in examples], completions=list(completions), **example_columns(examples))
        except Exception as e:  # the user's code: its error, named, in one line
            message = str(e).splitlines()[0] if str(e) else ""
            raise UserError(f"reward {name} raised {type(e).__name__}: {message}"[:300]) from None
        try:
            scores = list(scores)
        except TypeError:
            raise UserError(f"reward {name} returned a {type(scores).__name__}, expected a list of scores") from None
        if len(scores) != len(completions):
            raise UserError(f"reward {name} returned {len(scores)} scores for {len(completions)} completions")
        return torch.tensor([as_score(v, name, i) for i, v in enumerate(scores)], dtype=torch.float32)

    reward.__doc__ = fn.__doc__ or f"{name}: a user reward"
    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward
