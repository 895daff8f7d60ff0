"""GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673, the GMPO objective): the sequence objective is
the geometric mean of the token ratios, each clipped in log space, so one outlier token moves the product far less
than it moves GRPO's arithmetic mean.

    l_t    = logp_theta(y_t) - logp_old(y_t)
    l~_t   = sgn(A) min(sgn(A) l_t, sgn(A) clip(l_t, -eps_low, eps_high))           (token-level clip, log space)
    s_i    = exp( mean_{t valid} l~_t )                                              (geometric mean of clipped ratios)
    A_i    = mean_{t valid} A_t                                                      (a [B] advantage as it is)
    loss   = - AGG_{i,t} s_i A_i                                                      (per sequence, broadcast to its tokens)

The paper clips at (e^-0.4, e^0.4): the `gmpo` preset sets clip_eps_low = clip_eps_high = 0.4 and seq_mean, which is
verl's `geo_mean` (a mean over sequences). Metric: `clip_fraction` (valid tokens whose log-ratio was clamped, A != 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_share


@losses.register("geo_mean", needs=())
def geo_mean(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    adv = per_token(advantages, logp)
    m = mask.to(logp.dtype)
    length = m.sum(-1, keepdim=True) + 1e-8
    sign = torch.sign(adv)
    log_ratio = logp - old_logp
    clamped = log_ratio.clamp(-cfg.clip_eps_low, cfg.clip_eps_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = torch.exp((pessimistic * m).sum(-1, keepdim=True) / length)  # [B, 1]
    seq_adv = (adv * m).sum(-1, keepdim=True) / length
    loss = -aggregate(cfg, (seq_ratio * seq_adv).expand_as(logp), mask)
    return loss, {"clip_fraction": masked_share((log_ratio != clamped) & (adv != 0), mask)}
