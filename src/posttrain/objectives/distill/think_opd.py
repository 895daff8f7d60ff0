"""ThinkOPD, trace-response divergence routing (2026; derived from its abstract): a teacher with a
think trace z in context distils every sibling response, weighted by how compatible z is with each route.

    D_{i,t} = KL(pi_S(. | x, y_i,<t) || sg pi_T(. | x, z, y_i,<t))       (full vocabulary)
    TRD_i   = mask-mean_t D_{i,t}
    g_i     = (r_i - mean_j r_j) / (std_j r_j + eps)        c_i = -(TRD_i - mean_j TRD_j) / (std_j TRD_j + eps)
    w_i     = G softmax_j((a g_j + b c_j) / T)_i          (within the group: sum_i w_i = G; detached)
    L       = (1/G) sum_i w_i mask-mean_t D_{i,t}          (`uniform`: w_i = 1, "Uniform ThinkOPD")

z is the reasoning part (`Task.think_trace`: the worked steps before the answer, on arithmetic with
task.options.arithmetic.worked_steps) of the teacher's greedy response to the prompt, shared by the group (the
`trace_logprobs` provider, trainers/extras.py); TRD is measured over the student's response tokens.
Settings: rl.options.think_opd.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives import auxiliaries
from posttrain.objectives.distill.divergence import reverse_kl
from posttrain.objectives.grpo import group_normalize, weighted_reward


class ThinkOPDOptions(Section):
    weight: float = Field(1.0, ge=0)
    a: float = 1.0  # weight of the reward gain
    b: float = 1.0  # weight of the trace compatibility
    temperature: float = Field(1.0, gt=0)
    eps: float = Field(1e-06, gt=0)
    uniform: bool = False  # true: every response weighted 1 (the Uniform ThinkOPD baseline)


def route_weights(reward: Tensor, trd: Tensor, group: Tensor, a: float, b: float, temperature: float, eps: float) -> Tensor:
    """w [B], G softmax within each group of (a gain + b compatibility) / T; no gradient."""
    reward, trd = reward.detach(), trd.detach()
    gain = group_normalize(reward, group, "group", eps)
    compatibility = -group_normalize(trd, group, "group", eps)
    score = (a * gain + b * compatibility) / temperature
    _, index = torch.unique(group, return_inverse=True)
    n = int(index.max()) + 1
    top = torch.full((n,), -torch.inf, dtype=score.dtype, device=score.device).scatter_reduce(0, index, score, "amax")
    expo = torch.exp(score - top[index])
    total = torch.zeros(n, dtype=score.dtype, device=score.device).index_add_(0, index, expo)
    size = torch.zeros(n, dtype=score.dtype, device=score.device).index_add_(0, index, torch.ones_like(score))
    return (size[index] * expo / total[index]).detach()


def routed_loss(per_token: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """(1/B) sum_i w_i mask-mean_t D_{i,t} (for one group, B = G)."""
    m = mask.to(per_token.dtype)
    per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return (weights * per_seq).mean()


@auxiliaries.register("think_opd", needs=("trace_logprobs",), policy=("logprobs",), options=ThinkOPDOptions)
def think_opd(batch, policy, cfg, module=None):
    opts: ThinkOPDOptions = cfg.options_for("think_opd")
    per_token = reverse_kl(policy.logprobs, batch.extras["trace_logprobs"])
    m = batch.completion_mask.to(per_token.dtype)
    trd = (per_token.detach() * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    if opts.uniform:
        weights = torch.ones_like(trd)
    else:
        weights = route_weights(weighted_reward(batch)[0], trd, batch.group, opts.a, opts.b, opts.temperature, opts.eps)
    loss = routed_loss(per_token, batch.completion_mask, weights)
    return opts.weight * loss, {"think_opd/trd_mean": float(trd.mean()), "think_opd/weight_max": float(weights.max())}
