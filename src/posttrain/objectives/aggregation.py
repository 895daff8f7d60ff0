"""How per-token loss terms become one scalar (the variants of GRPO, DAPO and Dr. GRPO).

token_mean:     sum over all valid tokens / number of valid tokens (DAPO; TRL's loss_type="dapo"/"bnpo")
seq_mean:       mean over sequences of each sequence's token mean (the original GRPO / DeepSeekMath form)
token_sum_norm: sum over all valid tokens / (number of sequences * L_max) (Dr. GRPO, arXiv 2503.20783,
                eq. 3; TRL's loss_type="dr_grpo" divides by batch size * max_completion_length)

    Aggregation(values [B, T], mask [B, T], *, max_len: int | None = None) -> scalar

`max_len` is the completion budget L_max (rl.max_new_tokens); only `token_sum_norm` uses it, and falls
back to the padded width T when it is not given. Each is linear in `values` for a fixed mask (registry meta
`rows=True`): the trainer's row-wise update (trainers/online_rl.py, `update_by_rows`) relies on it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import aggregations


def aggregate(cfg, values: Tensor, mask: Tensor) -> Tensor:
    """Apply the configured aggregation `cfg.loss_agg`, with L_max = cfg.max_new_tokens when it is set (`cfg`: a
    `LossSettings`, or a section with those fields, as the trainer's own terms pass)."""
    return aggregations.get(cfg.loss_agg)(values, mask, max_len=getattr(cfg, "max_new_tokens", None))


@aggregations.register("token_mean", rows=True)
def token_mean(values: Tensor, mask: Tensor, *, max_len: int | None = None) -> Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@aggregations.register("seq_mean", rows=True)
def seq_mean(values: Tensor, mask: Tensor, *, max_len: int | None = None) -> Tensor:
    mask = mask.to(values.dtype)
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.mean() if per_seq.numel() else torch.zeros((), dtype=values.dtype)


@aggregations.register("token_sum_norm", rows=True)
def token_sum_norm(values: Tensor, mask: Tensor, *, max_len: int | None = None) -> Tensor:
    mask = mask.to(values.dtype)
    width = values.shape[-1] if max_len is None else max_len
    return (values * mask).sum() / max(values.shape[0] * width, 1)


@aggregations.register("seq_mean_token_sum", rows=True)
def seq_mean_token_sum(values: Tensor, mask: Tensor, *, max_len: int | None = None) -> Tensor:
    """Mean over sequences of each sequence's token SUM (verl's "seq-mean-token-sum"; TRL's `luspo`): a sequence
    weighs by its length, undoing GSPO's length normalisation (LUSPO, arXiv 2602.05261)."""
    mask = mask.to(values.dtype)
    per_seq = (values * mask).sum(-1)
    return per_seq.mean() if per_seq.numel() else torch.zeros((), dtype=values.dtype)
