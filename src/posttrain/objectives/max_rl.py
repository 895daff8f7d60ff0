"""MaxRL, maximum-likelihood RL (arXiv 2602.02710): for a binary (non-negative) reward, dividing the group-centred
reward by the group mean instead of the group std makes the policy gradient an unbiased estimate of the gradient
of the order-G truncation of the maximum-likelihood objective log p(success) (a prompt with pass rate p weighs ~1/p):

    A_i = (r_i - mean_group(r)) / (mean_group(r) + eps)          A_i = 0 where mean_group(r) <= 0

= prime-rl's `max_rl` algorithm (eps = 0; a group with mean <= 0 carries no signal) and SkyRL's `maxrl`
(eps = 1e-6; SkyRL gives a singleton group A = r). Here a singleton group has mean r and A = 0 when eps = 0.
Settings: rl.options.max_rl. NaN rows as in `grpo`.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_moments, weighted_reward
from posttrain.rollout import RolloutBatch


class MaxRLOptions(Section):
    eps: float = Field(0.0, ge=0)  # added to the group mean in the denominator


@advantages.register("max_rl", needs=(), options=MaxRLOptions)
def max_rl(batch: RolloutBatch, cfg) -> Tensor:
    eps = cfg.options_for("max_rl").eps
    reward, scored = weighted_reward(batch)
    _, mean, _ = group_moments(reward, batch.group, scored)
    signal = scored & (mean > 0)
    return torch.where(signal, (reward - mean) / (mean + eps), torch.zeros_like(reward))
