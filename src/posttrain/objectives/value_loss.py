"""The PPO clipped value loss (Schulman et al. 2017, arXiv 1707.06347, eq. 9's L^VF with the value clipping of
the OpenAI baselines / TRL / verl `compute_value_loss`), the auxiliary term that trains the critic:

    V_clip = clip(V_theta(s_t), V_old(s_t) - eps_v, V_old(s_t) + eps_v)
    L^VF   = 0.5 * AGG_t max( (V_theta - R_t)^2, (V_clip - R_t)^2 )          R_t: GAE returns (objectives/gae.py)

V_theta is the trainer's critic forward with gradient (`CriticOutputs.values`), V_old the rollout-time values
(extra `values`, no gradient) and AGG the configured `rl.loss_agg` over policy tokens. The critic's parameters
are disjoint from the policy's, so the sum with the policy loss trains each on its own term only; the
returns and old values carry no gradient. Registry meta `critic=True` tells the trainer to run the critic
forward and to train the critic (rl.critic: lr, warm-up steps during which only this term is stepped).

Figures: value/loss, value/clipfrac, value/explained_variance = 1 - Var(R - V_old) / Var(R) over policy
tokens (1 for a perfect critic, 0 for one no better than the mean), value/mean, value/returns_mean.
Settings: rl.options.value (defaults on its options model below).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import assert_no_grad
from posttrain.objectives import auxiliaries
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.gae import gae_returns
from posttrain.rollout import PolicyOutputs, RolloutBatch


@dataclass(frozen=True)
class CriticOutputs(PolicyOutputs):
    """The trainer's policy outputs plus the critic's forward of the same update pass, when a part trains it."""

    values: Tensor | None = None  # [B, T] V_theta(s_t) with gradient


class ValueLossOptions(Section):  # rl.options.value
    clip: float = Field(0.2, gt=0)  # eps_v: how far one update may move a value from its rollout-time estimate


def clipped_value_loss(vpred: Tensor, returns: Tensor, old_values: Tensor, mask: Tensor, clip: float, cfg) -> tuple[Tensor, Tensor]:
    """(0.5 * AGG max((V - R)^2, (V_clip - R)^2), share of policy tokens where the clipped square is larger)."""
    clipped = torch.maximum(torch.minimum(vpred, old_values + clip), old_values - clip)
    plain_sq, clipped_sq = (vpred - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * aggregate(cfg, torch.maximum(plain_sq, clipped_sq), mask)
    m = mask.to(vpred.dtype)
    clipfrac = ((clipped_sq > plain_sq).to(m.dtype) * m).sum() / (m.sum() + 1e-8)
    return loss, clipfrac.detach()


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the mask's entries (NaN when the returns do not vary)."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    if r.numel() < 2 or float(r.var()) == 0.0:
        return float("nan")
    return float(1.0 - (r - v).var() / r.var())


@auxiliaries.register("value", needs=("values",), critic=True, options=ValueLossOptions)
def value_loss(batch: RolloutBatch, policy: CriticOutputs, cfg, module=None) -> tuple[Tensor, dict[str, float]]:
    opts: ValueLossOptions = cfg.options_for("value")
    old_values, returns = batch.extras["values"], gae_returns(batch, cfg)
    assert_no_grad(values=old_values, returns=returns)
    mask = batch.completion_mask
    vpred = policy.values.to(returns.dtype)
    loss, clipfrac = clipped_value_loss(vpred, returns, old_values.to(returns.dtype), mask, opts.clip, cfg)
    m = mask.to(returns.dtype)
    n = m.sum().clamp(min=1.0)
    return loss, {
        "value/loss": float(loss.detach()), "value/clipfrac": float(clipfrac),
        "value/explained_variance": explained_variance(returns, old_values, mask),
        "value/mean": float((old_values * m).sum() / n), "value/returns_mean": float((returns * m).sum() / n),
    }
