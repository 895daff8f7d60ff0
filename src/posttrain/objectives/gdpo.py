"""GDPO, group reward-decoupled normalisation (Group reward-Decoupled Normalization Policy
Optimization; github.com/NVlabs/GDPO), = TRL's
`multi_objective_aggregation="normalize_then_sum"`:

    a_{i,k} = (r_{i,k} - mean_group(r_{.,k})) / (std_group(r_{.,k}) + eps)    per reward column k
    pre_i   = sum_k w_k a_{i,k}
    A_i     = (pre_i - mean_batch(pre)) / (std_batch(pre) + eps)             batch whitening

eps = rl.std_eps (1e-4 in params.yaml, as in GDPO and TRL). A NaN reward is left out of its column's group
statistics and contributes a_{i,k} = 0; a row whose rewards are all NaN is left out of the whitening and
gets A_i = 0. A reward constant within a group therefore adds exactly 0 to that group's advantages, and
scaling one reward column by c > 0 leaves A unchanged (up to eps).

The estimator needs nothing but the reward matrix, the group index and the weights, so its core
`gdpo_on_rewards` is also registered as the entry's `on_rewards`: the image pipeline (flow_rl) calls the
same code on its [B, K] judge scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import batch_whiten, group_moments
from posttrain.rollout import RolloutBatch


def per_reward_normalized(rewards: Tensor, group: Tensor, eps: float) -> Tensor:
    """[B, K] group-normalised reward columns, 0 where the reward is NaN."""
    columns = []
    for k in range(rewards.shape[1]):
        column = rewards[:, k]
        valid = ~torch.isnan(column)
        _, mean, std = group_moments(column, group, valid)
        columns.append(torch.where(valid, (column - mean) / (std + eps), torch.zeros_like(column)))
    return torch.stack(columns, dim=1)


def gdpo_on_rewards(rewards: Tensor, group: Tensor, weights: Tensor, cfg) -> Tensor:
    """GDPO advantages [B] from a reward matrix [B, K], group ids [B] and weights [K]; cfg.std_eps = eps."""
    normalized = per_reward_normalized(rewards, group, cfg.std_eps)
    pre = normalized @ weights.to(normalized.dtype)
    scored = ~torch.isnan(rewards).all(dim=1)
    return batch_whiten(pre, scored, cfg.std_eps)


@advantages.register("gdpo", needs=(), on_rewards=gdpo_on_rewards)
def gdpo(batch: RolloutBatch, cfg) -> Tensor:
    return gdpo_on_rewards(batch.rewards, batch.group, batch.reward_weights, cfg)
