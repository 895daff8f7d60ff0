"""GPG, Group Policy Gradient (Chu et al. 2025, arXiv 2504.02546, its GPG objective): plain REINFORCE with a group-relative
baseline and a batch rescaling, no ratio, no clip, no KL.

Loss `gpg`:        loss = - AGG_t A_t logp_theta(y_t)                 (verl's `gpg` policy loss)
Estimator `gpg`:   A_i  = alpha (r_i - mean_group(r)) / F_norm,   alpha = B / #{i : r_i != 0}    (F_norm = 1)

alpha, the paper's correction for the share of the batch that carries signal, counts the rows of the whole
batch with a non-zero reward (verl's compute_gpg_outcome_advantage; its group std is computed but not used). A
singleton group has baseline 0. The loss value is not a surrogate objective; its gradient is A grad logp.
Metric: `clip_fraction` (always 0: nothing is clipped).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import advantages as estimators
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.grpo import group_moments, weighted_reward
from posttrain.objectives.policy_losses import per_token
from posttrain.rollout import RolloutBatch


@losses.register("gpg", needs=(), rows=True)
def gpg_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    return -aggregate(cfg, per_token(advantages, logp) * logp, mask), {"clip_fraction": 0.0}


@estimators.register("gpg", needs=())
def gpg_advantage(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    count, mean, _ = group_moments(reward, batch.group, scored)
    baseline = torch.where(count > 1, mean, torch.zeros_like(mean))
    nonzero = ((reward != 0) & scored).sum().clamp(min=1)
    alpha = reward.shape[0] / nonzero
    return torch.where(scored, alpha * (reward - baseline), torch.zeros_like(reward))
