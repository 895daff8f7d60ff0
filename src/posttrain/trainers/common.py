"""Small pieces the training loops share: seeding, progress, the LR schedule, the optimiser step."""

from __future__ import annotations

import random
import sys

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase, get_cosine_schedule_with_warmup


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def progress(total: int, desc: str, initial: int = 0) -> tqdm:
    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, mininterval=1.0, dynamic_ncols=True, leave=False, disable=None)


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
