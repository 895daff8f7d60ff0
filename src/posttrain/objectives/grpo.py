"""GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, eq. 3; spec §0.1).

    r_i = sum_k w_k r_{i,k}                              (weighted sum of the reward columns)
    A_i = (r_i - mean_group(r)) / (std(r) + eps)         std over the group, the batch, or none

The scalar A_i is broadcast to every token of rollout i by the policy loss. std is Bessel-corrected,
as in TRL and verl.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.rollout import RolloutBatch


def group_stats(values: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row mean and Bessel-corrected std of `values` [B] over the rows sharing its `group` id."""
    _, index = torch.unique(group, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, index, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, index, values)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, index, (values - mean[index]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return mean[index], std[index]


def group_normalize(values: Tensor, group: Tensor, std_scaling: str = "group", eps: float = 1e-4) -> Tensor:
    """(v - group mean) / (std + eps), with std taken per group, over the whole batch, or not at all."""
    mean, group_std = group_stats(values, group)
    centred = values - mean
    if std_scaling == "group":
        return centred / (group_std + eps)
    if std_scaling == "batch":
        return centred / (values.std() + eps)
    return centred


def weighted_reward(batch: RolloutBatch) -> Tensor:
    return batch.rewards @ batch.reward_weights.to(batch.rewards.dtype)


@advantages.register("grpo", needs=())
def grpo(batch: RolloutBatch, cfg) -> Tensor:
    return group_normalize(weighted_reward(batch), batch.group, cfg.std_scaling, cfg.std_eps)
