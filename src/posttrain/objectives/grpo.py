"""GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, eq. 3).

    r_i = sum_k w_k r_{i,k}                              (weighted sum of the reward columns)
    A_i = (r_i - mean_group(r)) / (std(r) + eps)         std over the group, the batch, or none

Registered twice: as `grpo` and as `sum_then_normalize`, the name TRL gives this multi-reward aggregation
(`multi_objective_aggregation="sum_then_normalize"`). The scalar A_i is broadcast to every token by the
policy loss. std is Bessel-corrected, as in TRL and verl.

NaN rewards (an unscorable sample) count as 0 in the weighted sum; a row whose rewards are all NaN is left
out of every statistic and gets advantage 0 (TRL's rule). The helpers here are shared by the other
estimators of the family.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.rollout import RolloutBatch


def group_moments(values: Tensor, group: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row (count, mean, Bessel std) of `values` [B] over the `valid` rows sharing its `group` id.

    A group with one valid row has std 0 (not NaN); a group with none has count 0, mean 0, std 0."""
    valid = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()
    _, index = torch.unique(group, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    weight = valid.to(values.dtype)
    v = torch.where(valid, values, torch.zeros_like(values))
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, index, weight)
    mean = torch.zeros_like(count).index_add_(0, index, v) / count.clamp(min=1.0)
    sq = torch.zeros_like(count).index_add_(0, index, weight * (v - mean[index]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return count[index], mean[index], std[index]


def group_stats(values: Tensor, group: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-row mean and Bessel-corrected std of `values` [B] over the rows sharing its `group` id."""
    _, mean, std = group_moments(values, group, valid)
    return mean, std


def batch_whiten(values: Tensor, valid: Tensor, eps: float) -> Tensor:
    """(v - mean) / (Bessel std + eps) over the `valid` rows; invalid rows -> 0; one valid row -> 0."""
    w = valid.to(values.dtype)
    n = w.sum()
    v = torch.where(valid, values, torch.zeros_like(values))
    mean = v.sum() / n.clamp(min=1.0)
    std = ((w * (v - mean) ** 2).sum() / (n - 1).clamp(min=1.0)).sqrt()
    return torch.where(valid, (v - mean) / (std + eps), torch.zeros_like(values))


def group_normalize(
    values: Tensor, group: Tensor, std_scaling: str = "group", eps: float = 1e-4, valid: Tensor | None = None
) -> Tensor:
    """(v - group mean) / (std + eps), with std taken per group, over the whole batch, or not at all."""
    valid = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()
    _, mean, group_std = group_moments(values, group, valid)
    centred = values - mean
    if std_scaling == "group":
        out = centred / (group_std + eps)
    elif std_scaling == "batch":
        out = centred / (masked_std(values, valid) + eps)
    else:
        out = centred
    return torch.where(valid, out, torch.zeros_like(out))


def masked_std(values: Tensor, valid: Tensor) -> Tensor:
    """Bessel std of the `valid` entries of `values` (0 for fewer than two)."""
    v = values[valid]
    return v.std() if v.numel() > 1 else values.new_zeros(())


def weighted_reward(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """(r [B] = NaN-as-0 weighted sum of the reward columns, scored [B] = row has at least one real reward)."""
    return weighted_sum(batch.rewards, batch.reward_weights)


def weighted_sum(rewards: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    scored = ~torch.isnan(rewards).all(dim=1)
    return torch.nan_to_num(rewards, nan=0.0) @ weights.to(rewards.dtype), scored


def grpo_on_rewards(rewards: Tensor, group: Tensor, weights: Tensor, cfg) -> Tensor:
    """GRPO advantages [B] from a reward matrix [B, K], group ids [B] and weights [K] (the image pipeline's
    entry point, registered as `on_rewards`); cfg gives std_scaling and std_eps."""
    reward, scored = weighted_sum(rewards, weights)
    return group_normalize(reward, group, cfg.std_scaling, cfg.std_eps, scored)


@advantages.register("sum_then_normalize", needs=(), on_rewards=grpo_on_rewards)
@advantages.register("grpo", needs=(), on_rewards=grpo_on_rewards)
def grpo(batch: RolloutBatch, cfg) -> Tensor:
    return grpo_on_rewards(batch.rewards, batch.group, batch.reward_weights, cfg)
