"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
arXiv 2505.22617, §5 "Clip-Cov"): entropy collapse is driven by tokens whose log-prob and advantage co-vary
strongly; a small random share of them loses its gradient.

    cov_t   = (A_t - mean_valid(A)) (logp_theta(y_t) - mean_valid(logp_theta))
    C       = valid tokens not already clipped by PPO with lb < cov_t < ub
    drop    = min(max(floor(ratio * n_valid), 1), |C|) tokens of C drawn uniformly at random (torch.randperm)
    loss    = - AGG_t (1 - drop_t) min(rho_t A_t, clip(rho_t) A_t)

= verl's `clip_cov` (clip_cov_ratio 2e-4, lb 1, ub 5). The draw uses torch's global generator, as verl does.
Settings: rl.options.clip_cov. Metric: `clip_fraction` (the dropped share: Clip-Cov's clipped share) and
`ppo_clip_fraction`.
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


class ClipCovOptions(Section):
    ratio: float = Field(0.0002, gt=0, le=1)  # share of the valid tokens whose gradient is dropped
    lb: float = 1.0  # only tokens with lb < cov < ub are candidates
    ub: float = 5.0


def centred_covariance(adv: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """Per token (A - mean A)(logp - mean logp), both means over the valid tokens (detached)."""
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1.0)
    a, lp = adv.detach(), logp.detach()
    return (a - (a * m).sum() / n) * (lp - (lp * m).sum() / n)


@losses.register("clip_cov", needs=(), options=ClipCovOptions)
def clip_cov(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: ClipCovOptions = cfg.options_for("clip_cov")
    adv = per_token(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
    valid = mask.bool()
    with torch.no_grad():
        ppo_clipped = (clipped < unclipped) & valid
        cov = centred_covariance(adv, logp, mask)
        candidates = torch.nonzero(valid & ~ppo_clipped & (cov > opts.lb) & (cov < opts.ub))
        n_drop = max(int(opts.ratio * int(valid.sum())), 1)
        chosen = candidates[torch.randperm(len(candidates))[:n_drop]] if len(candidates) else candidates
        keep = torch.ones_like(logp)
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    loss = -aggregate(cfg, torch.minimum(unclipped, clipped) * keep, mask)
    return loss, {"clip_fraction": masked_share(keep == 0, mask), "ppo_clip_fraction": masked_share(ppo_clipped, mask)}
