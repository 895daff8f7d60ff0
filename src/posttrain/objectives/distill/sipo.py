"""SIPO, self-instructing policy optimization (2026; derived from its abstract; contrastive
construction cross-checked with RLCSD, arXiv 2606.11709): the reward keeps the direction of each update and
a contrastive self-teacher only redistributes credit among a rollout's tokens.

    C+ / C-  the reference answer and the group's mistakes, framed reference-correct / mistakes-correct
    d_t      = sg[ logp(y_t | x, C+, y_<t) - logp(y_t | x, C-, y_<t) ]     (biases common to both cancel)
    u_t      = clip(d_t - mean_t d, -c, c), re-centred to zero mean over the rollout's tokens
    A_hat_t  = A_i + lambda * s_i * u_t,  s_i = sign(A_i), or 1 when the group's rewards are all equal

Design decision: the formulation clips and also wants sum_t (A_hat_t - A_i) = 0; clipping breaks the zero mean, so
u is re-centred after clipping (|u| <= 2c). Because u varies over tokens even when every A_i = 0, all-fail
groups still get a learning signal. Settings: rl.options.sipo.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import assert_no_grad
from posttrain.objectives import advantages
from posttrain.objectives.grpo import grpo
from posttrain.rollout import RolloutBatch


class SIPOOptions(Section):
    lam: float = Field(0.3, ge=0)  # weight of the redistributive token term
    clip: float = Field(2.0, gt=0)  # c, the outlier rail on d - mean(d)
    max_mistakes: int = Field(3, ge=0)  # |M|, mistakes of the group shown in the contexts


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    m = mask.to(values.dtype)
    return (values * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)


def redistribution(gap: Tensor, mask: Tensor, clip: float) -> Tensor:
    """u [B, T]: the clipped, zero-mean (per rollout, over produced tokens) contrastive gap; 0 on padding."""
    m = mask.to(gap.dtype)
    u = torch.clamp(gap - masked_mean(gap, mask), -clip, clip) * m
    return (u - masked_mean(u, mask)) * m


def sipo_advantage(seq_adv: Tensor, gap: Tensor, mask: Tensor, lam: float, clip: float) -> Tensor:
    """A_hat [B, T] = A_i + lambda * s_i * u_t (padding 0)."""
    assert_no_grad(contrast_gap=gap)
    sign = torch.where(seq_adv != 0, torch.sign(seq_adv), torch.ones_like(seq_adv))
    m = mask.to(gap.dtype)
    return (seq_adv[:, None] + lam * sign[:, None] * redistribution(gap, mask, clip)) * m


@advantages.register("sipo", needs=("contrast_logp_gap",), options=SIPOOptions)
def sipo(batch: RolloutBatch, cfg) -> Tensor:
    opts: SIPOOptions = cfg.options_for("sipo")
    return sipo_advantage(grpo(batch, cfg), batch.extras["contrast_logp_gap"], batch.completion_mask, opts.lam, opts.clip)
