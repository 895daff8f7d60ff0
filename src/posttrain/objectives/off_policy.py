"""Off-policy corrections (registry `corrections`, `rl.correction`, options `rl.options.<name>`).

In asynchronous RL a token is sampled by the behaviour policy mu (the version its worker held, log-probs recorded at
sampling: `batch.old_logp`) while the trainer holds a newer policy. The trainer's first policy forward of an update,
before any optimiser step, gives the proximal policy pi_prox (the trainer at v_now; detached). With theta the
parameters being trained, r_theta = pi_theta / pi_prox is the trust-region ratio and w = pi_prox / mu the
behaviour importance weight. A correction turns (mu, pi_prox, mask) into what the policy loss reads:

    old_logp  the log-probs the loss's ratio is taken against
    weight    a detached, non-negative weight per token [B, T] or per sequence [B] (None: 1)
    mask      the loss mask (masked IS drops tokens or whole sequences)

and the trainer calls `loss(logp, old_logp, weight * A, mask)`. Scaling the advantage by w >= 0 is exactly
weighting the per-token surrogate: min(r wA, clip(r) wA) = w min(r A, clip(r) A) for w >= 0, and every loss that is
positively homogeneous in A (clip, cispo, gspo, ...) is weighted the same way.

none       old_logp = mu, no weight: PPO clipped around the behaviour policy (what a synchronous run does).
tis        truncated importance sampling (Ionides 2008, "Truncated importance sampling", J. Comput. Graph. Stat. 17(2):
           w -> min(w, C);
           IMPALA's truncated rho-bar, Espeholt et al. 2018, arXiv 1802.01561, eq. 1; for the sampler-vs-trainer
           mismatch Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training":
           grad = E_mu[min(pi/mu, C) A grad log pi]):
               token level     w_t = min(pi_prox_t / mu_t, C)
               sequence level  w   = min(prod_t pi_prox_t / mu_t, C)      (one weight per completion)
           with the clip taken around pi_prox.
mis        masked importance sampling (Liu et al. 2025, "When speed kills stability: demystifying RL collapse from the
           training-inference mismatch", sequence-level MIS: w = rho 1[rho <= C]; prime-rl's masked ratios at token
           level): tokens (or sequences) whose ratio rho = pi_prox / mu leaves [low, high] leave the loss mask; the
           others keep weight rho.
decoupled  the decoupled PPO loss with a proximal policy (Hilton, Cobbe & Schulman 2022, arXiv 2110.00641, §3;
           AReaL, Fu et al. 2025, arXiv 2505.24298, §5.2):
               J = E_mu[ (pi_prox / mu) min(r_theta A, clip(r_theta, 1 - eps_low, 1 + eps_high) A) ]
           per token; with `cap` > 0 a token whose weight exceeds the cap leaves the mask (AReaL's
           behav_imp_weight_cap).

At zero staleness (mu == pi_prox) every correction is the identity: w = 1, nothing is masked, and old_logp is the
behaviour log-prob, so the loss equals the uncorrected one (tests/unit/test_off_policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.registry import Registry

corrections: Registry = Registry("off-policy correction")


@dataclass(frozen=True)
class Corrected:
    old_logp: Tensor  # [B, T] what the loss's ratio is taken against
    weight: Tensor | None  # [B, T] or [B], detached and >= 0; None: 1
    mask: Tensor  # [B, T] the loss mask
    metrics: dict[str, float]


def weighted_advantages(advantages: Tensor, weight: Tensor | None) -> Tensor:
    """The advantage times a correction's weight: [B] x [B] stays per sequence, anything with a [B, T] side is per token."""
    if weight is None:
        return advantages
    if advantages.dim() == weight.dim():
        return advantages * weight
    return advantages[:, None] * weight if advantages.dim() == 1 else advantages * weight[:, None]


def log_ratio(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor) -> Tensor:
    """log(pi_prox / mu) per token, 0 off the mask (padding and observations carry no ratio)."""
    assert not proximal_logp.requires_grad, "the proximal log-probs must not carry gradient"
    return (proximal_logp - behaviour_logp) * mask.to(proximal_logp.dtype)


def _figures(name: str, weight: Tensor, kept: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean weight over the kept tokens and the share of the policy's tokens the correction dropped or truncated."""
    m = mask.bool()
    w = weight if weight.dim() == 2 else weight[:, None].expand_as(mask)
    n = max(int(m.sum()), 1)
    return {f"{name}/weight_mean": float(w[kept & m].mean()) if bool((kept & m).any()) else 0.0,
            f"{name}/dropped_fraction": float((m & ~kept).sum()) / n}


class TISOptions(Section):
    level: Literal["token", "sequence"] = "token"  # one weight per token, or the product of a completion's ratios
    cap: float = Field(2.0, gt=0)  # C: weights above it are truncated to it


class MISOptions(Section):
    level: Literal["token", "sequence"] = "sequence"  # token | sequence
    low: float = Field(0.5, ge=0)  # ratios below it are masked out
    high: float = Field(2.0, gt=0)  # ratios above it are masked out


class DecoupledOptions(Section):
    cap: float = Field(5.0, ge=0)  # a token whose behaviour weight exceeds this leaves the mask; 0: no cap


@corrections.register("none", rows=True)
def no_correction(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: None = None) -> Corrected:
    return Corrected(behaviour_logp, None, mask, {})


@corrections.register("tis", options=TISOptions, rows=True)
def truncated_is(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: TISOptions) -> Corrected:
    lr = log_ratio(behaviour_logp, proximal_logp, mask)
    ratio = torch.exp(lr.sum(-1) if options.level == "sequence" else lr)
    weight = ratio.clamp(max=options.cap)
    metrics = _figures("tis", weight, torch.ones_like(mask, dtype=torch.bool), mask)
    truncated = (ratio > options.cap)
    metrics["tis/truncated_fraction"] = float(truncated.to(torch.float64).mean()) if options.level == "sequence" else (
        float((truncated & mask.bool()).sum()) / max(int(mask.sum()), 1))
    return Corrected(proximal_logp, weight, mask, metrics)


@corrections.register("mis", options=MISOptions, rows=True)
def masked_is(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: MISOptions) -> Corrected:
    lr = log_ratio(behaviour_logp, proximal_logp, mask)
    ratio = torch.exp(lr.sum(-1) if options.level == "sequence" else lr)
    inside = (ratio >= options.low) & (ratio <= options.high)
    kept = inside if options.level == "token" else inside[:, None].expand_as(mask)
    kept = kept & mask.bool()
    return Corrected(proximal_logp, ratio * inside, mask * kept.to(mask.dtype), _figures("mis", ratio, kept, mask))


@corrections.register("decoupled", options=DecoupledOptions)
def decoupled_ppo(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: DecoupledOptions) -> Corrected:
    weight = torch.exp(log_ratio(behaviour_logp, proximal_logp, mask))
    kept = mask.bool() if options.cap == 0 else mask.bool() & (weight <= options.cap)
    return Corrected(proximal_logp, weight * kept, mask * kept.to(mask.dtype), _figures("decoupled", weight, kept, mask))


def mismatch_figures(behaviour_logp: Tensor, trainer_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the log-probs recorded at sampling are from the trainer's recomputed ones, over the policy's tokens:
    the k3 estimate of KL(mu || pi_trainer) (Schulman 2020: with r = pi / mu, k3 = r - 1 - log r, unbiased under mu's
    samples), and the largest and smallest ratio pi / mu. A synchronous run should give ~0, 1 and 1."""
    m = mask.bool()
    if not bool(m.any()):
        return {"mismatch/k3": 0.0, "mismatch/max_ratio": 1.0, "mismatch/min_ratio": 1.0}
    lr = (trainer_logp.detach() - behaviour_logp).to(torch.float64)[m]
    ratio = lr.exp()
    return {"mismatch/k3": float((ratio - 1 - lr).mean()), "mismatch/max_ratio": float(ratio.max()), "mismatch/min_ratio": float(ratio.min())}


def dropped_share(fixed: Corrected, mask: Tensor) -> float:
    """`mismatch/masked_share`: the share of the policy's tokens a correction took out of the loss, by the mask or by
    a zero weight (0 for `none`)."""
    valid = mask.bool()
    out = valid & (fixed.mask == 0)
    if fixed.weight is not None:
        w = fixed.weight if fixed.weight.dim() == 2 else fixed.weight[:, None]
        out = out | (valid & (w.expand_as(mask) == 0))
    return float(out.sum()) / max(int(valid.sum()), 1)


from posttrain.objectives import icepop, m2po, opsm, rejection, sampler_is  # noqa: E402,F401  (register more corrections)
