"""The small networks of DSP (specs §20) over 2-D maze states (recipes/dsp/maze.py): the subgoal flow model, the
goal-conditioned policies (low level and flat) and the HIQL-style goal-conditioned value.

Every network reads states through fixed Fourier features [x, sin(2^j pi x), cos(2^j pi x)] (Tancik et al. 2020):
a maze's value and policy change sharply across a wall, which a plain MLP over two coordinates fits poorly.
The flow model's goal input is multiplied by (1 - null) and the null flag is an input too: the null goal is a
learnt token of its own, not a real state at the origin.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def fourier(x: Tensor, bands: int) -> Tensor:
    """[..., D] -> [..., D (1 + 2 bands)]."""
    freqs = (2.0 ** torch.arange(bands, dtype=x.dtype)) * math.pi
    angles = x[..., None] * freqs
    return torch.cat([x, angles.sin().flatten(-2), angles.cos().flatten(-2)], dim=-1)


def mlp(inputs: int, hidden: int, outputs: int, layers: int) -> nn.Sequential:
    dims = [inputs] + [hidden] * layers
    blocks = [m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.SiLU())]
    return nn.Sequential(*blocks, nn.Linear(dims[-1], outputs))


class SubgoalFlow(nn.Module):
    """v(z, tau | s, g~): the velocity of the subgoal flow, with g~ the goal or (null True) the null goal."""

    def __init__(self, state_dim: int, hidden: int, layers: int, bands: int):
        super().__init__()
        self.bands, self.state_dim = bands, state_dim
        feat = state_dim * (1 + 2 * bands)
        self.net = mlp(3 * feat + 1 + 2 * bands + 1, hidden, state_dim, layers)

    def forward(self, z: Tensor, tau: Tensor, state: Tensor, goal: Tensor, null: Tensor) -> Tensor:
        keep = (~null).to(z.dtype)[:, None]
        tau_feat = fourier(tau[:, None], self.bands)
        goal_feat = fourier(goal, self.bands) * keep
        x = torch.cat([fourier(z, self.bands), tau_feat, fourier(state, self.bands), goal_feat, 1.0 - keep], dim=-1)
        return self.net(x)


class GoalPolicy(nn.Module):
    """pi(a | s, target): logits over the maze's moves, for a subgoal (low level) or the final goal (flat BC)."""

    def __init__(self, state_dim: int, actions: int, hidden: int, layers: int, bands: int):
        super().__init__()
        self.bands = bands
        self.net = mlp(2 * state_dim * (1 + 2 * bands), hidden, actions, layers)

    def forward(self, state: Tensor, target: Tensor) -> Tensor:
        return self.net(torch.cat([fourier(state, self.bands), fourier(target, self.bands)], dim=-1))


class GoalValue(nn.Module):
    """V(s, g) (about minus the discounted number of moves from s to g)."""

    def __init__(self, state_dim: int, hidden: int, layers: int, bands: int):
        super().__init__()
        self.bands = bands
        self.net = mlp(2 * state_dim * (1 + 2 * bands), hidden, 1, layers)

    def forward(self, state: Tensor, goal: Tensor) -> Tensor:
        return self.net(torch.cat([fourier(state, self.bands), fourier(goal, self.bands)], dim=-1)).squeeze(-1)
