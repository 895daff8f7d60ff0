"""`reasoning_gym`: reasoning-gym's own `score_answer` of each completion (tasks/reasoning_gym.py), partial credit
included, for runs and evaluations of `task.name: reasoning_gym`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.errors import UserError
from posttrain.rewards import rewards
from posttrain.tasks import Example, Task
from posttrain.tasks.reasoning_gym import ReasoningGymTask


@rewards.register("reasoning_gym")
def reasoning_gym_score(task: Task, examples: Sequence[Example], completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """The library's score in [0, 1] of the answer each completion ends with (0 without one)."""
    if not isinstance(task, ReasoningGymTask):
        raise UserError(f"reward reasoning_gym scores task.name reasoning_gym, not {task.cfg.name!r}")
    return torch.tensor([task.score(c, e) for c, e in zip(completions, examples)], dtype=torch.float32)
