"""OPD, on-policy distillation with a reverse-KL token advantage (Thinking Machines, "On-Policy
Distillation", 2025; Agarwal et al. 2024, GKD, arXiv 2306.13649, on-policy case):

    A_t = logp_T(y_t | x, y_<t) - logp_S(y_t | x, y_<t)     (teacher detached; the negative sampled reverse KL)

with discount 0 (no credit to later tokens), used as a per-token advantage in the importance-sampled
(clipped) policy-gradient loss. logp_S is the rollout-time log-prob (`old_logp`), so at the first epoch the
gradient is E[A_t grad logp_S(y_t)] = -grad KL(pi_S || pi_T) along the sampled path.

Settings (rl.options.opd): `weight` scales the teacher term; `reward_weight` adds the GRPO reward advantage
(0: pure distillation; > 0 with a constant `weight`: the "constant-weight OPD + GRPO" baseline of GATS).
The teacher is the model of role `teacher` (the `distill` stage's `teacher` input), reading the same prompt.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import assert_no_grad
from posttrain.objectives import advantages
from posttrain.objectives.grpo import grpo
from posttrain.rollout import RolloutBatch


class OPDOptions(Section):
    weight: float = Field(1.0, ge=0)  # coefficient of the teacher term
    reward_weight: float = Field(0.0, ge=0)  # coefficient of the GRPO reward advantage (0: distillation only)


def opd_token_advantage(teacher_logp: Tensor, student_logp: Tensor, mask: Tensor) -> Tensor:
    """[B, T] logp_T - logp_S on produced tokens, 0 on padding; both inputs must be constants."""
    assert_no_grad(teacher_logp=teacher_logp, student_logp=student_logp)
    return (teacher_logp - student_logp) * mask.to(teacher_logp.dtype)


def with_reward(batch: RolloutBatch, cfg, teacher_term: Tensor, reward_weight: float) -> Tensor:
    """reward_weight * A_GRPO (broadcast over tokens) + the [B, T] teacher term."""
    if reward_weight == 0:
        return teacher_term
    return reward_weight * grpo(batch, cfg)[:, None] * batch.completion_mask.to(teacher_term.dtype) + teacher_term


@advantages.register("opd", needs=("teacher_logp",), options=OPDOptions)
def opd(batch: RolloutBatch, cfg) -> Tensor:
    opts: OPDOptions = cfg.options_for("opd")
    term = opts.weight * opd_token_advantage(batch.extras["teacher_logp"], batch.old_logp, batch.completion_mask)
    return with_reward(batch, cfg, term, opts.reward_weight)
