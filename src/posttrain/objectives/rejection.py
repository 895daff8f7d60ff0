"""Rejection sampling on the sampler-vs-trainer mismatch (verl's rollout correction `rollout_rs`,
verl/trainer/ppo/rollout_corr_helper.py: compute_rollout_rejection_mask; the hard trust region of Liu et al. 2025,
"When speed kills stability", sequence-level masking): tokens or whole completions whose divergence between the
behaviour policy mu (recorded at sampling) and the trainer's pi_prox exceeds a threshold leave the loss mask.
With l_t = clamp(log pi_prox(y_t) - log mu(y_t), -20, 20):

    k1_t = -l_t,   k2_t = l_t^2 / 2,   k3_t = exp(l_t) - 1 - l_t                   (per-token divergence estimates)
    token_k*     keep token t        if k1_t in [log low, log high]  /  k2_t, k3_t <= high
    seq_sum_k*   keep completion i   if sum_t k_t in [log low, log high] (k1)  /  <= high (k2, k3)
    seq_mean_k*  the same with the mean over the completion's tokens
    seq_max_k*   keep completion i   if max_t k_t <= high (k2, k3)

No importance weight; the loss's ratio is taken against pi_prox (verl's decoupled mode). verl chains several modes
with commas; one mode per run here. Settings: rl.options.rejection. Metrics: `rejection/masked_fraction` (tokens)
and `rejection/seq_masked_fraction` (completions with at least one rejected token).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives.off_policy import Corrected, corrections, log_ratio
from posttrain.objectives.token_stats import masked_share

Mode = Literal["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
               "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"]


class RejectionOptions(Section):
    mode: Mode = "seq_mean_k3"
    low: float = Field(0.5, gt=0)  # k1 modes: the lower ratio bound (ignored by k2 / k3)
    high: float = Field(0.01, gt=0)  # k1: the upper ratio bound; k2 / k3: the largest divergence kept


def divergence(lr: Tensor, kind: str) -> Tensor:
    if kind == "k1":
        return -lr
    return 0.5 * lr**2 if kind == "k2" else torch.exp(lr) - 1.0 - lr


def kept(stat: Tensor, kind: str, opts: RejectionOptions) -> Tensor:
    if kind == "k1":
        return (stat >= math.log(opts.low)) & (stat <= math.log(opts.high))
    return stat <= opts.high


@corrections.register("rejection", options=RejectionOptions)
def rejection(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: RejectionOptions) -> Corrected:
    level, kind = options.mode.rsplit("_", 1)
    m = mask.to(proximal_logp.dtype)
    token = divergence(log_ratio(behaviour_logp, proximal_logp, mask).clamp(-20.0, 20.0), kind)
    if level == "token":
        keep = kept(token, kind, options)
    else:
        if level == "seq_sum":
            stat = (token * m).sum(-1)
        elif level == "seq_mean":
            stat = (token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        else:
            stat = token.masked_fill(~mask.bool(), float("-inf")).max(-1).values.nan_to_num(neginf=0.0)
        keep = kept(stat, kind, options)[:, None].expand_as(mask)
    rejected = ~keep & mask.bool()
    metrics = {"rejection/masked_fraction": masked_share(rejected, mask),
               "rejection/seq_masked_fraction": float(rejected.any(-1).to(torch.float64).mean()) if mask.shape[0] else 0.0}
    return Corrected(proximal_logp, None, mask * keep.to(mask.dtype), metrics)
