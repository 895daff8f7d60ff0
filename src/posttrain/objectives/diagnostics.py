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
    reward/<k>_all_zero  = fraction of groups where reward k is 0 on every row (for correctness: the all-fail
                           groups, where a group-relative advantage of that reward is 0).
    advantage/<k>_all_zero_abs = mean |A_t| over the valid tokens of those groups' rows (0 when there are none): the
                           signal the update still gets there, from the other rewards or from a token-level
                           estimator (SIPO's contrastive redistribution).
    advantage/<k>_all_zero_spread = mean over those rows of the std of A_t over the row's valid tokens: exactly 0 for a
                           sequence-level advantage, > 0 where a token-level estimator still separates tokens there.
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


def all_zero_groups(column: Tensor, group: Tensor) -> tuple[Tensor, float]:
    """([B] bool: rows whose group has reward 0 on every row, the fraction of groups that are such); NaN counts as 0,
    as the estimators read it."""
    _, index = torch.unique(group, return_inverse=True)
    if index.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=column.device), 0.0
    nonzero = torch.zeros(int(index.max()) + 1, dtype=torch.bool, device=column.device)
    nonzero.scatter_reduce_(0, index, torch.nan_to_num(column) != 0, "amax")
    return ~nonzero[index], float((~nonzero).float().mean())


def abs_advantage_over(rows: Tensor, adv: Tensor, mask: Tensor) -> float:
    """Mean |A| over the valid tokens of `rows` (a [B] advantage counts once per valid token)."""
    m = mask.to(adv.dtype) * rows[:, None].to(adv.dtype)
    a = adv[:, None].expand_as(m) if adv.dim() == 1 else adv
    return float((a.abs() * m).sum() / m.sum()) if m.sum() > 0 else 0.0


def token_spread_over(rows: Tensor, adv: Tensor, mask: Tensor) -> float:
    """Mean over `rows` of the (population) std of A_t over each row's valid tokens; 0 for a [B] advantage."""
    if adv.dim() == 1 or not bool(rows.any()):
        return 0.0
    m = mask[rows].to(adv.dtype)
    a = adv[rows]
    n = m.sum(-1).clamp(min=1.0)
    mean = (a * m).sum(-1) / n
    return float(((((a - mean[:, None]) ** 2) * m).sum(-1) / n).sqrt().mean())


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
        silent, metrics[f"reward/{name}_all_zero"] = all_zero_groups(column, batch.group)
        metrics[f"advantage/{name}_all_zero_abs"] = abs_advantage_over(silent, adv.detach(), batch.completion_mask)
        metrics[f"advantage/{name}_all_zero_spread"] = token_spread_over(silent, adv.detach(), batch.completion_mask)
    return metrics
