"""LitePPO's advantage (Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
arXiv 2508.08221, §4.1 / §6): centre on the group mean, scale by a batch-level std, which stays robust when a
group's rewards are (nearly) constant:

    c_i = r_i - mean_group(r),        A_i = c_i / (std_batch(c) + eps)

std_batch is the Bessel std of the group-centred rewards over the scored rows of the whole batch, as AReaL's
`reward_norm: {mean_level: group, std_level: batch}` computes it (areal/utils/data.py, eps = rl.std_eps); `grpo`
with rl.std_scaling `batch` instead divides by the std of the raw rewards. The `lite_ppo` preset adds the
token-level loss aggregation the paper pairs it with. NaN rows as in `grpo`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_normalize, masked_std, weighted_reward
from posttrain.rollout import RolloutBatch


@advantages.register("lite_ppo", needs=())
def lite_ppo(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    centred = group_normalize(reward, batch.group, "none", valid=scored)
    std = masked_std(centred, scored)
    return torch.where(scored, centred / (std + cfg.std_eps), torch.zeros_like(reward))
