"""Pass@k advantage, `grpo_passk` (the best-of-group form verl ships, citing arXiv 2503.19595): the
objective is the group's best reward, so only the best sample of a group gets credit, by its margin over the
runner-up:

    i* = argmax_{i in group} r_i,    A_{i*} = (r_(1) - r_(2)) / (std_group(r) + eps),    A_i = 0 for i != i*

(no division when rl.std_scaling is `none`; std is Bessel's; eps = rl.std_eps). A group with fewer than two scored
samples, or whose best two tie, gives all zeros. = verl's compute_grpo_passk_outcome_advantage (ties broken by
torch.topk, first index). k is the group size (rl.group_size). NaN rows as in `grpo` (left out, advantage 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import weighted_reward
from posttrain.rollout import RolloutBatch


def best_of_group(reward: Tensor, group: Tensor, scored: Tensor, std_scaling: str, eps: float) -> Tensor:
    out = torch.zeros_like(reward)
    for g in torch.unique(group):
        rows = torch.nonzero((group == g) & scored, as_tuple=True)[0]
        if rows.numel() < 2:
            continue
        values = reward[rows]
        top, index = torch.topk(values, 2)
        margin = top[0] - top[1]
        if std_scaling != "none":
            margin = margin / (values.std() + eps)
        out[rows[index[0]]] = margin
    return out


@advantages.register("grpo_passk", needs=())
def grpo_passk(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    return best_of_group(reward, batch.group, scored, cfg.std_scaling, cfg.std_eps)
