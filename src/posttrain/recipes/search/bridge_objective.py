"""BRIDGE: the retriever as the upper level, the policy's GRPO objective as the lower level, solved with a
first-order penalty (value-function) reformulation (BRIDGE, "retrieval-augmented agentic RL as bilevel
optimization", 2026, abstract; the penalty method is the fully first-order value-function approach of Kwon et al.,
ICML 2023, "A Fully First-Order Method for Stochastic Bilevel Optimization", Eq. 3, and Liu et al., NeurIPS 2022,
BOME).

    phi: retriever, theta: policy
    lower  G(theta, phi) = -J_RL(theta; phi) + beta KL(pi_theta || pi_ref)
    upper  F(phi, theta) = -J_RL(theta; phi) + mu L_ret(phi)
    penalised:  min F(phi, theta) + gamma_k [ G(theta, phi) - G(theta_hat, phi) ],  theta_hat ~ K lower steps from theta
    retriever (leader) step first:  phi <- phi - eta_phi ( grad_phi F + gamma_k (grad_phi G(theta, phi) - grad_phi G(theta_hat, phi)) )
    then the policy step:           theta <- theta - eta_theta (grad_theta F + gamma_k grad_theta G) / (1 + gamma_k)
    gamma_k = gamma_0 (1 + k)^p  (increasing)

grad_phi J_RL is REINFORCE through retrieval, E[A * sum_calls log P_phi(d | q)] (envs/retrievers.py). On shared
rollouts y_i ~ (pi_theta, P_phi), the theta_hat expectation is the self-normalised importance weight
w_i = pi_theta_hat(y_i) / pi_theta(y_i), so the retriever's surrogate coefficient per rollout is

    c_i = A_i (1 + gamma_k (1 - w_i))       loss_phi = -mean_i c_i * sum_{calls of i} log P_phi(chosen | q)  (+ mu L_ret)

With beta = 0 (the default) grad_theta F = grad_theta G, so the normalised policy step is GRPO's. The functions here
are tensors in, tensors out; the loop (recipes/search/bridge_trainer.py) owns the optimisers and the order of the steps.
"""

from __future__ import annotations

import torch
from torch import Tensor


def penalty_weight(gamma0: float, k: int, power: float) -> float:
    """gamma_k = gamma_0 (1 + k)^power, k the 0-based iteration: non-decreasing for power >= 0."""
    return gamma0 * (1 + k) ** power


def leader_direction(grad_f_phi: Tensor, grad_g_phi: Tensor, grad_g_phi_hat: Tensor, gamma: float) -> Tensor:
    """grad_phi F + gamma (grad_phi G(theta, phi) - grad_phi G(theta_hat, phi)): the retriever's step direction."""
    return grad_f_phi + gamma * (grad_g_phi - grad_g_phi_hat)


def follower_direction(grad_f_theta: Tensor, grad_g_theta: Tensor, gamma: float) -> Tensor:
    """(grad_theta F + gamma grad_theta G) / (1 + gamma): the policy's step direction, normalised so that its scale
    does not grow with gamma (it tends to the lower level's gradient as gamma grows)."""
    return (grad_f_theta + gamma * grad_g_theta) / (1.0 + gamma)


def importance_weights(logp_new: Tensor, logp_old: Tensor, clip: float) -> Tensor:
    """Self-normalised exp(logp_new - logp_old) [B], each ratio clipped to [1/clip, clip] first: mean 1."""
    ratio = torch.exp((logp_new - logp_old).clamp(-torch.log(torch.tensor(clip)), torch.log(torch.tensor(clip))))
    return ratio / ratio.mean()


def bridge_coefficients(adv: Tensor, w_hat: Tensor, gamma: float) -> Tensor:
    """c_i = A_i (1 + gamma (1 - w_i)): grad_phi F + gamma (grad_phi G(theta) - grad_phi G(theta_hat)) per rollout."""
    return adv * (1.0 + gamma * (1.0 - w_hat))


def retriever_pg_loss(event_logp: Tensor, event_rollout: Tensor, coeff: Tensor) -> Tensor:
    """-mean_i coeff_i * sum_{events e of rollout i} log P_phi(e): REINFORCE through retrieval. `event_logp` [E]
    (with gradient), `event_rollout` [E] the rollout index of each event, `coeff` [B] (no gradient)."""
    assert not coeff.requires_grad, "the retriever's coefficients are constants of the surrogate"
    if event_logp.numel() == 0:
        return coeff.new_zeros(())
    per_rollout = torch.zeros(coeff.shape[0], dtype=event_logp.dtype).index_add(0, event_rollout, event_logp)
    return -(coeff * per_rollout).mean()


def retrieval_contrastive_loss(candidate_logits: list[Tensor], positives: list[Tensor]) -> Tensor:
    """L_ret: -log sum_{d in positives} softmax(candidate logits)_d per call, averaged; positives are the passages of
    successful episodes (BRIDGE's optional retrieval loss)."""
    if not candidate_logits:
        return torch.zeros(())
    terms = [-(torch.logsumexp(l[p], 0) - torch.logsumexp(l, 0)) for l, p in zip(candidate_logits, positives)]
    return torch.stack(terms).mean()
