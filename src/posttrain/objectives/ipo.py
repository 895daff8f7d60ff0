"""IPO loss of prime-rl (prime_rl.trainer.rl.loss.ipo_loss_fn): a symmetric trust region on the probability of the
sampled token, the ratio surrogate, and the squared-log-ratio regulariser of `dppo_reg`:

    masked_t = |pi_theta(y_t) - pi_old(y_t)| > threshold
    obj_t    = (1 - masked_t) adv_tau A_t rho_t - kl_tau (log rho_t)^2,        loss = - AGG_t obj_t

The formula is prime-rl's code (no paper is cited there; the name is theirs). Token sum over the global token
count = `token_mean`. Settings: rl.options.ipo (prime-rl: threshold 0.1, adv_tau 1, kl_tau 1e-3).
Metric: `clip_fraction` (masked share).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.config import Section
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.dppo_reg import regularised_surrogate
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_share


class IPOOptions(Section):
    threshold: float = Field(0.1, ge=0)  # largest |p - q| kept
    adv_tau: float = Field(1.0, ge=0)
    kl_tau: float = Field(0.001, ge=0)


@losses.register("ipo", needs=(), options=IPOOptions)
def ipo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: IPOOptions = cfg.options_for("ipo")
    adv = per_token(advantages, logp)
    with torch.no_grad():
        masked = (torch.exp(logp) - torch.exp(old_logp)).abs() > opts.threshold
    loss = -aggregate(cfg, regularised_surrogate(logp, old_logp, adv, masked, opts.adv_tau, opts.kl_tau), mask)
    return loss, {"clip_fraction": masked_share(masked, mask)}
