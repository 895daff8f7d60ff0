"""AURA's terminal direction-magnitude score (AURA, 2026; spec §12, our formulation derived from its abstract,
whose figures satisfy score = directional accuracy x conditional magnitude agreement: 62.9% x 33.3% = 20.94%).

For a forecast f and the realised return r over the horizon (both in percent):

    dir = 1[sign(f) == sign(r)]                                   (sign(0) = 0: a zero forecast never has a direction)
    mag = 1[bucket(|f|) == bucket(|r|)]                           buckets cut at `magnitude_edges`, default [0,1) [1,3) [3,6) [6,inf)
          or, with magnitude: soft, max(0, 1 - ||f| - |r|| / tau)
    R   = dir * mag   in [0, 1];  0 for an unparseable forecast   (the paper's 100 R; the score is 100 mean R)

    score = mean R,   directional accuracy = mean dir,   conditional magnitude agreement = mean(mag | dir = 1)

so mean R = mean(dir) x mean(mag | dir = 1) exactly (tests/recipes/aura/test_market.py). `aura` is the reward PPO trains on;
`aura_direction` (dir) and `aura_magnitude` (mag where dir = 1, NaN elsewhere: undefined, and every estimator reads
NaN as 0) are listed with weight 0 so the rl stage logs the two factors (`reward/<name>_mean` averages the finite
values: the conditional agreement). The scoring settings are the task's (task.options.market): the reward scores
the `market` task's episodes, whose answer is the realised return. The rule itself (`score_parts`) sits with the
sandbox (market.py), where the task's verifier reads it too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.recipes.aura.market import bucket, direction, magnitude, score, score_parts, sign  # noqa: F401  (the score's rule)
from posttrain.rewards import rewards


def _parts(task, examples, completions) -> list[tuple[float, float]]:
    opts = task.opts
    return [score_parts(task.forecast(c), float(e.answer), opts.magnitude, opts.magnitude_edges, opts.tau) for c, e in zip(completions, examples)]


@rewards.register("aura")
def aura(task, examples, completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """AURA's terminal reward R = dir * mag (module docstring); an episode cut before EOS scores 0."""
    return torch.tensor([(d * m if d else 0.0) if f else 0.0 for (d, m), f in zip(_parts(task, examples, completions), finished)])


@rewards.register("aura_direction")
def aura_direction(task, examples, completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """dir: the forecast's sign is the realised return's (0 unparseable or cut)."""
    return torch.tensor([d if f else 0.0 for (d, _), f in zip(_parts(task, examples, completions), finished)])


@rewards.register("aura_magnitude")
def aura_magnitude(task, examples, completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """mag where dir = 1, NaN elsewhere: its finite mean is the conditional magnitude agreement (log with weight 0)."""
    return torch.tensor([m if d and f else math.nan for (d, m), f in zip(_parts(task, examples, completions), finished)])
