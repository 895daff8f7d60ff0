"""Process-level helpers every layer may use: seeding the global RNGs, a progress bar on stderr, strict JSON, and the
fault-injection points of the crash tests."""

from __future__ import annotations

import json
import math
import os
import random
import sys

import numpy as np
import torch
from tqdm.auto import tqdm


_FAULT_HITS: dict[str, int] = {}


def fault_point(name: str) -> None:
    """A crash-test hook at a point of a durable write: with `POSTTRAIN_FAULT=<name>` (or `<name>@<n>`: the n-th time
    this point is reached) the process ends here at once, as `kill -9` would end it (`os._exit(137)`: no cleanup, no
    flush). Without the variable it costs one dict lookup."""
    wanted = os.environ.get("POSTTRAIN_FAULT")
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _FAULT_HITS[name] = _FAULT_HITS.get(name, 0) + 1
    if _FAULT_HITS[name] == int(nth or 1):
        os._exit(137)


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
