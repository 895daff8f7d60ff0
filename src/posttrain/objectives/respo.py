"""ReSPO, Reshaped Sequence Policy Optimization (2026; derived from its abstract; kernel family and
loss form from its public precursor VESPO, arXiv 2602.10693): REINFORCE with a detached, two-branch,
sequence-level kernel of the true (not length-normalised) importance weight instead of PPO clipping.

    w_i     = exp( clamp( sum_t (logp_theta - logp_old) mask, -20, 20 ) )
    phi_+(w) = max( phi_min, w^a_+ exp(lambda_+ (1 - w)) )            for A >= 0   (0 <= a_+ < 1)
    phi_-(w) = w^a_- exp(lambda_- (1 - w))                              for A < 0    (a_- >= 1, lambda_- > 0)
    loss    = AGG_t( - sg(phi(w_i)) A_{i,t} logp_theta(y_{i,t}) )       gradient = phi A grad logp

w^a exp(lambda (1 - w)) is computed in log space and equals 1 at w = 1 on both branches, so an on-policy
step is plain policy gradient. Under-generated positives (w << 1) keep at least phi_min; over-generated
negatives (w >> 1) are suppressed (phi_- -> 0, maximal at w = a_-/lambda_-). Like CISPO's, the loss value
is not a surrogate objective, only its gradient matters. Settings: rl.options.respo (defaults in params.yaml).

Metrics: `phi_mean` (valid tokens), `floored_pos_fraction` (A > 0 tokens whose phi_+ sits on the floor),
`clip_fraction` (valid tokens whose kernel was floored: ReSPO's only truncation), `ratio_mean` (w per sequence).
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

LOG_W_BOUND = 20.0


class ReSPOOptions(Section):
    a_pos: float = Field(0.5, ge=0, lt=1)  # alpha-divergence power of the positive branch
    lambda_pos: float = Field(1.0, ge=0)  # variance-control tilt of the positive branch
    phi_min: float = Field(0.2, gt=0, le=1)  # floor of the positive branch (<= 1 keeps phi_+(1) = 1)
    a_neg: float = Field(3.0, ge=1)  # phi_- = w^a_neg exp(lambda_neg (1 - w)), max at w = a_neg / lambda_neg
    lambda_neg: float = Field(2.0, gt=0)


def sequence_log_weight(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """[B, 1] log w = clamp(sum over valid tokens of logp - old_logp, -20, 20)."""
    log_w = ((logp - old_logp) * mask.to(logp.dtype)).sum(-1, keepdim=True)
    return log_w.clamp(-LOG_W_BOUND, LOG_W_BOUND)


def log_kernel(log_w: Tensor, a: float, lam: float) -> Tensor:
    """log( w^a exp(lam (1 - w)) ) = a log w + lam (1 - w); 0 at w = 1."""
    return a * log_w + lam * (1.0 - torch.exp(log_w))


def phi_pos(log_w: Tensor, opts: ReSPOOptions) -> Tensor:
    return torch.exp(log_kernel(log_w, opts.a_pos, opts.lambda_pos)).clamp(min=opts.phi_min)


def phi_neg(log_w: Tensor, opts: ReSPOOptions) -> Tensor:
    return torch.exp(log_kernel(log_w, opts.a_neg, opts.lambda_neg))


@losses.register("respo", needs=(), options=ReSPOOptions)
def respo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    opts: ReSPOOptions = cfg.options_for("respo")
    adv = per_token(advantages, logp)
    with torch.no_grad():
        log_w = sequence_log_weight(logp, old_logp, mask)  # [B, 1]
        raw_pos = torch.exp(log_kernel(log_w, opts.a_pos, opts.lambda_pos))
        phi = torch.where(adv >= 0, phi_pos(log_w, opts), phi_neg(log_w, opts))  # [B, T]
    loss = aggregate(cfg, -phi * adv * logp, mask)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1.0)
        floored = (adv >= 0) & (raw_pos < opts.phi_min)
        pos = (adv > 0).to(m.dtype) * m
        metrics = {
            "phi_mean": float((phi * m).sum() / n),
            "floored_pos_fraction": float((floored.to(m.dtype) * pos).sum() / pos.sum().clamp(min=1.0)),
            "clip_fraction": float((floored.to(m.dtype) * m).sum() / n),
            "ratio_mean": float(torch.exp(log_w).mean()) if log_w.numel() else 1.0,
        }
    return loss, metrics
