"""ASCT's auxiliary tree (specs/seed_methods.md §24): at one recoverable state, spend a budget of N simulations on
its legal actions and return the action-value table Q_hat (the mean utility of the simulations that began with each
action), the visit counts and the auxiliary tokens spent.

A simulation takes a first action chosen by the tree policy, then continues with a default policy (ASCT: the frozen
actor) to termination; the caller's `simulate(action_index)` does that and returns the utility, the tokens it wrote
and its tool calls. The tree is one level deep (a bandit over the root's actions, each arm's payoff one rollout):
the root's table is all the credit reads. Actions are first tried in a visit order: the actor's own action, then
the rest shuffled (`visit_order`). Tree policies (registry `tree_policies`, chosen by `asct.tree_policy`):

    uniform     simulation k tries the (k mod |A|)-th action of the visit order: floor(N/|A|) each, or one more
    uct         every action once (in the visit order), then argmax_a Q_hat(a) + c sqrt(ln N(s) / (N(s,a) + 1))
                (Kocsis & Szepesvari 2006, UCB1 applied to trees)
    agent_uct   the UCT score minus kappa cost_hat(a), cost_hat the mean tool calls of a's simulations (cost-aware;
                kappa = the utility's cost per call); kappa = 0 is UCT
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.registry import Registry

tree_policies: Registry = Registry("tree policy")
TreePolicy = Callable[[Tensor, Tensor, Tensor, Tensor, int, float, float], int]  # (q, visits, cost, order, k, c, kappa) -> action


@dataclass(frozen=True)
class Simulation:
    utility: float  # terminal utility of the simulated episode (F1 minus cost)
    tokens: int  # auxiliary tokens it wrote (actions and observations)
    calls: int  # tool calls in it


@dataclass(frozen=True)
class TreeResult:
    q: Tensor  # [A] mean utility per first action (0 where not visited)
    visits: Tensor  # [A] simulations per first action
    cost: Tensor  # [A] mean tool calls per first action
    tokens: int  # auxiliary tokens of all simulations

    @property
    def evaluated(self) -> Tensor:
        return self.visits > 0


def uct_scores(q: Tensor, visits: Tensor, cost: Tensor, c: float, kappa: float) -> Tensor:
    """Q_hat(a) + c sqrt(ln N(s) / (N(s,a) + 1)) - kappa cost_hat(a), N(s) the simulations so far."""
    total = float(visits.sum())
    return q + c * torch.sqrt(math.log(max(total, 1.0)) / (visits.to(q.dtype) + 1.0)) - kappa * cost


def _ucb(q: Tensor, visits: Tensor, cost: Tensor, order: Tensor, c: float, kappa: float) -> int:
    unvisited = order[visits[order] == 0]
    if len(unvisited):
        return int(unvisited[0])
    return int(torch.argmax(uct_scores(q, visits, cost, c, kappa)))


@tree_policies.register("uniform")
def uniform(q: Tensor, visits: Tensor, cost: Tensor, order: Tensor, k: int, c: float, kappa: float) -> int:
    return int(order[k % len(q)])


@tree_policies.register("uct")
def uct(q: Tensor, visits: Tensor, cost: Tensor, order: Tensor, k: int, c: float, kappa: float) -> int:
    return _ucb(q, visits, cost, order, c, 0.0)


@tree_policies.register("agent_uct")
def agent_uct(q: Tensor, visits: Tensor, cost: Tensor, order: Tensor, k: int, c: float, kappa: float) -> int:
    return _ucb(q, visits, cost, order, c, kappa)


def visit_order(n_actions: int, first: int | None, generator: torch.Generator | None) -> Tensor:
    """The order in which a tree tries actions it has not tried: `first` (the actor's own action, so the credit of
    the action taken is always in the table), then the others in a random order (a fixed order would leave the same
    actions unevaluated whenever the budget is below |A|)."""
    rest = torch.randperm(n_actions, generator=generator) if generator is not None else torch.arange(n_actions)
    return rest if first is None else torch.cat([torch.tensor([first]), rest[rest != first]])


def search(n_actions: int, simulate: Callable[[int], Simulation], budget: int, policy: str, c: float, kappa: float,
           first: int | None = None, generator: torch.Generator | None = None) -> TreeResult:
    """Spend `budget` simulations on `n_actions` first actions under tree policy `policy` (see `visit_order`)."""
    choose: TreePolicy = tree_policies.get(policy)
    order = visit_order(n_actions, first, generator)
    value_sum = torch.zeros(n_actions, dtype=torch.float64)
    cost_sum = torch.zeros(n_actions, dtype=torch.float64)
    visits = torch.zeros(n_actions, dtype=torch.long)
    tokens = 0
    for k in range(budget):
        q = torch.where(visits > 0, value_sum / visits.clamp(min=1), torch.zeros_like(value_sum))
        cost = torch.where(visits > 0, cost_sum / visits.clamp(min=1), torch.zeros_like(cost_sum))
        a = choose(q, visits, cost, order, k, c, kappa)
        sim = simulate(a)
        value_sum[a] += sim.utility
        cost_sum[a] += sim.calls
        visits[a] += 1
        tokens += sim.tokens
    n = visits.clamp(min=1)
    return TreeResult(torch.where(visits > 0, value_sum / n, torch.zeros_like(value_sum)), visits,
                      torch.where(visits > 0, cost_sum / n, torch.zeros_like(cost_sum)), tokens)
