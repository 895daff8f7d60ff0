"""Importance-sampling policy gradient (SkyRL's `importance_sampling`, Tinker's `importance_sampling` loss): the
unclipped ratio surrogate, whose gradient is the off-policy policy gradient E_old[rho A grad logp]
(Williams 1992 with importance weights; Tinker docs "Policy gradient: importance_sampling"):

    rho_t = exp(logp_theta(y_t) - logp_old(y_t)),        loss = - AGG_t rho_t A_t

SkyRL sums over tokens after scaling the advantages by its loss reduction (token_mean: 1 / n_valid), which is
`token_mean` here. Metrics: `ratio_mean` and `clip_fraction` (0: nothing is clipped).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_mean


@losses.register("importance_sampling", needs=())
def importance_sampling(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    ratio = torch.exp(logp - old_logp)
    loss = -aggregate(cfg, ratio * per_token(advantages, logp), mask)
    return loss, {"ratio_mean": masked_mean(ratio, mask), "clip_fraction": 0.0}
