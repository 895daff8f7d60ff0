"""KL-Cov (Cui et al. 2025, arXiv 2505.22617, §5 "KL-Cov"): no clip; the tokens with the largest centred
covariance between advantage and log-prob get a KL penalty towards the old policy.

    cov_t  = (A_t - mean_valid(A)) (logp_theta(y_t) - mean_valid(logp_theta))
    K      = the max(floor(ratio * n_valid), 1) valid tokens with the largest cov_t (torch.topk)
    obj_t  = rho_t A_t - coef |logp_theta(y_t) - logp_old(y_t)| 1[t in K]
    loss   = - AGG_t obj_t

= verl's `kl_cov` (kl_cov_ratio 2e-4, ppo_kl_coef 1). Settings: rl.options.kl_cov. Metrics: `kl_cov/penalised_fraction`
(= `clip_fraction`: the share of valid tokens in K) and `kl_cov/abs_kl` (mean |log rho| over valid tokens).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.config import Section
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.clip_cov import centred_covariance
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_mean, masked_share


class KLCovOptions(Section):
    ratio: float = Field(0.0002, gt=0, le=1)  # share of the valid tokens that get the penalty
    coef: float = Field(1.0, ge=0)  # weight of |log rho| on them


@losses.register("kl_cov", needs=(), options=KLCovOptions)
def kl_cov(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: KLCovOptions = cfg.options_for("kl_cov")
    adv = per_token(advantages, logp)
    log_ratio = logp - old_logp
    valid = mask.bool()
    with torch.no_grad():
        penalised = torch.zeros_like(valid)
        n_valid = int(valid.sum())
        if n_valid:
            flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
            cov = centred_covariance(adv, logp, mask).reshape(-1)[flat]
            top = torch.topk(cov, max(1, int(n_valid * opts.ratio)), largest=True).indices
            penalised.view(-1)[flat[top]] = True
    objective = torch.exp(log_ratio) * adv - opts.coef * log_ratio.abs() * penalised
    loss = -aggregate(cfg, objective, mask)
    share = masked_share(penalised, mask)
    return loss, {"clip_fraction": share, "kl_cov/penalised_fraction": share, "kl_cov/abs_kl": masked_mean(log_ratio.abs(), mask)}
