"""Small pieces the training loops share: the optimiser and LR schedule (the guarded optimiser step and checkpoints
are trainers/loop.py; seeding and progress bars are in posttrain.runtime)."""

from __future__ import annotations

import torch
from transformers import get_cosine_schedule_with_warmup


def optimizer_and_schedule(params, lr: float, weight_decay: float, warmup: int, total: int):
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, warmup, total)
