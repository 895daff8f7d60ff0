"""GAE, Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", arXiv 1506.02438, eqs. 11-16) over the token-level MDP of PPO for language
models (Ouyang et al. 2022, arXiv 2203.02155; verl's `compute_gae_advantage_return`).

Each policy token y_t is an action in the state s_t = (x, y_<t); V(s_t) is the critic's value at the position
that predicts y_t (extra `values`, read under no_grad at rollout time). The weighted sequence reward r (NaN
columns as 0, as every estimator here) is placed on the last policy token; every other reward is 0.

    delta_t = r_t + gamma * V(s_t') - V(s_t)            t' = the next POLICY token (observations skipped), V = 0 after the last
    A_t     = delta_t + gamma * lam * A_t'              (eq. 16, by the backward recursion)
    R_t     = A_t + V(s_t)                              the value target (TD(lambda) return)
    A       <- (A - mean) / sqrt(var + 1e-8)            over policy tokens (`whiten`; unbiased var, as verl)

Environment observation tokens (completion_mask 0, attention_mask 1) are not actions: the recursion carries
V and A across them unchanged, so an episode's policy tokens form one chain. With gamma = lam = 1 the
advantage of the first token is sum_t r_t - V(s_0), the return minus the first value.
Settings: rl.options.gae (defaults on its options model below); the critic: rl.critic.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives import advantages
from posttrain.objectives.grpo import weighted_reward
from posttrain.rollout import RolloutBatch


class GAEOptions(Section):  # rl.options.gae
    gamma: float = Field(1.0, ge=0, le=1)  # discount per policy token
    lam: float = Field(0.95, ge=0, le=1)  # GAE lambda: 1 = Monte-Carlo return minus V, 0 = one-step TD error
    whiten: bool = True  # normalise the advantages over the batch's policy tokens


def last_token_rewards(reward: Tensor, mask: Tensor) -> Tensor:
    """[B, T]: the sequence reward [B] on each row's last policy token, 0 elsewhere (and on rows without one)."""
    m = mask.to(torch.long)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values  # -1: no policy token
    out = torch.zeros(m.shape, dtype=reward.dtype, device=reward.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = reward[rows]
    return out


@torch.no_grad()
def gae_advantages_returns(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """(A [B, T], R [B, T]) by the backward recursion over policy tokens; both 0 off the mask."""
    m = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    out = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        here = delta + gamma * lam * running
        running = m[:, t] * here + (1 - m[:, t]) * running  # an observation token passes the chain on unchanged
        next_value = m[:, t] * values[:, t] + (1 - m[:, t]) * next_value
        out[:, t] = running
    advantage = out * m
    return advantage, (advantage + values) * m


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(v - mean) / sqrt(unbiased var + eps) over the mask's entries (0 off the mask; one entry: centred only)."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n.clamp(min=1.0)
    var = (((values - mean) ** 2) * m).sum() / (n - 1).clamp(min=1.0)
    return (values - mean) * torch.rsqrt(var + eps) * m


def gae_inputs(batch: RolloutBatch, cfg) -> tuple[Tensor, Tensor, Tensor, GAEOptions]:
    """(token rewards [B, T], old values [B, T], policy-token mask, options) of a batch."""
    opts: GAEOptions = cfg.options_for("gae")
    reward, _ = weighted_reward(batch)
    values = batch.extras["values"].to(reward.dtype)
    return last_token_rewards(reward, batch.completion_mask), values, batch.completion_mask, opts


def gae_returns(batch: RolloutBatch, cfg) -> Tensor:
    """[B, T] the critic's regression targets R_t = A_t + V(s_t) (before whitening)."""
    rewards, values, mask, opts = gae_inputs(batch, cfg)
    return gae_advantages_returns(rewards, values, mask, opts.gamma, opts.lam)[1]


@advantages.register("gae", needs=("values",), options=GAEOptions)
def gae(batch: RolloutBatch, cfg) -> Tensor:
    """[B, T] per-token GAE advantages from the critic's rollout-time values (whitened with `whiten`)."""
    rewards, values, mask, opts = gae_inputs(batch, cfg)
    advantage, _ = gae_advantages_returns(rewards, values, mask, opts.gamma, opts.lam)
    return masked_whiten(advantage, mask) if opts.whiten else advantage
