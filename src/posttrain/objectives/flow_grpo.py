"""Flow-GRPO's policy: the flow-matching sampler as an SDE with Gaussian steps (Liu et al. 2025, "Flow-GRPO:
Training Flow Matching Models via Online RL", arXiv 2505.05470, eq. 9-12; yifan123/flow_grpo
`sd3_sde_with_logprob.py`).

With sigma in [0, 1] (1 = noise), velocity v, and a step from sigma to sigma_prev (dt = sigma_prev - sigma < 0):

    std_t  = noise_level * sqrt(sigma / (1 - sigma))             (sigma = 1 uses sigma_max < 1 in the denominator)
    mean   = x (1 + std_t^2 / (2 sigma) dt) + v (1 + std_t^2 (1 - sigma) / (2 sigma)) dt
    x_prev = mean + std_t sqrt(-dt) eps,  eps ~ N(0, I)
    logp   = mean over the latent dims of log N(x_prev; mean, (std_t sqrt(-dt))^2)
    KL     = ||mean_theta - mean_ref||^2 / (2 (std_t sqrt(-dt))^2), averaged over dims (closed form, same variance)

The ODE (Euler) step x + v dt is the noise_level -> 0 limit. The recorded steps are the completion tokens of the
core RL step (recipes/image/policy.py's `FlowPolicy`): per step the policy loss is the text pipeline's clipped
surrogate (`losses` registry) on these log-probs, and the KL term this closed form (`FlowPolicy.kl`); advantages come
from any estimator registered with `on_rewards` (GDPO by default), clipped to +-adv_clip_max (rl.adv_clip_max).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SDEStep:
    prev: Tensor  # [B, C, H, W] the sample at sigma_prev
    logp: Tensor  # [B] log-density of `prev` under the step's Gaussian (mean over dims)
    mean: Tensor  # [B, C, H, W]
    scale: Tensor  # [] or [B, 1, 1, 1] the Gaussian's standard deviation std_t sqrt(-dt)


def noise_std(sigma: float, sigma_prev: float, noise_level: float, sigma_max: float) -> float:
    """std_t of the step from sigma to sigma_prev (sigma = 1 uses sigma_max in the denominator)."""
    if not sigma_prev < sigma:
        raise ValueError(f"sigma must decrease: {sigma} -> {sigma_prev}")
    return noise_level * math.sqrt(sigma / (1 - (sigma_max if sigma >= 1 else sigma)))


def step_scale(sigma: float, sigma_prev: float, noise_level: float, sigma_max: float) -> float:
    """The standard deviation std_t sqrt(-dt) of the step's Gaussian (0: an Euler step, no density)."""
    return noise_std(sigma, sigma_prev, noise_level, sigma_max) * math.sqrt(sigma - sigma_prev)


def sde_step(x: Tensor, velocity: Tensor, sigma: float, sigma_prev: float, noise_level: float, sigma_max: float,
             prev: Tensor | None = None, generator: torch.Generator | None = None) -> SDEStep:
    """One Flow-GRPO SDE step. Samples x_prev (given `generator`), or scores a given `prev` (training)."""
    dt = sigma_prev - sigma
    std_t = noise_std(sigma, sigma_prev, noise_level, sigma_max)
    mean = x * (1 + std_t**2 / (2 * sigma) * dt) + velocity * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    scale = std_t * math.sqrt(-dt)
    if prev is None:
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device) if generator is not None else torch.randn_like(x)
        prev = mean + scale * noise
    if scale == 0:  # deterministic limit: no density; logp is 0 by convention
        return SDEStep(prev, torch.zeros(x.shape[0], dtype=x.dtype, device=x.device), mean, torch.tensor(0.0))
    log_density = -((prev.detach() - mean) ** 2) / (2 * scale**2) - math.log(scale) - 0.5 * math.log(2 * math.pi)
    return SDEStep(prev, log_density.mean(dim=tuple(range(1, x.dim()))), mean, torch.tensor(scale))


def gaussian_kl(mean: Tensor, ref_mean: Tensor, scale: Tensor) -> Tensor:
    """[B] closed-form KL between N(mean, s^2) and N(ref_mean, s^2) per dim, averaged over dims."""
    if ref_mean.requires_grad:
        raise ValueError("the reference mean must not carry gradient")
    return ((mean - ref_mean) ** 2).mean(dim=tuple(range(1, mean.dim()))) / (2 * scale**2)
