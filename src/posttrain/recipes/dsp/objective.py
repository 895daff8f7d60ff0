"""DSP, Diffusion Subgoal Planning (specs §20, derived from the 2026 abstract): a flow model proposes subgoals, the
high level needs no value function. Pure tensor functions; the loop is recipes/dsp/trainer.py.

Rectified-flow convention (Liu et al. 2023, "Flow Straight and Fast", eq. 1; Lipman et al. 2023, flow matching):
noise at tau = 0, data at tau = 1,

    z_tau = (1 - tau) z0 + tau w,   target velocity  dz/dtau = w - z0,   L_flow = || v(z_tau, tau | s, g~) - (w - z0) ||^2

where w = s_{t+k} is the subgoal k steps ahead and g~ is the goal, replaced by the null goal with probability p_uncond
(goal dropout: one network learns the conditional and the unconditional field jointly; Ho & Salimans 2022,
"Classifier-Free Diffusion Guidance", Alg. 1). At inference the guided field is their eq. 6 in velocity form,

    v = v(z, tau | s, ∅) + omega (v(z, tau | s, g) - v(z, tau | s, ∅))

(omega = 0: unconditional; 1: conditional; > 1: extrapolated towards the goal), Euler-integrated from z0 ~ N(0, I)
at tau = 0 to the subgoal z_1 in `steps` steps.

The HIQL-style baseline's value (Park et al. 2023, "HIQL", eq. 3, from IQL, Kostrikov et al. 2022, eq. 5) is learnt
by expectile regression: L = |expectile - 1(u < 0)| u^2 with u = r + gamma (1 - done) V_target(s', g) - V(s, g).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def guided_velocity(v_uncond: Tensor, v_cond: Tensor, omega: float) -> Tensor:
    """Classifier-free guidance: v_uncond + omega (v_cond - v_uncond), computed as (1 - omega) v_uncond + omega v_cond so
    that omega = 1 and omega = 0 return either branch exactly."""
    return (1.0 - omega) * v_uncond + omega * v_cond


def interpolate(z0: Tensor, w: Tensor, tau: Tensor) -> Tensor:
    """z_tau = (1 - tau) z0 + tau w; tau [B] broadcast over the state dimensions."""
    tau = tau.reshape(-1, *([1] * (w.dim() - 1)))
    return (1.0 - tau) * z0 + tau * w


def target_velocity(z0: Tensor, w: Tensor) -> Tensor:
    """The rectified-flow velocity along the straight path: w - z0."""
    return w - z0


def goal_dropout(batch: int, p_uncond: float, generator: torch.Generator | None = None) -> Tensor:
    """[B] bool, True where the goal is replaced by the null goal (each with probability p_uncond)."""
    return torch.rand(batch, generator=generator) < p_uncond


def flow_matching_loss(v_pred: Tensor, z0: Tensor, w: Tensor) -> Tensor:
    """Mean over the batch of || v_pred - (w - z0) ||^2 (summed over state dimensions)."""
    return (v_pred - target_velocity(z0, w)).pow(2).flatten(1).sum(1).mean()


def euler_sample(velocity: Callable[[Tensor, Tensor], Tensor], z0: Tensor, steps: int) -> Tensor:
    """Integrate dz/dtau = velocity(z, tau) from tau = 0 (z0) to tau = 1 with `steps` Euler steps; returns z_1."""
    z, dt = z0, 1.0 / steps
    for i in range(steps):
        tau = torch.full((z.shape[0],), i * dt, dtype=z.dtype)
        z = z + dt * velocity(z, tau)
    return z


def guided_sampler(field: Callable[[Tensor, Tensor, Tensor], Tensor], z0: Tensor, steps: int, omega: float) -> Tensor:
    """The CFG subgoal: `field(z, tau, null)` is the model's velocity with the goal (null False) or the null goal
    (null True); omega = 1 needs only the conditional branch, omega = 0 only the unconditional one."""
    n = z0.shape[0]
    cond, uncond = torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)

    def velocity(z: Tensor, tau: Tensor) -> Tensor:
        if omega == 1.0:
            return field(z, tau, cond)
        if omega == 0.0:
            return field(z, tau, uncond)
        return guided_velocity(field(z, tau, uncond), field(z, tau, cond), omega)

    return euler_sample(velocity, z0, steps)


def expectile_loss(value: Tensor, target: Tensor, expectile: float) -> Tensor:
    """IQL's asymmetric squared loss |expectile - 1(u < 0)| u^2, u = target - value; the target carries no gradient."""
    assert not target.requires_grad, "the TD target must be detached"
    u = target - value
    weight = torch.where(u < 0, 1.0 - expectile, expectile)
    return (weight * u.pow(2)).mean()
