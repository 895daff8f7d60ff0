"""CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585, eqs. 4-5): REINFORCE with a
clipped, stop-gradient importance weight, so no token ever loses its gradient to clipping:

    r_t    = exp(logp_theta - logp_old)
    w_t    = sg( min(r_t, 1 + eps_high) )          (the paper's lower IS bound is not set, as in its runs)
    loss   = - AGG_t w_t A_t logp_theta(y_t)

= TRL's `loss_type="cispo"` with TRL's `epsilon_high` (an absolute cap, ScaleRL's eps_max) = 1 + rl.clip_eps_high.
The loss value is not a surrogate objective (it contains logp); only its gradient, w_t A_t grad logp, matters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.policy_losses import per_token


@losses.register("cispo", needs=(), rows=True)
def cispo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    adv = per_token(advantages, logp)
    ratio = torch.exp(logp - old_logp).detach()
    weight = torch.clamp(ratio, max=1.0 + cfg.clip_eps_high)
    loss = -aggregate(cfg, weight * adv * logp, mask)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1.0)
        metrics = {
            "clip_fraction": float(((ratio > 1.0 + cfg.clip_eps_high).to(m.dtype) * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
        }
    return loss, metrics
