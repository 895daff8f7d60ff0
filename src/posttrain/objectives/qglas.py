"""QGLAS, Quality-Gated Length Advantage Shaping (2026; derived from its abstract): quality alone
decides the direction of reinforcement, length may only add a bounded bonus to quality-favoured responses.

    A_i   = GRPO advantage of the weighted (quality) reward                 (as `grpo`: rl.std_scaling, rl.std_eps)
    P     = { i scored in i's group : A_i > 0 };  shaping only where |P| >= 2
    sh_i  = clip( (mean_P L - L_i) / mean_P L, 0, 1 )                         L_i = completion_mask.sum(-1)
    sep   = std_P(q) / (std_group(q) + eps)                                  (Bessel stds, scored rows only)
    s     = gamma_max * exp(-sep / sigma_0)                                  (large when positives are alike)
    b_i   = min(b_max, s * sh_i)
    A'_i  = A_i + b_i (mode "additive")  or  A_i (1 + b_i) (mode "multiplicative", sign-safe);  A'_i = A_i off P

Invariants: sign(A') = sign(A); A' = A where A <= 0; 0 <= A' - A <= b_max (additive); the longest positive
gets no bonus; equal lengths in P give A' = A; the strength is non-increasing in sep.
Settings: rl.options.qglas (defaults on its options model below).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_moments, group_normalize, weighted_reward
from posttrain.rollout import RolloutBatch


class QGLASOptions(Section):
    gamma_max: float = Field(0.5, ge=0)  # the largest bonus strength (at sep = 0)
    b_max: float = Field(0.5, ge=0)  # cap on the bonus, in advantage units
    sigma_0: float = Field(0.5, gt=0)  # separation scale of the strength's decay
    eps: float = Field(1e-06, gt=0)  # in sep's denominator
    mode: Literal["additive", "multiplicative"] = "additive"  # additive | multiplicative (A * (1 + b), sign-safe)


def strength(sep: Tensor, opts: QGLASOptions) -> Tensor:
    """s = gamma_max * exp(-sep / sigma_0): non-increasing in the within-P quality separation."""
    return opts.gamma_max * torch.exp(-sep / opts.sigma_0)


def length_bonus(reward: Tensor, adv: Tensor, lengths: Tensor, group: Tensor, scored: Tensor, opts: QGLASOptions) -> Tensor:
    """b_i [B] (0 off P and in groups with fewer than two positives)."""
    positive = scored & (adv > 0)
    n_pos, mean_len, _ = group_moments(lengths, group, positive)
    _, _, std_pos = group_moments(reward, group, positive)
    _, _, std_all = group_moments(reward, group, scored)
    shortness = ((mean_len - lengths) / mean_len.clamp(min=1e-12)).clamp(0.0, 1.0)
    sep = std_pos / (std_all + opts.eps)
    bonus = torch.clamp(strength(sep, opts) * shortness, max=opts.b_max)
    return torch.where(positive & (n_pos >= 2), bonus, torch.zeros_like(bonus))


@advantages.register("qglas", needs=(), options=QGLASOptions)
def qglas(batch: RolloutBatch, cfg) -> Tensor:
    opts: QGLASOptions = cfg.options_for("qglas")
    reward, scored = weighted_reward(batch)
    adv = group_normalize(reward, batch.group, cfg.std_scaling, cfg.std_eps, scored)
    lengths = batch.completion_mask.to(reward.dtype).sum(-1)
    bonus = length_bonus(reward, adv, lengths, batch.group, scored, opts)
    return adv + bonus if opts.mode == "additive" else adv * (1.0 + bonus)
