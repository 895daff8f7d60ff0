"""UniOPSD, unified on-policy self-distillation with adaptive local credit arbitration (2026, read from
Zenghuang-Fu/Uniopsd `verl/trainer/ppo/rlsd_utils.py` (compute_opsd_step_tier, compute_rlsd_token_advantage,
form "fusion") and `rlsd_ray_trainer.py` (rho EMA, c*); its base is GiGPO, Feng et al. 2025, arXiv 2505.10978,
Eqs. 3 and 5-8 (verl-agent `gigpo/core_gigpo.py`); restated, no code copied).

Credit lives on step-rows (objectives/distill/anchors.py), one per environment step k of every rollout.
A rollout's steps are the runs of tokens the policy produced between two observations (`completion_mask`; in envs/rollout.py every action is
one token, so a run is one action, or a few when no-op actions got an empty observation). Step-rows whose
states coincide form an anchor group (GiGPO Eq. 6): within one rollout group, rows with the same anchor key,
either the whole observation history before the step (`anchor: history`, prompt + every earlier token) or
the last observation the policy read (`anchor: observation`, GiGPO's anchor_obs; the prompt at step 0).

    A^E_k  episode advantage of the step's rollout: return - group mean (GiGPO Eq. 3; mode mean_norm, or
           / group std with mean_std_norm)
    G_k    discounted return from step k: gamma^(K-1-k) R (the outcome R arrives at the last of K steps; Eq. 5)
    A^S_k  = omega * (G_k - mean of G over the anchor group)  (Eq. 7; / anchor std with mean_std_norm)

A self-teacher with a successful peer of the group in context re-scores each step (the `peer_logp_gap`
provider: a lone success has no peer, so its rows are untaught); its gap Delta_t = logp_T - logp_S becomes a
second estimate of the step advantage, fused with the environment's:

    A^O  = scale * (mean_t Delta - mean_anchor mean_t Delta),  scale = std(A^S) / std(A^O_raw) on taught rows
    prec_S = n / var(step returns in anchor)  (0 without step evidence),  prec_O = 1 / ((var_t Delta / L) scale^2)
    z_S, z_O = precisions / their median over rows with both evidences
    c*   = u (u - r2) / (u^2 - 2 u r2 + r2),  r2 = min(rho_used^2, u (1 - 1e-6)),  u = a_reliability
    c_k  = k z_S / (k z_S + z_O) with k = c* / (1 - c*) (both);  c* (teacher only);  1 (no teacher, or c* = 1)
    F_k  = c_k A^S + (1 - c_k) A^O;   w_t = clip(exp(sign(F) Delta_t), 1 - eps_w, 1 + eps_w)
    A_hat_t = A^E + F ((1 - lambda) + lambda w_t) on the tokens of step k,
    lambda = lambda0 (1 - step / warmdown) before warmdown, then 0

rho_used is the shrunken EMA of past steps' Pearson corr(A^S, A^O) (the `uniopsd_rho` provider in
trainers/extras.py, which declares TrustState as its state). A one-token step has var_t Delta = 0, so every
such row gets the same (clamped) teacher precision and z_O = 1: the arbitration then follows z_S alone.
On single-turn tasks every rollout is one step whose anchor is the prompt, so the anchor group is the rollout
group and A^S = omega * A^E. Settings: rl.options.uniopsd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.state import DataclassState
from posttrain.errors import assert_no_grad
from posttrain.objectives import advantages
from posttrain.objectives.distill.anchors import StepRows, step_rows
from posttrain.objectives.grpo import group_moments, group_normalize, weighted_reward
from posttrain.rollout import RolloutBatch


class UniOPSDOptions(Section):
    lam0: float = Field(0.5, ge=0, le=1)  # rlsd_lambda
    warmdown_steps: int = Field(100, gt=0)
    eps_w: float = Field(0.2, ge=0, lt=1)  # clip_eps of the token weight
    a_reliability: float = Field(0.5, gt=0, lt=1)  # u
    rho_decay: float = Field(0.9, ge=0, lt=1)
    rho_shrink_z: float = Field(2.33, ge=0)
    step_advantage_w: float = Field(1.0, ge=0)  # omega
    gamma: float = Field(0.95, ge=0, le=1)  # GiGPO's discount of the step returns
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"  # GiGPO's normalisation of both tiers
    anchor: Literal["history", "observation"] = "observation"  # which state key makes step-rows one anchor group
    eps: float = Field(1e-06, gt=0)


@dataclass(frozen=True)
class StepTier:
    a_episode: Tensor  # [N]
    a_step: Tensor  # [N]
    a_teacher: Tensor  # [N] (0 on untaught rows)
    prec_step: Tensor  # [N]
    prec_teacher: Tensor  # [N]
    has_step: Tensor  # [N] bool
    has_teacher: Tensor  # [N] bool

    @property
    def both(self) -> Tensor:
        return self.has_step & self.has_teacher


def step_tier_from(
    a_episode: Tensor, returns: Tensor, anchor: Tensor, gap: Tensor, mask: Tensor, omega: float, std_scaling: str, std_eps: float, eps: float,
    scored: Tensor | None = None,
) -> StepTier:
    """The step tier of every step-row (`returns` its G_k, `gap` and `mask` restricted to its tokens); rows
    without a real reward (`scored` False) get no environment advantage."""
    assert_no_grad(teacher_gap=gap)
    scored = torch.ones_like(returns, dtype=torch.bool) if scored is None else scored
    m = mask.to(gap.dtype)
    length = m.sum(-1).clamp(min=1.0)
    dbar = (gap * m).sum(-1) / length
    var = ((gap - dbar[:, None]) ** 2 * m).sum(-1) / length
    has_teacher = ((gap != 0) & mask.bool()).any(-1)
    a_step = omega * group_normalize(returns, anchor, std_scaling, std_eps, scored)
    _, dbar_mean, _ = group_moments(dbar, anchor, has_teacher)
    raw = torch.where(has_teacher, dbar - dbar_mean, torch.zeros_like(dbar))
    taught = has_teacher.nonzero().squeeze(-1)
    if taught.numel() > 1:
        scale = a_step[taught].std() / (raw[taught].std() + eps)
    else:
        scale = torch.ones((), dtype=gap.dtype, device=gap.device)
    n, _, ret_std = group_moments(returns, anchor, scored)
    r_var = ret_std**2
    has_step = (n >= 2) & (r_var > 0) & scored
    prec_step = torch.where(has_step, n / r_var.clamp(min=eps), torch.zeros_like(r_var))
    prec_teacher = torch.where(has_teacher, 1.0 / ((var / length) * scale**2).clamp(min=eps), torch.zeros_like(var))
    return StepTier(a_episode, a_step, scale * raw, prec_step, prec_teacher, has_step, has_teacher)


def tiers(batch: RolloutBatch, gap: Tensor, cfg, opts: UniOPSDOptions) -> tuple[StepRows, StepTier]:
    """The step-rows of a batch and their tiers (`gap` [B, T] is split onto the step-rows)."""
    returns, scored = weighted_reward(batch)
    std_scaling = "group" if opts.mode == "mean_std_norm" else "none"
    a_episode = group_normalize(returns, batch.group, std_scaling, cfg.std_eps, scored)
    steps = step_rows(batch, returns, opts.gamma, opts.anchor)
    step_gap = gap[steps.row] * steps.mask.to(gap.dtype)
    tier = step_tier_from(a_episode[steps.row], steps.step_return, steps.anchor, step_gap, steps.mask, opts.step_advantage_w, std_scaling,
                          cfg.std_eps, opts.eps, scored[steps.row])
    return steps, tier


def step_tier(batch: RolloutBatch, gap: Tensor, cfg, opts: UniOPSDOptions) -> StepTier:
    return tiers(batch, gap, cfg, opts)[1]


def successful_peers(success: list[bool], group: list[int]) -> list[int | None]:
    """The peer whose hindsight teaches each rollout: the first OTHER successful rollout of its group, None when
    there is none (so a lone success is never its own teacher: the teacher must know something it did not)."""
    out = []
    for i, g in enumerate(group):
        out.append(next((j for j, (h, ok) in enumerate(zip(group, success)) if h == g and ok and j != i), None))
    return out


def c_star(rho_used: float, u: float) -> float:
    """The global trust in the environment's step advantage; 1 when rho_used = 0, falling as rho_used^2 -> u."""
    r2 = min(rho_used**2, u * (1 - 1e-6))
    value = u * (u - r2) / (u * u - 2 * u * r2 + r2)
    return min(max(value, 0.0), 1.0)


def reliability(tier: StepTier, cstar: float) -> Tensor:
    """c_k [B]: the per-row weight of A^S against A^O."""
    ones = torch.ones_like(tier.a_step)
    if cstar >= 1.0:
        return ones
    both = tier.both
    if both.any():
        z_step = tier.prec_step / tier.prec_step[both].median().clamp(min=1e-12)
        z_teacher = tier.prec_teacher / tier.prec_teacher[both].median().clamp(min=1e-12)
    else:
        z_step, z_teacher = ones, ones
    k = cstar / (1.0 - cstar) * z_step
    fused = k / (k + z_teacher).clamp(min=1e-12)
    c = torch.where(both, fused, ones)
    return torch.where(tier.has_teacher & ~tier.has_step, torch.full_like(c, cstar), c)


def fused_advantage(tier: StepTier, c: Tensor, gap: Tensor, mask: Tensor, lam: float, eps_w: float) -> Tensor:
    """A_hat [B, T] = A^E + F ((1 - lambda) + lambda w_t), w_t = clip(exp(sign(F) Delta_t), 1 -+ eps_w)."""
    fused = c * tier.a_step + (1 - c) * tier.a_teacher
    w = torch.clamp(torch.exp(torch.sign(fused)[:, None] * gap), 1 - eps_w, 1 + eps_w)
    return (tier.a_episode[:, None] + fused[:, None] * ((1 - lam) + lam * w)) * mask.to(gap.dtype)


def token_lambda(step: int, opts: UniOPSDOptions) -> float:
    """lambda at the 0-based update `step`: linear warm-down from lam0 to 0 over warmdown_steps."""
    return opts.lam0 * (1 - step / opts.warmdown_steps) if step < opts.warmdown_steps else 0.0


@dataclass
class TrustState(DataclassState):
    rho_ema: float | None = None
    n_rows: int = 0

    def rho_used(self, opts: UniOPSDOptions) -> float:
        if self.rho_ema is None or self.n_rows == 0:
            return 0.0
        n_eff = self.n_rows / (1 - opts.rho_decay)
        return max(0.0, self.rho_ema - opts.rho_shrink_z / math.sqrt(n_eff))

    def update(self, a_step: Tensor, a_teacher: Tensor, both: Tensor, opts: UniOPSDOptions) -> None:
        x, y = a_step[both].double(), a_teacher[both].double()
        if x.numel() < 3 or x.std() == 0 or y.std() == 0:
            return
        rho = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
        self.rho_ema = rho if self.rho_ema is None else opts.rho_decay * self.rho_ema + (1 - opts.rho_decay) * rho
        self.n_rows = int(x.numel())


@advantages.register("uniopsd", needs=("peer_logp_gap", "uniopsd_rho", "train_step"), options=UniOPSDOptions)
def uniopsd(batch: RolloutBatch, cfg) -> Tensor:
    opts: UniOPSDOptions = cfg.options_for("uniopsd")
    gap = batch.extras["peer_logp_gap"]
    steps, tier = tiers(batch, gap, cfg, opts)
    c = reliability(tier, c_star(float(batch.extras["uniopsd_rho"]), opts.a_reliability))
    lam = token_lambda(int(batch.extras["train_step"]) - 1, opts)
    per_step = fused_advantage(tier, c, gap[steps.row], steps.mask, lam, opts.eps_w)  # [N, T], each on its own tokens
    return torch.zeros(gap.shape, dtype=per_step.dtype, device=gap.device).index_add_(0, steps.row, per_step)


def arbitration(batch: RolloutBatch, cfg) -> dict[str, float]:
    """What UniOPSD's arbitration did on one batch that carries its extras (`peer_logp_gap`, `uniopsd_rho`):
    rho_used and c*; the shares of step-rows the peer teacher taught, whose reliability c_k < 1 (the teacher's
    estimate entered their credit: 0 whenever rho_used = 0, since then c* = 1), and whose step tier A^S differs
    from omega A^E (the step credit tells them something the episode does not). Without the first two shares the
    method is GiGPO; without the third it is GRPO."""
    opts: UniOPSDOptions = cfg.options_for("uniopsd")
    rho = float(batch.extras["uniopsd_rho"])
    cstar = c_star(rho, opts.a_reliability)
    _, tier = tiers(batch, batch.extras["peer_logp_gap"], cfg, opts)
    c = reliability(tier, cstar)
    differs = (tier.a_step - opts.step_advantage_w * tier.a_episode).abs() > 1e-6
    return {"rho_used": rho, "c_star": cstar, "taught_share": float(tier.has_teacher.float().mean()),
            "arbitrated_share": float((c < 1 - 1e-6).float().mean()), "tiers_differ_share": float(differs.float().mean())}
