"""Reward functions, registered by name; `rl.rewards` lists the ones that form the reward matrix.

    RewardFn(task, examples, completions, finished) -> Tensor [N]

A reward scores completions and nothing else: weighting and normalisation across rewards belong to the
advantage estimator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.registry import Registry
from posttrain.tasks import Example, Task

rewards: Registry = Registry("reward")


@rewards.register("correctness")
def correctness(task: Task, examples: Sequence[Example], completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """1 when the task's verifier accepts the answer."""
    return torch.tensor([task.correctness_reward(c, f, e) for c, f, e in zip(completions, finished, examples)])


@rewards.register("format")
def format_reward(task: Task, examples: Sequence[Example], completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """1 when the completion is exactly one well-formed answer ended by EOS."""
    return torch.tensor([task.format_reward(c, f) for c, f in zip(completions, finished)])


def reward_matrix(specs, task: Task, examples, completions, finished) -> tuple[Tensor, tuple[str, ...], Tensor]:
    """Score with every configured reward: ([N, K] matrix, names, weights [K])."""
    columns = [rewards.get(s.name)(task, examples, completions, finished).float() for s in specs]
    names = tuple(s.name for s in specs)
    weights = torch.tensor([s.weight for s in specs], dtype=torch.float32)
    return torch.stack(columns, dim=1), names, weights
