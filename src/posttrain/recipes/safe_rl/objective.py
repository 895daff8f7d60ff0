"""PPO-Lagrangian with frozen-CLIP reward shaping and an augmented multiplier update: VLM-Safe-RL (specs §16,
derived from the abstract), on PPO-Lagrangian (Ray, Achiam & Amodei 2019, "Benchmarking Safe Exploration in Deep
RL", Safety Gym; the Lagrangian relaxation of the constrained MDP, Altman 1999):

    s_t     = cos(E_img(o_t), E_txt(T_safe)) - cos(E_img(o_t), E_txt(T_danger))   in [-2, 2], frozen encoder
    r'_t    = r_t + alpha_clip * s_t                                                shaped reward
    J_C     = mean_episodes sum_t c_t                      (cost_measure: episodic)
    J_C^prog= mean_episodes sum_t c_t / max(progress, p_min)  (cost_measure: progress)
    A^R', A^C: GAE of r' with the reward critic and of c with the cost critic (objectives/gae.py), each whitened
    actor   = -clipped surrogate with A = (A^R' - lambda A^C) / (1 + lambda)      (PPO eq. 7, objectives/policy_losses.py)
    critics = the clipped value loss of each on its GAE returns                    (objectives/value_loss.py)
    lambda <- max(0, lambda + eta_l [ (J_C - d) + kappa (risk - s_thr) ]),  risk = mean_t (-s_t) over the round

alpha_clip = kappa = 0 is plain PPO-Lagrangian (the score enters nowhere); a fixed lambda = 0 is plain PPO.
Settings: the safe_rl section (params.yaml); the loop: recipes/safe_rl/trainer.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.errors import assert_no_grad
from posttrain.objectives.gae import gae_advantages_returns, masked_whiten
from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives.policy_losses import clipped_surrogate
from posttrain.objectives.value_loss import clipped_value_loss


def safety_score(image_emb: Tensor, safe_emb: Tensor, danger_emb: Tensor) -> Tensor:
    """[...] s = cos(image, safe) - cos(image, danger) of image embeddings [..., D] against two text embeddings [D]."""
    assert_no_grad(image_emb=image_emb, safe_emb=safe_emb, danger_emb=danger_emb)
    image = F.normalize(image_emb, dim=-1)
    return image @ F.normalize(safe_emb, dim=-1) - image @ F.normalize(danger_emb, dim=-1)


def shaped_reward(reward: Tensor, score: Tensor, alpha_clip: float) -> Tensor:
    """r' = r + alpha_clip * s (exactly r when alpha_clip is 0)."""
    return reward + alpha_clip * score if alpha_clip else reward


def episode_cost(costs: Tensor, progress: Tensor, measure: str, p_min: float) -> Tensor:
    """[E] each episode's cost for the multiplier: sum_t c_t (episodic) or sum_t c_t / max(progress, p_min) (progress).
    `costs` [E, T] (0 after an episode's end), `progress` [E] in [0, 1]."""
    total = costs.sum(dim=1)
    return total / progress.clamp(min=p_min) if measure == "progress" else total


def violation(cost: float, limit: float, risk: float, risk_threshold: float, kappa: float) -> float:
    """(J_C - d) + kappa (risk - s_thr): the augmented violation that moves lambda (the plain one when kappa is 0)."""
    return (cost - limit) + (kappa * (risk - risk_threshold) if kappa else 0.0)


@dataclass
class LagrangeMultiplier:
    """lambda >= 0, updated by projected gradient ascent on the violation (checkpointed: state_dict)."""

    value: float
    lr: float

    def update(self, cost: float, limit: float, risk: float = 0.0, risk_threshold: float = 0.0, kappa: float = 0.0) -> float:
        self.value = max(0.0, self.value + self.lr * violation(cost, limit, risk, risk_threshold, kappa))
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


def lagrangian_advantage(adv_reward: Tensor, adv_cost: Tensor, lam: float) -> Tensor:
    """(A^R - lambda A^C) / (1 + lambda): the reward and cost advantages under the multiplier, kept on one scale."""
    return (adv_reward - lam * adv_cost) / (1.0 + lam)


@dataclass(frozen=True)
class Advantages:
    reward: Tensor  # [E, T] whitened GAE advantages of the shaped reward
    cost: Tensor  # [E, T] whitened GAE advantages of the cost
    reward_returns: Tensor  # [E, T] targets of the reward critic
    cost_returns: Tensor  # [E, T] targets of the cost critic


def advantages(rewards: Tensor, costs: Tensor, values_r: Tensor, values_c: Tensor, mask: Tensor, gamma: float, lam: float) -> Advantages:
    """GAE for the shaped reward and for the cost over [E, T] steps (mask: the episode was running), each with its
    critic's rollout-time values; an episode's last step is terminal (the time left is in the state)."""
    adv_r, ret_r = gae_advantages_returns(rewards, values_r, mask, gamma, lam)
    adv_c, ret_c = gae_advantages_returns(costs, values_c, mask, gamma, lam)
    return Advantages(masked_whiten(adv_r, mask), masked_whiten(adv_c, mask), ret_r, ret_c)


def ppo_lagrangian_loss(logp: Tensor, old_logp: Tensor, entropy: Tensor, adv_reward: Tensor, adv_cost: Tensor, lam: float,
                        vpred_r: Tensor, old_r: Tensor, ret_r: Tensor, vpred_c: Tensor, old_c: Tensor, ret_c: Tensor,
                        clip_eps: float, value_clip: float, entropy_coef: float) -> tuple[Tensor, dict[str, float]]:
    """Actor + both critics - entropy bonus over one minibatch of steps (1-D tensors); (loss, figures)."""
    assert_no_grad(old_logp=old_logp, adv_reward=adv_reward, adv_cost=adv_cost, old_r=old_r, ret_r=ret_r, old_c=old_c, ret_c=ret_c)
    settings = LossSettings(clip_eps, clip_eps)  # the ratio clip and the mean over steps
    mask = torch.ones_like(logp)[None]
    adv = lagrangian_advantage(adv_reward, adv_cost, lam)
    actor, figures = clipped_surrogate(logp[None], old_logp[None], adv[None], mask, settings)
    value_r, _ = clipped_value_loss(vpred_r[None], ret_r[None], old_r[None], mask, value_clip, settings)
    value_c, _ = clipped_value_loss(vpred_c[None], ret_c[None], old_c[None], mask, value_clip, settings)
    loss = actor + value_r + value_c - entropy_coef * entropy.mean()
    return loss, {**figures, "actor_loss": float(actor.detach()), "value_loss": float(value_r.detach()),
                  "cost_value_loss": float(value_c.detach()), "entropy": float(entropy.detach().mean())}
