"""Small pieces the training loops share: the LR schedule and the optimiser step (seeding and progress bars are
in posttrain.runtime)."""

from __future__ import annotations

import torch
from transformers import get_cosine_schedule_with_warmup


def optimizer_and_schedule(params, lr: float, weight_decay: float, warmup: int, total: int):
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, warmup, total)


def optimizer_step(params, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
    """Clip the gradients of `params` to a total norm of `max_grad_norm`, step `optimizer` and free the gradients
    (`zero_grad(set_to_none=True)`); returns the total norm before clipping."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)
