"""RIDE, RL-induced direction extrapolation (2026; target formula from the README of
github.com/xixixixixxxx/RIDE): on-policy
distillation in representation space from an RL teacher T and its pre-RL base B, pushed beyond the teacher
along the RL residual.

    Delta = h_T - h_B                       at every layer l and completion position t, on the student's y
    h*    = h_T + (lambda - 1) Delta        (lambda = 1: plain representation matching; > 1: extrapolation)
    L     = sum_l (1/L) mask-mean_t || h_S - sg(h*) ||^2

Per (l, t) this equals maximising J(h_S) = 2 (lambda - 1) <h_S, Delta> - ||h_S - h_T||^2 up to a constant.
With h_T = h_B (RL changed nothing there) the target is the teacher, unlike output-space extrapolation.
`ride_logits` is the output-space baseline for comparison: the same extrapolation applied to the teacher's
and base's next-token log-probabilities (ExOPD-style), matched by the student's log-probabilities.
Settings: rl.options.ride / rl.options.ride_logits.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import assert_no_grad
from posttrain.objectives import auxiliaries


class RIDEOptions(Section):
    weight: float = Field(1.0, ge=0)
    lam: float = Field(1.5, gt=0)  # lambda; 1 is plain teacher matching


def ride_target(teacher: Tensor, base: Tensor, lam: float) -> Tensor:
    assert_no_grad(teacher_hidden=teacher, base_hidden=base)
    return teacher + (lam - 1.0) * (teacher - base)


def ride_loss(student: Tensor, teacher: Tensor, base: Tensor, mask: Tensor, lam: float) -> Tensor:
    """student/teacher/base [L, B, T, d], mask [B, T] -> mean over layers of the masked mean squared distance."""
    target = ride_target(teacher, base, lam)
    sq = ((student - target) ** 2).sum(-1)  # [L, B, T]
    m = mask.to(sq.dtype)
    return ((sq * m).sum((-1, -2)) / m.sum().clamp(min=1.0)).mean()


def directional_objective(student: Tensor, teacher: Tensor, base: Tensor, lam: float) -> Tensor:
    """J = 2 (lambda - 1) <h_S, Delta> - ||h_S - h_T||^2, summed over positions (the reward view of RIDE)."""
    return (2 * (lam - 1.0) * (student * (teacher - base)).sum(-1) - ((student - teacher) ** 2).sum(-1)).sum()


@auxiliaries.register("ride", needs=("teacher_hidden", "base_hidden"), policy=("hidden",), options=RIDEOptions)
def ride(batch, policy, cfg, module=None):
    opts: RIDEOptions = cfg.options_for("ride")
    student = policy.hidden
    value = ride_loss(student, batch.extras["teacher_hidden"], batch.extras["base_hidden"], batch.completion_mask, opts.lam)
    return opts.weight * value, {"ride/distance": float(value.detach())}


@auxiliaries.register("ride_logits", needs=("teacher_logprobs", "base_logprobs"), policy=("logprobs",), options=RIDEOptions)
def ride_logits(batch, policy, cfg, module=None):
    """The output-space baseline: log-probs [1, B, T, V] take the place of the hidden states."""
    opts: RIDEOptions = cfg.options_for("ride_logits")
    student = policy.logprobs[None]
    value = ride_loss(student, batch.extras["teacher_logprobs"][None], batch.extras["base_logprobs"][None], batch.completion_mask, opts.lam)
    return opts.weight * value, {"ride/distance": float(value.detach())}
