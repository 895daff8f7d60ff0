"""VESPO, Variational Sequence-level Soft Policy Optimization (arXiv 2602.10693, the gamma-kernel form TRL ships as
`loss_type="vespo"`): REINFORCE whose tokens share one detached weight, a gamma-shaped function of the sequence's
true (not length-normalised) importance ratio, different for positive and negative advantages.

    log w_i = clamp( sum_t clamp(logp_theta - logp_old, -20, 20) mask, log 1e-8, 20 )
    phi(w)  = exp( lambda + k log w - lambda w ) = e^lambda w^k e^(-lambda w)          (phi(1) = 1; max at w = k / lambda)
    (k, lambda) = (k_pos, lambda_pos) if A_i >= 0 else (k_neg, lambda_neg)              (lambda floored at 1e-4)
    loss    = - AGG_t sg(phi(w_i)) A_{i,t} logp_theta(y_{i,t})

= trl.GRPOTrainer.get_gamma_weights (k_pos 2, lambda_pos 3, k_neg 3, lambda_neg 2) with TRL's `dapo`-style token
sum (here `token_mean`). TRL folds its vLLM importance ratio into w; here an off-policy correction (rl.correction)
weights the advantage instead. `respo` is a related two-branch kernel with a floor. Settings: rl.options.vespo.
Metrics: `vespo/phi_mean` (mean phi over valid tokens: VESPO's characteristic statistic) and `clip_fraction` (valid
tokens whose phi < 1/2: softly suppressed).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.config import Section
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_mean, masked_share

LOG_W_FLOOR = math.log(1e-8)


class VESPOOptions(Section):
    k_pos: float = Field(2.0, ge=0)
    lambda_pos: float = Field(3.0, ge=0)
    k_neg: float = Field(3.0, ge=0)
    lambda_neg: float = Field(2.0, ge=0)


def gamma_weight(log_w: Tensor, adv: Tensor, opts: VESPOOptions) -> Tensor:
    """phi(w) per token from the [B, 1] log sequence weight; the branch follows the token's advantage sign."""
    nonneg = adv >= 0
    k = torch.where(nonneg, opts.k_pos, opts.k_neg).to(log_w.dtype)
    lam = torch.where(nonneg, opts.lambda_pos, opts.lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@losses.register("vespo", needs=(), options=VESPOOptions)
def vespo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: VESPOOptions = cfg.options_for("vespo")
    adv = per_token(advantages, logp)
    with torch.no_grad():
        token_log_ratio = (logp - old_logp).clamp(-20.0, 20.0) * mask.to(logp.dtype)
        log_w = token_log_ratio.sum(-1, keepdim=True).clamp(LOG_W_FLOOR, 20.0)
        phi = gamma_weight(log_w, adv, opts)
    loss = -aggregate(cfg, phi * adv * logp, mask)
    return loss, {"vespo/phi_mean": masked_mean(phi, mask), "clip_fraction": masked_share(phi < 0.5, mask)}
