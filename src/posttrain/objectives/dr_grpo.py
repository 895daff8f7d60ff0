"""Dr. GRPO's unbiased advantage (Liu et al. 2025, "Understanding R1-Zero-like Training: A Critical
Perspective", arXiv 2503.20783, eq. 3 / Fig. 1):

    A_i = r_i - mean_group(r)          (no division by the group std: that term biases towards easy/hard prompts)

The paper's other fix, normalising the loss by a constant (G * L_max) instead of each response's length,
is the `token_sum_norm` aggregation; the `dr_grpo` preset selects both. NaN handling as in `grpo`.
"""

from __future__ import annotations

from torch import Tensor

from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_normalize, weighted_reward
from posttrain.rollout import RolloutBatch


@advantages.register("dr_grpo", needs=())
def dr_grpo(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    return group_normalize(reward, batch.group, "none", valid=scored)
