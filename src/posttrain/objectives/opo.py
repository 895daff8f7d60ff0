"""OPO, On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv 2505.23585, its optimal baseline): the variance-minimising
baseline of a sequence-level policy gradient weighs each sample by its gradient's squared norm, which the paper
approximates by the response length:

    b = sum_{i in group} |y_i| r_i / sum_{i in group} |y_i|,        A_i = r_i - b

(|y_i| = completion_mask.sum: the tokens the policy produced). A singleton group has baseline 0 (A = r), as in
verl's compute_opo_outcome_advantage. NaN rows as in `grpo` (left out of b, advantage 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_moments, weighted_reward
from posttrain.rollout import RolloutBatch


@advantages.register("opo", needs=())
def opo(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    length = batch.completion_mask.to(reward.dtype).sum(-1)
    count, mean_len, _ = group_moments(length, batch.group, scored)
    _, mean_weighted, _ = group_moments(length * reward, batch.group, scored)
    baseline = torch.where(count > 1, mean_weighted / mean_len.clamp(min=1e-12), torch.zeros_like(reward))
    return torch.where(scored, reward - baseline, torch.zeros_like(reward))
