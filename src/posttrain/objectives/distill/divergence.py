"""Token-level divergences between full next-token distributions (the students' and teachers' [B, T, V]
log-probs), shared by OPSD and ThinkOPD.

    reverse_kl_t = sum_v p_S(v) (log p_S(v) - log p_T(v))                       (mode seeking; >= 0)
    jsd_beta_t   = beta KL(p_T || m) + (1 - beta) KL(p_S || m),  m = beta p_T + (1 - beta) p_S   (GKD, eq. 4)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posttrain.errors import assert_no_grad


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor) -> Tensor:
    assert_no_grad(teacher_logprobs=teacher_logprobs)
    return (student_logprobs.exp() * (student_logprobs - teacher_logprobs)).sum(-1)


def jsd(student_logprobs: Tensor, teacher_logprobs: Tensor, beta: float) -> Tensor:
    assert_no_grad(teacher_logprobs=teacher_logprobs)
    if beta <= 0.0 or beta >= 1.0:
        raise ValueError("jsd needs 0 < beta < 1 (its limits are the forward and reverse KL)")
    mixture = torch.logsumexp(torch.stack([teacher_logprobs + math.log(beta), student_logprobs + math.log(1 - beta)]), dim=0)
    kl_teacher = (teacher_logprobs.exp() * (teacher_logprobs - mixture)).sum(-1)
    kl_student = (student_logprobs.exp() * (student_logprobs - mixture)).sum(-1)
    return beta * kl_teacher + (1 - beta) * kl_student


def divergence(kind: str, student_logprobs: Tensor, teacher_logprobs: Tensor, beta: float) -> Tensor:
    return reverse_kl(student_logprobs, teacher_logprobs) if kind == "reverse_kl" else jsd(student_logprobs, teacher_logprobs, beta)
