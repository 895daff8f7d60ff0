"""TOPR, Tapered Off-Policy REINFORCE (Le Roux et al. 2025, arXiv 2503.14286, eq. 8): supervised-style updates
for positive samples, truncated importance sampling for negative ones, so negatives cannot blow up while
positives keep their full gradient even far off-policy:

    grad J = sum_{tau in T+} R(tau) grad log pi(tau) + sum_{tau in T-} [pi(tau) / mu(tau)]_0^1 R(tau) grad log pi(tau)
    loss   = - AGG_t ( w_+ 1[A_i > 0] A_t logp_t + w_- 1[A_i <= 0] sg(clamp(rho_t, 0, 1)) A_t logp_t )

per token (rho_t = pi_theta(y_t) / pi_old(y_t)). = ROLL's `pg_variant: topr` (topr_positive_weight,
topr_negative_weight, default 1 and 1). ROLL splits T+ / T- by the episode score (> 0); here the split is by the
sign of the advantage the loss receives, the same split when the estimator passes the reward through (no baseline),
and "better than the group" under a baselined estimator. Settings: rl.options.topr. Metrics: `topr/positive_fraction`
(valid tokens on the positive branch) and `clip_fraction` (negative-branch tokens whose ratio was truncated at 1).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.config import Section
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_share


class TOPROptions(Section):
    positive_weight: float = Field(1.0, ge=0)
    negative_weight: float = Field(1.0, ge=0)


@losses.register("topr", needs=(), options=TOPROptions)
def topr(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: TOPROptions = cfg.options_for("topr")
    adv = per_token(advantages, logp)
    positive = adv > 0
    with torch.no_grad():
        ratio = torch.exp(logp - old_logp)
        weight = torch.where(positive, torch.full_like(ratio, opts.positive_weight), opts.negative_weight * ratio.clamp(0.0, 1.0))
    loss = -aggregate(cfg, weight * adv * logp, mask)
    return loss, {"topr/positive_fraction": masked_share(positive, mask), "clip_fraction": masked_share(~positive & (ratio > 1.0), mask)}
