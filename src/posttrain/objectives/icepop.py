"""IcePop (Ling Team / inclusionAI 2025, "Small Leak Can Sink a Great Ship: Boost RL Training on MoE with IcePop",
blog post and Ring-1T report; formula as stated there): double-sided masking of the training-inference mismatch. With
k_t = pi_prox(y_t) / mu(y_t) the ratio of the trainer's to the sampler's probability,

    M(k) = k   if low <= k <= high,   0 otherwise;        J = E[ sum_t M(k_t) min(r_t A_t, clip(r_t) A_t) ]

so a token whose two engines disagree too much gives no gradient, while the rest are importance-weighted. The
token stays in the aggregation's denominator (its weight is 0; `mis` level token instead removes it from the
mask). = verl's rollout correction with rollout_is=token and a "low_high" rollout_is_threshold
(compute_rollout_correction_weights). Settings: rl.options.icepop. Metrics: `icepop/masked_fraction` (tokens
outside the band) and `icepop/weight_mean` (mean weight over the kept tokens).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives.off_policy import Corrected, corrections, log_ratio
from posttrain.objectives.token_stats import masked_mean, masked_share


class IcePopOptions(Section):
    low: float = Field(0.5, gt=0)  # alpha
    high: float = Field(5.0, gt=0)  # beta


@corrections.register("icepop", options=IcePopOptions)
def icepop(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: IcePopOptions) -> Corrected:
    ratio = torch.exp(log_ratio(behaviour_logp, proximal_logp, mask).clamp(-20.0, 20.0))
    inside = (ratio >= options.low) & (ratio <= options.high)
    weight = torch.where(inside, ratio, torch.zeros_like(ratio)) * mask.to(ratio.dtype)
    metrics = {"icepop/masked_fraction": masked_share(~inside, mask), "icepop/weight_mean": masked_mean(ratio, mask.bool() & inside)}
    return Corrected(proximal_logp, weight, mask, metrics)
