"""REINFORCE++ (Hu 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and
Reward Models", arXiv 2501.03262), the "REINFORCE++-baseline" variant for group sampling (§3, eqs. 8-9):

    A'_i = r_i - mean_group(r)                               group-mean baseline (no group std)
    A_i  = (A'_i - mean_batch(A')) / (std_batch(A') + eps)   global batch normalisation

eps = rl.std_eps. The token-level KL-in-reward of the paper's plain variant is not part of this estimator
(use rl.beta for a KL term). NaN handling as in `grpo`.
"""

from __future__ import annotations

from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import batch_whiten, group_normalize, weighted_reward
from posttrain.rollout import RolloutBatch


@advantages.register("reinforce_pp", needs=())
def reinforce_pp(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    centred = group_normalize(reward, batch.group, "none", valid=scored)
    return batch_whiten(centred, scored, cfg.std_eps)
