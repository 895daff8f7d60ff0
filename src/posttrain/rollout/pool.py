"""The trajectory pool of asynchronous RL and its admission policies (registry `pool_policies`).

Rollout workers generate continuously while the trainer updates; every token records the policy version that
produced it (a worker that picks up new weights mid-rollout tags the rest of the rollout with the new version).
Completed groups enter the pool; the trainer draws whole groups (GRPO needs complete groups). Before each draw a
pool policy may reject groups:

none           unfiltered asynchronous RL: the trainer draws the oldest groups, nothing is rejected.
max_staleness  the anchors' hard cap (AReaL `max_head_offpolicyness`, verl `staleness_threshold`, prime-rl
               `max_off_policy_steps`, SkyRL `max_staleness_steps`): a group whose oldest token lags the trainer by
               more than `cap` versions is rejected.
pace           PACE, Pool-Aware Control of Effective Staleness (2026; derived from its abstract). For trajectory j
               with tokens t = 1..L_j generated under versions v_j(t), completed (and pooled) at version v_end_j,
               and trainer version v_now:
                   W_j  = v_now - v_end_j                                      waiting staleness
                   Gn_j = v_end_j - v_j(1)                                     naive generation staleness (span)
                   Gp_j = (1/L_j) sum_t (v_end_j - v_j(t))                     prefix-aware generation staleness
                   E_j  = W_j + beta_g * Gp_j                                  effective staleness
               P = pooled groups before the draw, P* = ceil(kappa * batch groups):
                   R = max(0, floor(rho * (P - P*)))                           rejection budget
               the R groups with the largest mean E are rejected (ties: the older v_end first); an optional hard
               cap rejects first and P counts what it leaves. The trainer then draws FIFO or lowest-E first.

Invariants (tests/unit/test_async_pool.py): P <= P* gives R = 0 and R <= P - P*; the rejected set is the R largest
E; all tokens at v_now gives E = 0; a long trajectory whose tokens came mostly after a refresh has Gp < Gn; E is
monotone increasing in W.

Only the pool logic lives here (pure functions over tensors, plain-Python pool). `rl.pool_policy` selects a policy
(options `rl.options.<name>`); trainers/async_rl.py runs the workers and draws from the pool under it, and
`experiments/async_simulator.py` runs the same logic over simulated time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.registry import Registry

pool_policies: Registry = Registry("pool policy")


# --- staleness of trajectories, over tensors ------------------------------------------------------------------

def waiting_staleness(v_now: int | Tensor, v_end: Tensor) -> Tensor:
    """W = v_now - v_end: versions passed since the trajectory completed and entered the pool. [B]"""
    return (v_now - v_end).to(torch.float64)


def naive_generation_staleness(token_versions: Tensor, mask: Tensor, v_end: Tensor) -> Tensor:
    """Gn = v_end - v(1): versions spanned while generating (first token's version, from the mask). [B]"""
    first = torch.where(mask.bool(), token_versions, torch.iinfo(token_versions.dtype).max).amin(-1)
    return (v_end - first).to(torch.float64)


def prefix_aware_generation_staleness(token_versions: Tensor, mask: Tensor, v_end: Tensor) -> Tensor:
    """Gp = mean over the trajectory's tokens of (v_end - v(t)): tokens generated after a refresh lag little. [B]"""
    m = mask.to(torch.float64)
    lag = (v_end.unsqueeze(-1) - token_versions).to(torch.float64) * m
    return lag.sum(-1) / m.sum(-1).clamp_min(1.0)


def effective_staleness(v_now: int | Tensor, token_versions: Tensor, mask: Tensor, v_end: Tensor, beta_g: float) -> Tensor:
    """E = W + beta_g * Gp (with beta_g = 1: the version lag of an average token behind v_now). [B]"""
    return waiting_staleness(v_now, v_end) + beta_g * prefix_aware_generation_staleness(token_versions, mask, v_end)


def rejection_budget(occupancy: int, target: int, rho: float) -> int:
    """R = max(0, floor(rho * (P - P*))): nothing is rejected unless the pool holds more than its target."""
    return max(0, math.floor(rho * (occupancy - target)))


def largest_staleness(scores: Tensor, v_end: Tensor, budget: int) -> list[int]:
    """Indices of the `budget` items with the largest score; among equal scores the older (smaller) v_end first."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), int(v_end[i]), i))
    return sorted(order[: max(0, min(budget, len(order)))])


# --- the pool ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """The G completed trajectories of one prompt. `token_versions[i][t]`: the policy version that produced token t
    of trajectory i; `v_end[i]`: the trainer version when trajectory i completed; the group is pooled when its last
    trajectory completes (`pooled_at`, a version)."""

    prompt: int
    token_versions: tuple[tuple[int, ...], ...]
    v_end: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.token_versions or len(self.token_versions) != len(self.v_end) or not all(self.token_versions):
            raise ValueError("a group needs one non-empty version list and one v_end per trajectory")
        if any(max(vs) > e for vs, e in zip(self.token_versions, self.v_end)):
            raise ValueError("a token cannot be newer than its trajectory's completion version")

    @property
    def pooled_at(self) -> int:
        return max(self.v_end)

    @cached_property
    def profile(self) -> tuple[float, float, float, int]:
        """What does not change while the group waits: (mean Gp, mean Gn, mean v_end, oldest token version).
        The tensor functions' formulas in plain Python (a pool of thousands of groups is re-scored every draw)."""
        n = len(self.v_end)
        gp = sum(e - sum(vs) / len(vs) for vs, e in zip(self.token_versions, self.v_end)) / n
        gn = sum(e - vs[0] for vs, e in zip(self.token_versions, self.v_end)) / n
        return gp, gn, sum(self.v_end) / n, min(min(vs) for vs in self.token_versions)

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        """(token_versions [G, T] padded, mask [G, T], v_end [G])."""
        length = max(len(vs) for vs in self.token_versions)
        versions = torch.zeros(len(self.v_end), length, dtype=torch.long)
        mask = torch.zeros(len(self.v_end), length, dtype=torch.bool)
        for i, vs in enumerate(self.token_versions):
            versions[i, : len(vs)] = torch.tensor(vs)
            mask[i, : len(vs)] = True
        return versions, mask, torch.tensor(self.v_end)


@dataclass(frozen=True)
class Staleness:
    """Per-group staleness at one trainer version: the means over the group's trajectories, and the oldest token."""

    waiting: float
    generation: float  # prefix-aware Gp
    naive: float  # Gn
    effective: float  # W + beta_g * Gp
    oldest_lag: int  # v_now - the group's oldest token version (what a hard cap reads)


def group_staleness(group: Group, v_now: int, beta_g: float = 1.0) -> Staleness:
    """The group's means of W, Gp, Gn and E (E is linear in W and Gp, so its mean is W's plus beta_g Gp's)."""
    gp, gn, v_end, oldest = group.profile
    w = v_now - v_end
    return Staleness(w, gp, gn, w + beta_g * gp, v_now - oldest)


@dataclass(frozen=True)
class Draw:
    batch: list[Group] | None  # None: fewer than the batch remain after the policy, the trainer waits
    rejected: list[Group]
    figures: dict[str, float]


class TrajectoryPool:
    """Completed groups waiting for the trainer, oldest first."""

    def __init__(self) -> None:
        self.groups: list[Group] = []

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: Group) -> None:
        self.groups.append(group)

    def draw(self, policy: PoolPolicy, v_now: int, batch_groups: int) -> Draw:
        """Apply `policy`'s rejections, then take `batch_groups` groups in its order (or none, if too few remain).
        Figures: occupancy before the draw, rejections, and the drawn batch's staleness (means and histogram of E)."""
        occupancy = len(self.groups)
        staleness = [group_staleness(g, v_now, policy.beta_g) for g in self.groups]
        rejected_idx = set(policy.reject(self.groups, staleness, v_now, batch_groups))
        rejected = [g for i, g in enumerate(self.groups) if i in rejected_idx]
        kept = [(g, s) for i, (g, s) in enumerate(zip(self.groups, staleness)) if i not in rejected_idx]
        figures = {"pool/occupancy": float(occupancy), "pool/rejected_groups": float(len(rejected)),
                   "pool/rejected_trajectories": float(sum(len(g.v_end) for g in rejected))}
        if len(kept) < batch_groups:
            self.groups = [g for g, _ in kept]
            return Draw(None, rejected, figures)
        order = policy.order(kept)
        taken = set(order[:batch_groups])
        batch = [kept[i] for i in sorted(taken)]
        self.groups = [g for i, (g, _) in enumerate(kept) if i not in taken]
        figures.update(staleness_figures([s for _, s in batch]))
        return Draw([g for g, _ in batch], rejected, figures)


def staleness_figures(drawn: Sequence[Staleness]) -> dict[str, float]:
    """Means of W, Gp, Gn, E over the drawn groups, max E, and a histogram of E (`pool/E_hist/<k>`: k <= E < k + 1)."""
    n = max(len(drawn), 1)
    out = {f"pool/{name}_mean": sum(getattr(s, attr) for s in drawn) / n
           for name, attr in (("W", "waiting"), ("Gp", "generation"), ("Gn", "naive"), ("E", "effective"))}
    out["pool/E_max"] = max((s.effective for s in drawn), default=0.0)
    for k, count in sorted(Counter(math.floor(s.effective) for s in drawn).items()):
        out[f"pool/E_hist/{k}"] = float(count)
    return out


# --- policies ---------------------------------------------------------------------------------------------------

class PoolPolicy:
    """Which pooled groups to reject before a draw, and in which order the trainer takes the rest (FIFO here)."""

    beta_g = 1.0  # the weight of Gp in the figures' E

    def reject(self, groups: Sequence[Group], staleness: Sequence[Staleness], v_now: int, batch_groups: int) -> list[int]:
        return []

    def order(self, kept: Sequence[tuple[Group, Staleness]]) -> list[int]:
        return list(range(len(kept)))


class MaxStalenessOptions(Section):
    cap: int = Field(4, ge=0)  # reject a group whose oldest token lags the trainer by more than this many versions


class PACEOptions(Section):
    kappa: float = Field(1.0, ge=1.0)  # target occupancy P* = ceil(kappa * batch groups)
    rho: float = Field(1.0, ge=0.0, le=1.0)  # share of the excess occupancy rejected per draw
    beta_g: float = Field(1.0, ge=0.0)  # weight of the prefix-aware generation staleness in E
    cap: int = Field(0, ge=0)  # optional hard cap applied first, as max_staleness (0: off)
    order: Literal["fifo", "lowest_e"] = "fifo"  # how the trainer draws from what remains


@pool_policies.register("none")
class Unfiltered(PoolPolicy):
    def __init__(self, options: None = None) -> None:
        pass


@pool_policies.register("max_staleness", options=MaxStalenessOptions)
class MaxStaleness(PoolPolicy):
    def __init__(self, options: MaxStalenessOptions) -> None:
        self.cap = options.cap

    def reject(self, groups, staleness, v_now, batch_groups):
        return [i for i, s in enumerate(staleness) if s.oldest_lag > self.cap]


@pool_policies.register("pace", options=PACEOptions)
class PACE(PoolPolicy):
    def __init__(self, options: PACEOptions) -> None:
        self.options = options
        self.beta_g = options.beta_g

    def target(self, batch_groups: int) -> int:
        return math.ceil(self.options.kappa * batch_groups)

    def reject(self, groups, staleness, v_now, batch_groups):
        capped = {i for i, s in enumerate(staleness) if self.options.cap and s.oldest_lag > self.options.cap}
        rest = [i for i in range(len(groups)) if i not in capped]
        budget = rejection_budget(len(rest), self.target(batch_groups), self.options.rho)
        scores = torch.tensor([staleness[i].effective for i in rest], dtype=torch.float64)
        pooled = torch.tensor([groups[i].pooled_at for i in rest], dtype=torch.long)
        return sorted(capped | {rest[k] for k in largest_staleness(scores, pooled, budget)})

    def order(self, kept):
        if self.options.order == "fifo":
            return list(range(len(kept)))
        return sorted(range(len(kept)), key=lambda i: (kept[i][1].effective, i))
