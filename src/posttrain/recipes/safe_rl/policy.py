"""The driving agent of VLM-Safe-RL: a policy, a reward critic and a cost critic, three separate MLPs over the
same input, [the frozen encoder's image embedding, the ego car's state features] (no parameter is shared, so the
cost critic's loss never moves the policy's features)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, outputs))


class DrivingAgent(nn.Module):
    def __init__(self, inputs: int, hidden: int, actions: int):
        super().__init__()
        self.policy, self.reward_critic, self.cost_critic = _mlp(inputs, hidden, actions), _mlp(inputs, hidden, 1), _mlp(inputs, hidden, 1)
        with torch.no_grad():  # a near-uniform first policy (as cleanrl's small last-layer init)
            self.policy[-1].weight.mul_(0.01)
            self.policy[-1].bias.zero_()

    def distribution(self, x: Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.policy(x))

    def values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(V_R(s), V_C(s)), each [N]."""
        return self.reward_critic(x).squeeze(-1), self.cost_critic(x).squeeze(-1)
