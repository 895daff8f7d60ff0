"""Small shared helpers for the per-token statistics the policy losses and corrections log (no gradient)."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def masked_share(flag: Tensor, mask: Tensor) -> float:
    """The share of the mask's tokens where `flag` holds ([B, T] or broadcastable to it); 0 for an empty mask."""
    m = mask.to(torch.float64)
    f = flag.to(torch.float64).expand_as(m)
    return float((f * m).sum() / m.sum().clamp(min=1.0))


@torch.no_grad()
def masked_mean(values: Tensor, mask: Tensor) -> float:
    """The mean of `values` over the mask's tokens ([B, T] or broadcastable to it); 0 for an empty mask."""
    m = mask.to(torch.float64)
    v = values.detach().to(torch.float64).expand_as(m)
    return float((v * m).sum() / m.sum().clamp(min=1.0))
