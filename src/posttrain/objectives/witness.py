"""Witness advantage: the MMD witness in closed form from the group's outcome counts (2026, for
distribution matching; derived from its abstract).

To teach a policy to *sample* from a target q over a finite outcome set, each rollout i with outcome k_i
gets the negative leave-one-out witness of MMD^2(p, q) at its outcome:

    Kmat[k, j] = 1[k == j]  (delta; MMD^2 = ||p - q||^2)   or   exp(-(k - j)^2 / (2 h^2))  (rbf, ordinal)
    p_hat^{(-i)}_j = (n_j - 1[j == k_i]) / (G - 1)          group counts n_j, leave-one-out
    a_i = -f^{(-i)}(k_i) = -sum_j Kmat[k_i, j] (p_hat^{(-i)}_j - q_j)
        (delta: a_i = q_{k_i} - (n_{k_i} - 1) / (G - 1))

since grad MMD^2 = 2 E_{y~p}[f(y) grad log p(y)]. An unparseable rollout has the extra outcome "invalid"
(q = 0, a kernel row of its own). With `as_reward`, a_i is the GRPO reward and is group-normalised
(rl.std_scaling, rl.std_eps, as `grpo`); otherwise `scale * a_i` is the advantage. Without leave-one-out
the plug-in p_hat = n / G is used; a singleton group has no leave-one-out estimate and gets 0.

Needs `outcomes` [B] (0-based index, -1 unparseable) and `target_probs` [B, K] (q of each row's prompt),
which the trainer takes from a distribution-matching task. Settings: rl.options.witness (params.yaml).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_normalize
from posttrain.rollout import RolloutBatch


class WitnessOptions(Section):
    kernel: Literal["delta", "rbf"] = "delta"  # rbf treats outcomes 1..K as ordinal
    bandwidth: float = Field(1.0, gt=0)  # rbf h, in outcome-index units (unused by delta)
    leave_one_out: bool = True  # the unbiased estimate; false uses the plug-in p_hat = n / G
    as_reward: bool = False  # true: GRPO reward (group-normalised); false: the advantage itself, times `scale`
    scale: float = Field(1.0, gt=0)


def kernel_matrix(n_outcomes: int, opts: WitnessOptions, dtype=torch.float32, device=None) -> Tensor:
    """[K+1, K+1] Kmat over the K outcomes plus "invalid" (last), which is similar only to itself."""
    k = torch.arange(n_outcomes + 1, dtype=dtype, device=device)
    if opts.kernel == "rbf":
        gram = torch.exp(-((k[:, None] - k[None, :]) ** 2) / (2 * opts.bandwidth**2))
        gram[-1, :], gram[:, -1] = 0.0, 0.0
        gram[-1, -1] = 1.0
        return gram
    return torch.eye(n_outcomes + 1, dtype=dtype, device=device)


def witness_advantage(outcomes: Tensor, target: Tensor, group: Tensor, opts: WitnessOptions) -> Tensor:
    """a_i = -f^{(-i)}(k_i) [B] from outcome indices [B] (-1: invalid), q [B, K] and group ids [B]."""
    n_outcomes = target.shape[1]
    index = torch.where(outcomes < 0, torch.full_like(outcomes, n_outcomes), outcomes).long()
    onehot = torch.nn.functional.one_hot(index, n_outcomes + 1).to(target.dtype)
    q = torch.cat([target, target.new_zeros(target.shape[0], 1)], dim=1)  # q_invalid = 0
    _, gid = torch.unique(group, return_inverse=True)
    counts = torch.zeros(int(gid.max()) + 1, n_outcomes + 1, dtype=q.dtype, device=q.device).index_add_(0, gid, onehot)[gid]
    size = counts.sum(dim=1)
    if opts.leave_one_out:
        p_hat = (counts - onehot) / (size - 1).clamp(min=1.0)[:, None]
    else:
        p_hat = counts / size[:, None]
    gram = kernel_matrix(n_outcomes, opts, q.dtype, q.device)
    witness = ((onehot @ gram) * (p_hat - q)).sum(dim=1)  # f(k_i) = sum_j Kmat[k_i, j] (p_hat_j - q_j)
    adv = -witness
    return torch.where(size > 1, adv, torch.zeros_like(adv)) if opts.leave_one_out else adv


@advantages.register("witness", needs=("outcomes", "target_probs"), options=WitnessOptions, tasks=("distribution",))
def witness(batch: RolloutBatch, cfg) -> Tensor:
    opts: WitnessOptions = cfg.options_for("witness")
    if "outcomes" not in batch.extras or "target_probs" not in batch.extras:
        raise UserError("witness needs a distribution-matching task (task.name: distribution): no outcomes or target distribution")
    adv = witness_advantage(batch.extras["outcomes"], batch.extras["target_probs"], batch.group, opts)
    if opts.as_reward:
        return group_normalize(adv, batch.group, cfg.std_scaling, cfg.std_eps)
    return opts.scale * adv
