"""DPPO, Divergence Proximal Policy Optimization (arXiv 2602.04879, eqs. 13-14, §5.4): the trust region is a mask
on the divergence between the new and the old token distribution, restricted to the sampled token's binary
(taken / not taken) distribution, instead of a clip on the ratio. With p = pi_theta(y_t), q = pi_old(y_t):

    binary TV   D_t = p - q
    binary KL   D_t = q log(q / p) + (1 - q) log((1 - q) / (1 - p))          (1e-8 inside the second log)
    valid_t     = D_t <= delta_high            for A_t > 0     (TV: p - q <= delta_high;  KL: or p <= q)
                  D_t >= -delta_low            for A_t <= 0    (TV: q - p <= delta_low;   KL: D_t <= delta_low or p >= q)
    loss        = AGG_t( - A_t sg(min(rho_t, C)) logp_theta(y_t) valid_t )     rho_t = exp(clamp(logp - logp_old, +-20))

The gradient of a valid token is min(rho, C) A grad logp: the PPO gradient without its clip, truncated at C (a
large C, §5.4). = verl's `dppo_tv` / `dppo_kl` (core_algos.py) and SkyRL's `dppo` (binary_tv / binary_kl).
Settings: rl.options.dppo_tv, rl.options.dppo_kl. Metrics: `clip_fraction` (tokens masked by the divergence),
`truncated_fraction` (valid tokens whose ratio exceeded C).
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
from posttrain.objectives.token_stats import masked_share


class DPPOOptions(Section):
    delta_low: float = Field(0.2, gt=0)  # divergence threshold for A <= 0 tokens
    delta_high: float = Field(0.2, gt=0)  # divergence threshold for A > 0 tokens
    cap: float = Field(20.0, gt=0)  # C: the detached ratio is truncated here (verl's clip_ratio_c, default 20)


class DPPOKLOptions(DPPOOptions):  # the binary KL is on a smaller scale than TV: tighter thresholds
    delta_low: float = Field(0.05, gt=0)
    delta_high: float = Field(0.05, gt=0)


def binary_kl(logp: Tensor, old_logp: Tensor) -> Tensor:
    """KL(Bernoulli(q) || Bernoulli(p)) of the sampled token, q = exp(old_logp), p = exp(logp)."""
    p, q = torch.exp(logp), torch.exp(old_logp)
    return q * (old_logp - logp) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))


def tv_valid(logp: Tensor, old_logp: Tensor, adv: Tensor, opts: DPPOOptions) -> Tensor:
    diff = torch.exp(logp) - torch.exp(old_logp)
    return torch.where(adv > 0, diff <= opts.delta_high, diff >= -opts.delta_low)


def kl_valid(logp: Tensor, old_logp: Tensor, adv: Tensor, opts: DPPOOptions) -> Tensor:
    kl, up = binary_kl(logp, old_logp), logp >= old_logp
    return torch.where(adv > 0, (kl <= opts.delta_high) | (logp <= old_logp), (kl <= opts.delta_low) | up)


def dppo(name: str, valid_fn, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: DPPOOptions = cfg.options_for(name)
    adv = per_token(advantages, logp)
    with torch.no_grad():
        ratio = bounded_ratio(logp, old_logp)
        valid = valid_fn(logp, old_logp, adv, opts)
        weight = ratio.clamp(max=opts.cap) * valid
    loss = aggregate(cfg, -adv * weight * logp, mask)
    return loss, {"clip_fraction": masked_share(~valid, mask), "truncated_fraction": masked_share(valid & (ratio > opts.cap), mask)}


@losses.register("dppo_tv", needs=(), options=DPPOOptions)
def dppo_tv(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    return dppo("dppo_tv", tv_valid, logp, old_logp, advantages, mask, cfg)


@losses.register("dppo_kl", needs=(), options=DPPOKLOptions)
def dppo_kl(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    return dppo("dppo_kl", kl_valid, logp, old_logp, advantages, mask, cfg)
