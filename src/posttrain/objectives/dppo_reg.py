"""DPPO with a squared-log-ratio regulariser (prime-rl's default loss: the DPPO binary-TV mask of arXiv 2602.04879,
eq. 13, on the ratio surrogate, plus the KL term of Kimi K2.5, arXiv 2602.02276). With p = pi_theta(y_t),
q = pi_old(y_t), rho_t = p / q:

    masked_t = p - q > delta_high   if A_t > 0;    q - p > delta_low   if A_t <= 0
    obj_t    = (1 - masked_t) adv_tau A_t rho_t - kl_tau (log rho_t)^2
    loss     = - AGG_t obj_t

Unlike verl's `dppo_tv` (a detached, truncated ratio times logp) the ratio carries the gradient and is not
truncated; the regulariser keeps pulling masked tokens back. = prime_rl.trainer.rl.loss.default_loss_fn, whose
token sum over the global token count is `token_mean`. Settings: rl.options.dppo_reg (prime-rl: 0.2, 0.2,
adv_tau 1, kl_tau 1e-3). Metrics: `clip_fraction` (masked share), `masked_low` / `masked_high`.
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


class DPPORegOptions(Section):
    delta_low: float = Field(0.2, ge=0)  # prime-rl dppo_mask_low
    delta_high: float = Field(0.2, ge=0)  # prime-rl dppo_mask_high
    adv_tau: float = Field(1.0, ge=0)  # scale of the policy-gradient term (0: the regulariser alone)
    kl_tau: float = Field(0.001, ge=0)  # weight of (log rho)^2


def regularised_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, masked: Tensor, adv_tau: float, kl_tau: float) -> Tensor:
    """Per token: (1 - masked) adv_tau A rho - kl_tau (log rho)^2 (the objective, to be maximised)."""
    log_ratio = logp - old_logp
    return (~masked) * (adv_tau * adv) * torch.exp(log_ratio) - kl_tau * log_ratio**2


@losses.register("dppo_reg", needs=(), options=DPPORegOptions)
def dppo_reg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: DPPORegOptions = cfg.options_for("dppo_reg")
    adv = per_token(advantages, logp)
    with torch.no_grad():
        diff = torch.exp(logp) - torch.exp(old_logp)
        high, low = (adv > 0) & (diff > opts.delta_high), (adv <= 0) & (diff < -opts.delta_low)
        masked = high | low
    loss = -aggregate(cfg, regularised_surrogate(logp, old_logp, adv, masked, opts.adv_tau, opts.kl_tau), mask)
    metrics = {"clip_fraction": masked_share(masked, mask), "masked_high": masked_share(high, mask),
               "masked_low": masked_share(low & (adv < 0), mask)}
    return loss, metrics
