"""GATS, Gap-Adaptive Teacher Scheduling (2026, github.com/Ricardo-H/guide-then-let-go; derived from its abstract):
GRPO plus an on-policy-distillation term whose weight follows the teacher-student success gap.

    S_T    teacher's reference success rate (measured once on training prompts, or rl.options.gats.teacher_success)
    S_hat  <- mu * S_hat + (1 - mu) * mean(success in batch)             (first batch initialises it)
    g      = (S_T - S_hat) / max(S_T, eps)
    w      = w_max * clip(g / g_0, 0, 1);  with `latch`, w = 0 for good once S_hat >= S_T
    A_t    = A_GRPO + w * (logp_T(y_t) - logp_S(y_t))                   (the OPD term as a token advantage, objectives/distill/opd.py)

So guidance is strong while the student is far below the teacher, shrinks as it closes the gap and is gone
once it reaches the teacher: the teacher may be weaker than the final student. The schedule's state lives
in the trainer: the `gats_weight` provider (trainers/extras.py) declares it; this estimator reads w per row.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.state import DataclassState
from posttrain.objectives import advantages
from posttrain.objectives.distill.opd import opd_token_advantage, with_reward
from posttrain.rollout import RolloutBatch


class GATSOptions(Section):
    w_max: float = Field(1.0, ge=0)
    mu: float = Field(0.9, ge=0, lt=1)  # EMA decay of the student's success
    g_0: float = Field(1.0, gt=0)  # the gap (relative to S_T) at and above which the full weight applies
    latch: bool = True  # once the student reaches the teacher, never guide again
    teacher_success: float | None = Field(None, ge=0, le=1)  # S_T; null: measured once on the first batch's prompts
    eps: float = Field(1e-06, gt=0)


def gap_weight(student_success: float, teacher_success: float, opts: GATSOptions, latched: bool = False) -> float:
    """w(S_hat): w_max at S_hat = 0 (g_0 = 1), linear down to 0 at S_hat = S_T, 0 beyond or once latched."""
    if latched or student_success >= teacher_success:
        return 0.0
    gap = (teacher_success - student_success) / max(teacher_success, opts.eps)
    return opts.w_max * min(max(gap / opts.g_0, 0.0), 1.0)


@dataclass
class GATSState(DataclassState):
    student_success: float | None = None
    teacher_success: float | None = None
    latched: bool = False

    def update(self, batch_success: float, opts: GATSOptions) -> None:
        prev = self.student_success
        self.student_success = batch_success if prev is None else opts.mu * prev + (1 - opts.mu) * batch_success
        if opts.latch and self.teacher_success is not None and self.student_success >= self.teacher_success:
            self.latched = True


@advantages.register("gats", needs=("teacher_logp", "gats_weight"), options=GATSOptions)
def gats(batch: RolloutBatch, cfg) -> Tensor:
    weight = batch.extras["gats_weight"]
    term = weight[:, None] * opd_token_advantage(batch.extras["teacher_logp"], batch.old_logp, batch.completion_mask)
    return with_reward(batch, cfg, term, 1.0)
