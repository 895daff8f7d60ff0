"""GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071, eqs. 5-7): one
length-normalised importance ratio per sequence instead of one per token,

    s_i    = exp( (1/|y_i|) sum_t (logp_theta(y_{i,t}) - logp_old(y_{i,t})) )     over valid tokens only
    surr_i = min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)
    loss   = - AGG_{i,t} surr_i                                                  (surr_i broadcast to its tokens)

= TRL's `importance_sampling_level="sequence"`. The paper's objective is a mean over sequences (seq_mean);
its clip range is tiny (eps_low 3e-4, eps_high 4e-4; the `gspo` preset sets both). The gradient of s_i
reaches every valid token of sequence i, equally weighted by 1/|y_i|.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.policy_losses import per_token


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """[B, 1] mean over valid tokens of logp - old_logp."""
    m = mask.to(logp.dtype)
    return (((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0))[:, None]


@losses.register("gspo", needs=(), rows=True)
def gspo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    adv = per_token(advantages, logp)
    ratio = torch.exp(sequence_log_ratio(logp, old_logp, mask))  # [B, 1]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv
    loss = -aggregate(cfg, torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1.0)
        metrics = {
            "clip_fraction": float(((clipped < unclipped).to(m.dtype) * m).sum() / n),
            "ratio_mean": float(ratio.mean()) if ratio.numel() else 1.0,
        }
    return loss, metrics
