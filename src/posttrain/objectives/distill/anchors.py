"""Anchor states of multi-turn rollouts (GiGPO, Feng et al. 2025, arXiv 2505.10978, Eqs. 5-6; verl-agent
`gigpo/core_gigpo.py` build_step_group / compute_step_discounted_returns; restated, no code copied).

A rollout's environment steps are the runs of tokens the policy produced between two observations
(`completion_mask`). Steps of one rollout group whose states coincide share an anchor: the same last
observation the policy read (`observation`, GiGPO's anchor_obs; the prompt at the first step) or the same
whole history before the step (`history`). Each step's return is the outcome discounted from the last step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.rollout import RolloutBatch


@dataclass(frozen=True)
class StepRows:
    """One row per environment step of every rollout: the rollout it belongs to, its anchor group id, its
    discounted return and its tokens (a [N, T] mask over the rollout's completion)."""

    row: Tensor  # [N] index of the rollout
    anchor: Tensor  # [N] anchor group id (distinct across rollout groups)
    step_return: Tensor  # [N] G_k
    mask: Tensor  # [N, T]


def step_spans(completion_mask: Tensor) -> list[list[tuple[int, int]]]:
    """Per rollout, the (start, end) of each run of produced tokens: its environment steps in order."""
    out = []
    for m in completion_mask.bool().tolist():
        spans, start = [], None
        for t, produced in enumerate(m + [False]):
            if produced and start is None:
                start = t
            elif not produced and start is not None:
                spans.append((start, t))
                start = None
        out.append(spans)
    return out


def anchor_key(batch: RolloutBatch, i: int, start: int, how: str) -> tuple:
    """What makes two steps the same state: the observation history before `start`, or the last observation."""
    prompt = tuple(batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist())
    seen = batch.attention_mask[i, :start].bool()
    if how == "history":
        return prompt, tuple(batch.completion_ids[i, :start][seen].tolist())
    observed = (seen & ~batch.completion_mask[i, :start].bool()).tolist()
    end = start
    while end > 0 and not observed[end - 1]:  # skip back over produced tokens to the last observation
        end -= 1
    begin = end
    while begin > 0 and observed[begin - 1]:
        begin -= 1
    return ("start", prompt) if begin == end else ("seen", tuple(batch.completion_ids[i, begin:end].tolist()))


def step_rows(batch: RolloutBatch, returns: Tensor, gamma: float, how: str) -> StepRows:
    """Split every rollout into its steps and group coinciding states into anchors (GiGPO Eqs. 5-6)."""
    _, group = torch.unique(batch.group, return_inverse=True)
    rows, anchors, step_returns, spans_of, ids = [], [], [], [], {}
    for i, spans in enumerate(step_spans(batch.completion_mask)):
        for k, (start, end) in enumerate(spans):
            key = (int(group[i]), anchor_key(batch, i, start, how))
            anchors.append(ids.setdefault(key, len(ids)))
            rows.append(i)
            step_returns.append(float(returns[i]) * gamma ** (len(spans) - 1 - k))
            spans_of.append((start, end))
    T = batch.completion_mask.shape[1]
    mask = torch.zeros(len(rows), T, dtype=batch.completion_mask.dtype, device=batch.completion_mask.device)
    for n, (start, end) in enumerate(spans_of):
        mask[n, start:end] = batch.completion_mask[rows[n], start:end]
    device = returns.device
    return StepRows(torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(anchors, dtype=torch.long, device=device),
                    torch.tensor(step_returns, dtype=returns.dtype, device=device), mask)
