"""Sampler importance sampling, TRL's `vllm_importance_sampling_correction` (trl 1.16, GRPOTrainer
_generate_and_score_completions; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training", truncated IS; Liu et al. 2025, masked IS): the per-token loss is multiplied by a detached weight built
from rho = pi_prox / mu, the trainer's over the sampler's probability:

    level token:     rho_t = exp(log pi_prox(y_t) - log mu(y_t))          level sequence:  rho = exp(sum_t ...)
    mode truncate:   w = clamp(rho, low, high)                             mode mask:       w = rho 1[low <= rho <= high]

A masked token keeps its place in the aggregation's denominator (w = 0), as in TRL; `tis` (truncate, no lower
bound) and `mis` (masked tokens leave the mask) are the repo's earlier variants. low = 0 means no lower bound.
Settings: rl.options.sampler_is (TRL's defaults: token_truncate, max 3). Metrics: `sampler_is/weight_mean` and
`sampler_is/clipped_fraction` (share of valid tokens whose weight was truncated or masked).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives.off_policy import Corrected, corrections, log_ratio
from posttrain.objectives.token_stats import masked_mean, masked_share


class SamplerISOptions(Section):
    level: Literal["token", "sequence"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    low: float = Field(0.0, ge=0)  # 0: no lower bound
    high: float = Field(3.0, gt=0)


@corrections.register("sampler_is", options=SamplerISOptions)
def sampler_is(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: SamplerISOptions) -> Corrected:
    lr = log_ratio(behaviour_logp, proximal_logp, mask)
    ratio = torch.exp(lr.sum(-1, keepdim=True) if options.level == "sequence" else lr)  # [B, 1] or [B, T]
    outside = (ratio < options.low) | (ratio > options.high)
    if options.mode == "truncate":
        weight = ratio.clamp(min=options.low, max=options.high)
    else:
        weight = ratio.masked_fill(outside, 0.0)
    weight = weight.expand_as(mask) * mask.to(ratio.dtype)
    metrics = {"sampler_is/weight_mean": masked_mean(weight, mask), "sampler_is/clipped_fraction": masked_share(outside, mask)}
    return Corrected(proximal_logp, weight, mask, metrics)
