"""MotionInsight's evaluator output and reward (specs §30, derived from the abstract):

    reward = sum_d [1 - |s_hat_d - s_d| / range] / 3  +  w_c * F1(predicted causes, true causes)  +  w_f * format

The evaluator writes one fixed-format line, scores on the 0-10 rating scale (range 10, stored as tenths of 1):

    consistency 7 continuity 3 plausibility 9 causes teleport frozen
    consistency 10 continuity 10 plausibility 10 causes none

`format` is 1 when the line parses (the three dimensions in order, each an integer 0-10, then `causes` followed by
`none` or distinct known causes); an unparseable line earns 0 on every term, so reward is in [0, 1 + w_c + w_f] and
a perfect prediction earns exactly 1 + w_c + w_f. F1 of two empty cause sets is 1 (a clean video called clean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.rewards import rewards

CAUSES = ("teleport", "deformation", "gravity_violation", "identity_swap", "frozen")  # the failure causes (recipes/motion/videos.py)
DIMENSIONS = ("consistency", "continuity", "plausibility")
SCALE = 10  # the rating scale's top: a score s in [0, 1] is written as round(SCALE * s)
NONE = "none"
WORDS = (*DIMENSIONS, "causes", NONE, *CAUSES, *(str(i) for i in range(SCALE + 1)))  # the output vocabulary


@dataclass(frozen=True)
class Judgement:
    scores: dict[str, float]  # DIMENSIONS -> [0, 1]
    causes: frozenset[str]


def render(scores: dict[str, float], causes) -> str:
    """The fixed-format line of a judgement (scores in [0, 1], written on the 0-10 scale)."""
    body = " ".join(f"{d} {int(round(SCALE * scores[d]))}" for d in DIMENSIONS)
    return f"{body} causes {' '.join(c for c in CAUSES if c in set(causes)) or NONE}"


def parse(text: str) -> Judgement | None:
    """The judgement of a line in the fixed format, or None when it does not parse (module docstring)."""
    words = text.split()
    if len(words) < 8 or words[6] != "causes":
        return None
    scores = {}
    for i, d in enumerate(DIMENSIONS):
        name, value = words[2 * i], words[2 * i + 1]
        if name != d or not value.isdigit() or int(value) > SCALE:
            return None
        scores[d] = int(value) / SCALE
    causes = words[7:]
    if causes == [NONE]:
        return Judgement(scores, frozenset())
    if not all(c in CAUSES for c in causes) or len(set(causes)) != len(causes):
        return None
    return Judgement(scores, frozenset(causes))


def cause_f1(predicted, true) -> float:
    """F1 of a predicted set of failure causes against the true set; 1 when both are empty."""
    predicted, true = set(predicted), set(true)
    if not predicted and not true:
        return 1.0
    return 2 * len(predicted & true) / (len(predicted) + len(true))


def motion_reward(text: str, scores: dict[str, float], causes, w_cause: float, w_format: float) -> dict[str, float]:
    """The reward's terms and total for one completion against a video's annotation (scores in [0, 1])."""
    judged = parse(text)
    if judged is None:
        return {"score_accuracy": 0.0, "cause_f1": 0.0, "format": 0.0, "reward": 0.0}
    accuracy = sum(1.0 - abs(judged.scores[d] - scores[d]) for d in DIMENSIONS) / len(DIMENSIONS)  # range 1 on [0, 1]
    f1 = cause_f1(judged.causes, causes)
    return {"score_accuracy": accuracy, "cause_f1": f1, "format": 1.0, "reward": accuracy + w_cause * f1 + w_format}


# -- registered, for the core RL step (stage motion_grpo): the task is recipes/motion/policy.py's MotionTask -------------

def _term(task, examples, completions: Sequence[str], name: str) -> Tensor:
    return torch.tensor([task.terms(c, e)[name] for c, e in zip(completions, examples)], dtype=torch.float32)


@rewards.register("motion_score_accuracy", tasks=("motion",))
def motion_score_accuracy(task, examples, completions: Sequence[str], finished) -> Tensor:
    """MotionInsight's score accuracy: the mean over dimensions of 1 - |judged - annotated| (stage motion_grpo)."""
    return _term(task, examples, completions, "score_accuracy")


@rewards.register("motion_cause_f1", tasks=("motion",))
def motion_cause_f1(task, examples, completions: Sequence[str], finished) -> Tensor:
    """MotionInsight's failure-cause F1 of the judgement against the annotation (stage motion_grpo)."""
    return _term(task, examples, completions, "cause_f1")


@rewards.register("motion_format", tasks=("motion",))
def motion_format(task, examples, completions: Sequence[str], finished) -> Tensor:
    """MotionInsight's format term: 1 when the judgement parses (stage motion_grpo)."""
    return _term(task, examples, completions, "format")
