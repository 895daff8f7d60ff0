"""The `none` policy loss: no policy-gradient term, for objectives that are their auxiliary terms alone
(OPSD, ThinkOPD, RIDE, ROFT). It returns an exact zero that stays on the policy's graph. It reads no
log-probs (`reads_logp=False`): when no auxiliary term reads the policy's completion forward either, the
trainer skips that forward altogether."""

from __future__ import annotations

from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import losses


@losses.register("none", needs=(), reads_logp=False)
def no_policy_gradient(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    return (logp * 0.0).sum(), {"clip_fraction": 0.0}
