"""The PPO clipped surrogate as used by GRPO (Schulman et al. 2017, arXiv 1707.06347, eq. 7; DeepSeekMath
eq. 3; DAPO's decoupled "clip-higher" bounds, arXiv 2503.14476, eq. 10):

    rho_t  = exp(logp_theta - logp_old)
    surr_t = min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
    loss   = - AGG_t surr_t

A [B] advantage is broadcast over tokens; a [B, T] advantage is used per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate


def per_token(advantages: Tensor, like: Tensor) -> Tensor:
    """A [B] advantage broadcast to [B, T]; a [B, T] advantage as it is."""
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


@losses.register("clip", needs=(), rows=True)
def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    adv = per_token(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    loss = -aggregate(cfg, surrogate, mask)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1.0)
        metrics = {
            "clip_fraction": float(((clipped < unclipped).to(m.dtype) * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
        }
    return loss, metrics
