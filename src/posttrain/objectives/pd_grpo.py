"""PD-GRPO, Pairwise Dual-Group Relative Policy Optimization, and the Thinking Reward Model's output format
("Think Before You Score", the 2026 TRM paper; derived from its abstract).

A generative reward model (TRM) judges one candidate per rollout and writes, in a fixed format,

    <rubric>...</rubric><assessment>...</assessment><score>x</score>      (x a number in [0, score_max])

For a preference pair (y_w preferred to y_l) it is sampled G times on y_w (group W) and G times on y_l (group L).
Each rollout is rewarded for landing on the correct side of the *other* group's median score, with no bonus for
a larger margin (so scores are not pushed to the extremes), plus a format reward; unparseable outputs get no
reward at all. Advantages are normalised within W and within L separately:

    ref_L = median_k s^L_k,  ref_W = median_j s^W_j          (over the parseable rollouts; detached)
    r^W_j = 1[s^W_j > ref_L] + 0.5 * 1[s^W_j = ref_L],   r^L_k = 1[s^L_k < ref_W] + 0.5 * 1[s^L_k = ref_W]
    R = r_pair + alpha_f * f,   f = 1 if the output parses (and R = 0 when it does not)
    A^W = GRPO-normalise(R^W),  A^L = GRPO-normalise(R^L)

Invariants: raising s^W_j past ref_L does not raise its reward; each group's advantages have zero mean; identical
scores for both candidates give every rollout the tie reward (no spurious signal); swapping y_w and y_l swaps
the reward assignments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.objectives.grpo import group_normalize

_TRM = re.compile(r"\s*<rubric>(.+?)</rubric>\s*<assessment>(.+?)</assessment>\s*<score>\s*([0-9]+(?:\.[0-9]+)?)\s*</score>\s*", re.S)


@dataclass(frozen=True)
class TRMOutput:
    rubric: str
    assessment: str
    score: float


def parse_trm_output(text: str, score_max: float) -> TRMOutput | None:
    """The rubric, assessment and score of a TRM output in the fixed format, or None (never raises) when the
    text does not follow it or the score lies outside [0, score_max]."""
    match = _TRM.fullmatch(text)
    if match is None:
        return None
    score = float(match.group(3))
    if not 0.0 <= score <= score_max:
        return None
    return TRMOutput(match.group(1).strip(), match.group(2).strip(), score)


def parsed_scores(texts: list[str], score_max: float) -> tuple[Tensor, Tensor]:
    """(scores [N] with 0 where unparseable, parseable mask [N]) of a group of TRM outputs."""
    parsed = [parse_trm_output(t, score_max) for t in texts]
    return torch.tensor([p.score if p else 0.0 for p in parsed]), torch.tensor([p is not None for p in parsed])


def _side_reward(scores: Tensor, valid: Tensor, reference: Tensor | None, above: bool) -> Tensor:
    if reference is None:  # the other group has no parseable score: nothing to be on the right side of
        return torch.zeros_like(scores)
    win = scores > reference if above else scores < reference
    reward = win.float() + 0.5 * (scores == reference).float()
    return torch.where(valid, reward, torch.zeros_like(reward))


def _median(scores: Tensor, valid: Tensor) -> Tensor | None:
    return scores[valid].detach().median() if bool(valid.any()) else None


def pairwise_rewards(scores_w: Tensor, valid_w: Tensor, scores_l: Tensor, valid_l: Tensor) -> tuple[Tensor, Tensor]:
    """(r^W [G], r^L [G]): each rollout's side of the other group's median score (ties 0.5; unparseable 0)."""
    ref_l, ref_w = _median(scores_l, valid_l), _median(scores_w, valid_w)
    return _side_reward(scores_w, valid_w, ref_l, above=True), _side_reward(scores_l, valid_l, ref_w, above=False)


def pd_grpo_rewards(scores_w, valid_w, scores_l, valid_l, alpha_format: float) -> tuple[Tensor, Tensor]:
    """Total rewards R^W, R^L: pairwise side + alpha_format * format, zero for unparseable outputs."""
    r_w, r_l = pairwise_rewards(scores_w, valid_w, scores_l, valid_l)
    return r_w + alpha_format * valid_w.float(), r_l + alpha_format * valid_l.float()


def dual_group_advantages(rewards_w: Tensor, rewards_l: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """GRPO advantages normalised within group W and within group L separately."""
    def within(rewards: Tensor) -> Tensor:
        return group_normalize(rewards, torch.zeros(rewards.shape[0], dtype=torch.long, device=rewards.device), "group", eps)

    return within(rewards_w), within(rewards_l)


def margin_rewards(scores_w, valid_w, scores_l, valid_l, score_max: float, alpha_format: float) -> tuple[Tensor, Tensor]:
    """The plain pairwise baseline PD-GRPO is compared with: each rollout is paid for its *margin* over the other
    group's mean score, r^W_j = (1 + (s^W_j - mean s^L) / score_max) / 2 and r^L_k = (1 + (mean s^W - s^L_k) / score_max) / 2
    (in [0, 1], like the side reward), plus alpha_format * f; zero for unparseable outputs. A larger margin always
    pays more, so winners are pushed to score_max and losers to 0: the polarisation PD-GRPO removes."""
    def side(scores, valid, other, other_valid, sign):
        if not bool(other_valid.any()):
            return torch.zeros_like(scores)
        reward = 0.5 * (1 + sign * (scores - other[other_valid].detach().mean()) / score_max) + alpha_format
        return torch.where(valid, reward, torch.zeros_like(reward))

    return side(scores_w, valid_w, scores_l, valid_l, 1.0), side(scores_l, valid_l, scores_w, valid_w, -1.0)
