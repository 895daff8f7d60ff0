"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, eq. 11 and Algorithm 1): a group whose
rewards are all equal has zero group-relative advantage and teaches nothing, so drop it and sample more
prompts until the batch holds `prompts_per_step` informative groups (or the extra-rollout bound is hit).

These helpers select and concatenate rollout batches; `online_rl.collect` runs the loop. A rollout's extras are the
prompts' other inputs (a policy's `Prompts.inputs`, e.g. images: one row per sample) and what its sampler recorded
(a flow policy's denoising states), kept with their rows; one padded per rollout is re-padded when batches join.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.objectives.grpo import group_moments, weighted_reward
from posttrain.rollout import RolloutBatch


def informative_groups(batch: RolloutBatch, tol: float = 1e-12) -> Tensor:
    """[n_groups] True for each group (in sorted group-id order) whose weighted rewards are not all equal."""
    reward, scored = weighted_reward(batch)
    _, index = torch.unique(batch.group, return_inverse=True)
    _, _, std = group_moments(reward, batch.group, scored)
    per_group = std.new_zeros(int(index.max()) + 1 if index.numel() else 0).scatter_(0, index, std)
    return per_group**2 > tol


def select_groups(batch: RolloutBatch, keep: Tensor) -> RolloutBatch:
    """The rows of the kept groups (`keep` [n_groups] in sorted group-id order), groups renumbered 0..n-1."""
    _, index = torch.unique(batch.group, return_inverse=True)
    rows = keep[index]
    new_id = torch.cumsum(keep.long(), 0) - 1
    return RolloutBatch(
        prompt_ids=batch.prompt_ids[rows], prompt_mask=batch.prompt_mask[rows],
        completion_ids=batch.completion_ids[rows], completion_mask=batch.completion_mask[rows],
        group=new_id[index][rows], old_logp=batch.old_logp[rows], rewards=batch.rewards[rows],
        reward_names=batch.reward_names, reward_weights=batch.reward_weights, attention_mask=batch.attention_mask[rows],
        extras={name: value[rows] for name, value in batch.extras.items()},
    )


def concat(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch from several: prompts re-left-padded, completions re-right-padded, group ids offset."""
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.completion_ids.shape[1] for b in batches)
    left = lambda x, value: F.pad(x, (P - x.shape[1], 0), value=value)  # noqa: E731
    right = lambda x, value: F.pad(x, (0, T - x.shape[1]), value=value)  # noqa: E731
    offsets, groups = 0, []
    for b in batches:
        groups.append(b.group + offsets)
        offsets += int(b.group.max()) + 1 if b.group.numel() else 0
    return RolloutBatch(
        prompt_ids=torch.cat([left(b.prompt_ids, pad_id) for b in batches]),
        prompt_mask=torch.cat([left(b.prompt_mask, 0) for b in batches]),
        completion_ids=torch.cat([right(b.completion_ids, pad_id) for b in batches]),
        completion_mask=torch.cat([right(b.completion_mask, 0) for b in batches]),
        group=torch.cat(groups), old_logp=torch.cat([right(b.old_logp, 0.0) for b in batches]),
        rewards=torch.cat([b.rewards for b in batches]),
        reward_names=batches[0].reward_names, reward_weights=batches[0].reward_weights,
        attention_mask=torch.cat([right(b.attention_mask, 0) for b in batches]),
        extras={name: _cat_padded([b.extras[name] for b in batches]) for name in batches[0].extras},
    )


def _cat_padded(parts: list[Tensor]) -> Tensor:
    """Rows of several batches' extra: a dimension after the first that differs between them (an input padded per
    batch, e.g. a flow policy's instruction bytes) is right-padded with 0 to the widest."""
    shape = [max(sizes) for sizes in zip(*(p.shape[1:] for p in parts))]
    padded = []
    for part in parts:
        pad = [x for have, want in zip(reversed(part.shape[1:]), reversed(shape)) for x in (0, want - have)]
        padded.append(F.pad(part, pad) if any(pad) else part)
    return torch.cat(padded)
