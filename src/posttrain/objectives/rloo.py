"""RLOO, REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740, eq. 5;
Kool et al. 2019):

    A_i = r_i - 1/(n-1) sum_{j != i} r_j  =  n/(n-1) (r_i - mean_group(r))

over the n scored samples of i's group. A singleton group has no leave-one-out baseline: A = 0.
NaN handling as in `grpo`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_moments, weighted_reward
from posttrain.rollout import RolloutBatch


@advantages.register("rloo", needs=())
def rloo(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    count, mean, _ = group_moments(reward, batch.group, scored)
    scale = count / (count - 1).clamp(min=1.0)
    keep = scored & (count > 1)
    return torch.where(keep, scale * (reward - mean), torch.zeros_like(reward))
