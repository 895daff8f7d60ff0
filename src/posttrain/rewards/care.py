"""CARE's context-adaptive rubric reward (Context-Adaptive Rubric Evolution, 2026; derived from its abstract): a rubric generator writes,
per dialogue turn, weights over three empathy dimensions; a judge scores the reply on each dimension in [0, 1];
the turn reward is the weighted sum, and the generator is rewarded when its rubric ranks the human-preferred
reply higher:

    w = parse(rubric text), clipped >= 0 and renormalised (uniform 1/3 when unparseable or all zero)
    R_t = sum_d w_d s_d  in [0, 1]          q = 1[ R_t(a_w) > R_t(a_l) ]

Invariants: w on the simplex and R_t in [0, 1]; uniform weights reproduce the static-rubric mean; q = 1 exactly
when the rubric ranks the preferred reply higher; a weight-parse failure falls back to uniform.
The rubric generator (trainers/rubric_generator.py, stage `care`) writes the compact form `c=2,a=6,p=2` (weights in
any positive units, renormalised); the long form `cognitive=0.2 affective=0.6 proactive=0.2` parses too. The
`care` reward (`rl.rewards: [{name: care}]`, task `dialogue`) is R_t with w from `rl.options.care.source`:
`generator` (the trained rubric generator, greedy, per context), `uniform` (the static rubric) or `oracle` (the
task's true w*, an upper bound), and s_d from the task's per-dimension judges. The fixed criteria are the
task's judges: the generator adapts the weights, not the criteria.
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor

DIMENSIONS = ("cognitive", "affective", "proactive")
_WEIGHT = re.compile(r"\b(cognitive|affective|proactive|c|a|p)\s*[=:]\s*(-?[0-9]*\.?[0-9]+(?:e-?[0-9]+)?)")
_SHORT = dict(zip("cap", DIMENSIONS))


def parse_rubric(text: str) -> tuple[Tensor, bool]:
    """([3] weights on the simplex, parsed): uniform 1/3 and False when a dimension is missing, a value is not
    finite, or every weight is <= 0; negative weights are clipped to 0 before renormalising."""
    found = {_SHORT.get(name, name): float(value) for name, value in _WEIGHT.findall(text)}
    if set(found) != set(DIMENSIONS) or not all(math.isfinite(v) for v in found.values()):
        return torch.full((3,), 1.0 / 3), False
    weights = torch.tensor([max(found[d], 0.0) for d in DIMENSIONS])
    total = float(weights.sum())
    return (weights / total, True) if total > 0 else (torch.full((3,), 1.0 / 3), False)


def parse_rubric_weights(text: str) -> Tensor:
    """[3] weights (cognitive, affective, proactive) from text like `cognitive=0.5 affective: 0.3 proactive=0.2`."""
    return parse_rubric(text)[0]


def format_rubric(tenths) -> str:
    """The generator's compact rubric text for integer weights (cognitive, affective, proactive)."""
    return ",".join(f"{short}={int(v)}" for short, v in zip("cap", tenths))


def turn_reward(weights: Tensor, scores: Tensor) -> Tensor:
    """R_t = sum_d w_d s_d for scores [..., 3] in [0, 1]."""
    return (weights * scores.clamp(0.0, 1.0)).sum(-1)


def rubric_preference_reward(weights: Tensor, preferred_scores: Tensor, rejected_scores: Tensor) -> Tensor:
    """q = 1 when the rubric's turn reward ranks the human-preferred reply strictly higher, else 0."""
    return (turn_reward(weights, preferred_scores) > turn_reward(weights, rejected_scores)).float()
