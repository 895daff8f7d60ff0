"""How per-token loss terms become one scalar (spec §0.1, "AGG variants").

token_mean: sum over all valid tokens / number of valid tokens (DAPO; TRL's default loss_type)
seq_mean:   mean over sequences of each sequence's token mean (the original GRPO / DeepSeekMath form)
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.objectives import aggregations


@aggregations.register("token_mean")
def token_mean(values: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@aggregations.register("seq_mean")
def seq_mean(values: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(values.dtype)
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.mean() if per_seq.numel() else torch.zeros((), dtype=values.dtype)
