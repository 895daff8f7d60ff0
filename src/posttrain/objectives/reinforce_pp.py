"""REINFORCE++ (Hu 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and
Reward Models", arXiv 2501.03262), the "REINFORCE++-baseline" variant for group sampling (§3, eqs. 8-10):

    A'_i = r_i - mean_group(r)                                  group-mean baseline (no group std)
    A_it = (A'_i - mean_batch(A')) / (std_batch(A') + eps)      global batch normalisation (eq. 10)

The batch statistics of eq. 10 are over the batch's advantages, which are per token: `whiten: tokens` (the
default) takes the mean and Bessel std over every response token (each A'_i counted once per token the policy
produced), as verl's `compute_reinforce_plus_plus_baseline_outcome_advantage` does (`masked_whiten` over the
response mask), and returns a [B, T] advantage; `whiten: sequences` counts each response once ([B]). The two
differ when responses differ in length. eps = rl.std_eps. The token-level KL-in-reward of the paper's plain
variant is not part of this estimator (use rl.beta for a KL term). NaN handling as in `grpo`.
Settings: rl.options.reinforce_pp (params.yaml).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives import advantages
from posttrain.objectives.grpo import batch_whiten, group_normalize, weighted_reward
from posttrain.rollout import RolloutBatch


class ReinforcePPOptions(Section):
    whiten: Literal["tokens", "sequences"] = "tokens"  # batch statistics over response tokens (verl) or one per response


def token_whiten(values: Tensor, valid: Tensor, mask: Tensor, eps: float) -> Tensor:
    """[B, T]: (v_i - mean) / (Bessel std + eps) with the mean and std over every response token (mask [B, T]) of
    the `valid` rows, each row's value repeated on its tokens; 0 off the mask and on invalid rows."""
    w = mask.to(values.dtype) * valid.to(values.dtype)[:, None]
    n = w.sum()
    v = torch.where(valid, values, torch.zeros_like(values))[:, None].expand_as(w)
    mean = (w * v).sum() / n.clamp(min=1.0)
    std = ((w * (v - mean) ** 2).sum() / (n - 1).clamp(min=1.0)).sqrt()
    return w * (v - mean) / (std + eps)


@advantages.register("reinforce_pp", needs=(), options=ReinforcePPOptions)
def reinforce_pp(batch: RolloutBatch, cfg) -> Tensor:
    reward, scored = weighted_reward(batch)
    centred = group_normalize(reward, batch.group, "none", valid=scored)
    if cfg.options_for("reinforce_pp").whiten == "tokens":
        return token_whiten(centred, scored, batch.completion_mask, cfg.std_eps)
    return batch_whiten(centred, scored, cfg.std_eps)
