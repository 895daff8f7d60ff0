"""Process-level helpers every layer may use: seeding the global RNGs, a progress bar on stderr, strict JSON."""

from __future__ import annotations

import json
import math
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


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def strict_json(payload, **kwargs) -> str:
    """`json.dumps` that strict parsers accept: a NaN or infinite float (a diverged loss, an undefined metric) is
    written as null instead of the bare `NaN` / `Infinity` Python would emit."""
    return json.dumps(_finite_or_none(payload), allow_nan=False, **kwargs)
