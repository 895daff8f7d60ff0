"""ASCT credit (Attentive Search over Counterfactual Trees, 2026; specs/seed_methods.md §24, derived from the abstract).

At an actor-visited state s_t an auxiliary tree (rollout/tree.py) estimates Q_hat(s_t, a) for the legal actions it
evaluated. The table is centred by the FROZEN actor's probabilities pi_0 (the actor as it was when the rollouts were
sampled), restricted to the evaluated actions and renormalised:

    w(a)               = pi_0(a|s_t) 1[a evaluated] / sum_b pi_0(b|s_t) 1[b evaluated]
    V_hat(s_t)         = sum_a w(a) Q_hat(s_t, a)
    A_local(s_t, a)    = Q_hat(s_t, a) - V_hat(s_t)                       (0 on actions the tree did not evaluate)
    credit(s_t, a_t)   = lambda_mix A_local(s_t, a_t) + (1 - lambda_mix) (U - b)    (U the trajectory's utility)

so sum_a w(a) A_local(s_t, a) = 0 at every state, equal Q gives 0 and a single evaluated action gives 0. The credit is
the PPO advantage of the actor's own action a_t (every token of it). Everything here reads stored tensors only: the
live actor's updates cannot move the credit within an update. Settings: the `asct` section of params.yaml.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def centred_advantages(q: Tensor, pi0: Tensor, evaluated: Tensor) -> tuple[Tensor, Tensor]:
    """(A_local [S, A], V_hat [S]) from Q_hat [S, A], frozen probabilities pi_0 [S, A] and the evaluated mask [S, A].
    Rows without an evaluated action get V_hat = 0 and A_local = 0."""
    assert not pi0.requires_grad, "pi_0 is the frozen actor's: it carries no gradient"
    ev = evaluated.to(torch.bool)
    weights = torch.where(ev, pi0, torch.zeros_like(pi0))
    total = weights.sum(-1, keepdim=True)
    weights = torch.where(total > 0, weights / total.clamp(min=torch.finfo(pi0.dtype).tiny), torch.zeros_like(weights))
    q = torch.where(ev, q, torch.zeros_like(q))
    value = (weights * q).sum(-1)
    return torch.where(ev, q - value[:, None], torch.zeros_like(q)), value


@torch.no_grad()
def local_credit(q: Tensor, pi0: Tensor, evaluated: Tensor, taken: Tensor) -> Tensor:
    """[S] A_local(s_t, a_t) of the actor's action `taken` [S] (an index into each row; 0 where the tree did not
    evaluate it)."""
    table, _ = centred_advantages(q, pi0, evaluated)
    return table.gather(1, taken[:, None].long()).squeeze(1)


def mixed_credit(local: Tensor, trajectory: Tensor, lambda_mix: float) -> Tensor:
    """lambda_mix A_local + (1 - lambda_mix) A_traj (spec §24's optional mix; lambda_mix = 1 is pure ASCT)."""
    return lambda_mix * local + (1.0 - lambda_mix) * trajectory
