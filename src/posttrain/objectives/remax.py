"""ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient RL Method for LLMs", arXiv 2310.10505,
Algorithm 1 / eq. 5): the baseline is the reward of the greedy completion of the same prompt,

    A_i = r(x, y_i) - r(x, y_greedy(x))

so, unlike the group-relative estimators, a group of equal sampled rewards still gets a non-zero advantage
when the greedy answer scores differently. The trainer supplies `batch.extras["greedy_rewards"]` [B]
(the weighted greedy reward of row i's prompt) because this estimator declares it needs it. NaN rewards
count as 0; unscorable rows get 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import weighted_reward
from posttrain.rollout import RolloutBatch


@advantages.register("remax", needs=("greedy_rewards",))
def remax(batch: RolloutBatch, cfg) -> Tensor:
    if "greedy_rewards" not in batch.extras:
        raise KeyError("remax needs batch.extras['greedy_rewards'] (the greedy completion's reward per row)")
    reward, scored = weighted_reward(batch)
    baseline = torch.nan_to_num(batch.extras["greedy_rewards"].to(reward.dtype), nan=0.0)
    return torch.where(scored, reward - baseline, torch.zeros_like(reward))
