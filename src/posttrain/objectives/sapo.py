"""SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv 2511.20347, the SAPO objective and its gate): a smooth,
temperature-controlled gate replaces the hard clip,

    rho_t  = exp(clamp(logp_theta - logp_old, -20, 20))
    f(rho) = sigmoid(tau (rho - 1)) 4 / tau          tau = tau_pos if A_t > 0 else tau_neg
    loss   = - AGG_t f(rho_t) A_t

so the gradient weight df/drho = 4 s (1 - s), s = sigmoid(tau (rho - 1)), is 1 on-policy and decays smoothly as the
ratio leaves 1 (faster for negative tokens: tau_neg > tau_pos). = TRL's `loss_type="sapo"`
(sapo_temperature_pos/neg 1.0/1.05), verl's `sapo` (tau_pos/tau_neg), AReaL's `use_sapo_loss`, SkyRL's `sapo`.
The paper aggregates as a sequence mean (the `sapo` preset sets seq_mean). Settings: rl.options.sapo.

Metrics: `sapo/gate_mean` (the mean gradient weight 4 s (1 - s) over valid tokens: SAPO's characteristic
statistic) and `clip_fraction` (tokens whose gradient weight fell below 1/2: softly clipped).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.config import Section
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.dual_clip import bounded_ratio
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_mean, masked_share


class SAPOOptions(Section):
    tau_pos: float = Field(1.0, gt=0)  # gate temperature for A > 0
    tau_neg: float = Field(1.05, gt=0)  # for A <= 0


@losses.register("sapo", needs=(), options=SAPOOptions)
def sapo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: SAPOOptions = cfg.options_for("sapo")
    adv = per_token(advantages, logp)
    ratio = bounded_ratio(logp, old_logp)
    tau = torch.where(adv > 0, opts.tau_pos, opts.tau_neg).to(logp.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -aggregate(cfg, gate * (4.0 / tau) * adv, mask)
    weight = 4.0 * gate.detach() * (1.0 - gate.detach())
    return loss, {"sapo/gate_mean": masked_mean(weight, mask), "clip_fraction": masked_share(weight < 0.5, mask)}
