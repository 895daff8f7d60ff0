"""Reward-composition diagnostics, logged each step (what each reward contributes to the advantage).

For reward column k with weight w_k, let z_k [B] be its group-normalised column (GDPO's a_{.,k}: centred
on its group mean, divided by its group std + eps; 0 in groups where it is constant and where it is NaN),
c_k = w_k z_k its weighted contribution, and A [B] the advantage actually used (a [B, T] advantage is
averaged over each row's valid tokens first). Then

    reward/<k>_adv_share = |<c_k, A>| / sum_j |<c_j, A>|          (0 when the denominator is 0)

the share of the advantage explained by reward k: for GDPO, A is proportional to sum_j c_j minus its mean,
so sum_j <c_j, A> = ||A||^2 * const and the shares are an exact decomposition; for other estimators it
measures how much each reward's own signal lines up with the advantage.

    reward/<k>_collapsed = fraction of groups whose within-group variance of reward k is ~0 (< 1e-12;
                           singleton groups count as collapsed): an alarm that reward k stopped teaching.
    reward/<k>_nan       = number of NaN values of reward k in the batch (they were treated as 0 / unscored).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives.gdpo import per_reward_normalized
from posttrain.objectives.grpo import group_moments
from posttrain.rollout import RolloutBatch

COLLAPSE_VARIANCE = 1e-12


def sequence_advantage(adv: Tensor, mask: Tensor) -> Tensor:
    if adv.dim() == 1:
        return adv
    m = mask.to(adv.dtype)
    return (adv * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def collapsed_fraction(column: Tensor, group: Tensor) -> float:
    valid = ~torch.isnan(column)
    _, index = torch.unique(group, return_inverse=True)
    _, _, std = group_moments(column, group, valid)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    if n_groups == 0:
        return 0.0
    per_group_std = std.new_zeros(n_groups).scatter_(0, index, std)  # every row of a group holds its std
    return float((per_group_std**2 < COLLAPSE_VARIANCE).float().mean())


def composition_metrics(batch: RolloutBatch, adv: Tensor, eps: float = 1e-4) -> dict[str, float]:
    a = sequence_advantage(adv.detach(), batch.completion_mask).to(batch.rewards.dtype)
    contributions = per_reward_normalized(batch.rewards, batch.group, eps) * batch.reward_weights.to(batch.rewards.dtype)  # [B, K]
    alignment = (contributions * a[:, None]).sum(0).abs()  # [K]
    total = float(alignment.sum())
    metrics = {}
    for k, name in enumerate(batch.reward_names):
        column = batch.rewards[:, k]
        metrics[f"reward/{name}_adv_share"] = float(alignment[k]) / total if total > 0 else 0.0
        metrics[f"reward/{name}_collapsed"] = collapsed_fraction(column, batch.group)
        metrics[f"reward/{name}_nan"] = float(torch.isnan(column).sum())
    return metrics
