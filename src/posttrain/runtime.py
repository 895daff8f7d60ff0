"""Process-level helpers every layer may use: seeding the global RNGs, a progress bar on stderr."""

from __future__ import annotations

import random
import sys

import numpy as np
import torch
from tqdm.auto import tqdm


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def progress(total: int, desc: str, initial: int = 0) -> tqdm:
    return tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, mininterval=1.0, dynamic_ncols=True, leave=False, disable=None)
