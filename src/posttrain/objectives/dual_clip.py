"""Dual-clip PPO (Ye et al. 2019, "Mastering Complex Control in MOBA Games with Deep RL", arXiv 1912.09729, the dual-clip objective):
the clipped surrogate, plus a floor on the objective of a negative-advantage token, so a very large ratio
(a token the sampler found unlikely) cannot drive an unbounded update:

    rho_t  = exp(clamp(logp_theta - logp_old, -20, 20))
    surr_t = min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
    obj_t  = max(surr_t, c A_t)   if A_t < 0,   surr_t otherwise        (c > 1)
    loss   = - AGG_t obj_t

= verl's `vanilla` loss (core_algos.compute_policy_loss_vanilla, clip_ratio_c = c, default 3) and SkyRL's
`dual_clip`. Settings: rl.options.dual_clip. Metrics: `clip_fraction` (the PPO clip binds), `dual_clip_fraction`
(the c A floor binds, negative-advantage tokens).
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

LOG_RATIO_BOUND = 20.0


class DualClipOptions(Section):
    c: float = Field(3.0, gt=1)  # the floor is c A for A < 0 (the paper and verl use 3)


def bounded_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """exp(logp - old_logp) with the log-ratio clamped to [-20, 20] (verl's and SkyRL's guard against overflow)."""
    return torch.exp((logp - old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


@losses.register("dual_clip", needs=(), options=DualClipOptions, rows=True)
def dual_clip(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    c = cfg.options_for("dual_clip").c
    adv = per_token(advantages, logp)
    ratio = bounded_ratio(logp, old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    floor = c * adv
    objective = torch.where(adv < 0, torch.maximum(surrogate, floor), surrogate)
    loss = -aggregate(cfg, objective, mask)
    metrics = {
        "clip_fraction": masked_share(clipped < unclipped, mask),
        "dual_clip_fraction": masked_share((adv < 0) & (floor > surrogate), mask),
    }
    return loss, metrics
