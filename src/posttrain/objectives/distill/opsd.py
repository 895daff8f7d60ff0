"""OPSD, on-policy self-distillation with a privileged self-teacher (On-Policy Self-Distillation, arXiv 2601.18734):

    pi_T(. | x, y_<t) = sg pi_theta(. | x, y*, y_<t)          the same model, told the reference solution y*
    L = mask-mean_t D(pi_S(. | x, y_<t) || pi_T)              D = reverse KL (default) or JSD_beta

over the student's own sampled tokens, with full-vocabulary distributions. An auxiliary term: with
`rl.loss: none` (the `opsd` preset) it is the whole objective; with a policy loss it is added to it.
Settings: rl.options.opsd.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config import Section
from posttrain.objectives import auxiliaries
from posttrain.objectives.aggregation import token_mean
from posttrain.objectives.distill.divergence import divergence


class OPSDOptions(Section):
    weight: float = Field(1.0, ge=0)
    divergence: Literal["reverse_kl", "jsd"] = "reverse_kl"  # reverse_kl | jsd
    beta: float = Field(0.5, gt=0, lt=1)  # JSD mixture weight (unused by reverse_kl)


@auxiliaries.register("opsd", needs=("privileged_logprobs",), policy=("logprobs",), options=OPSDOptions)
def opsd(batch, policy, cfg, module=None):
    opts: OPSDOptions = cfg.options_for("opsd")
    per_token = divergence(opts.divergence, policy.logprobs, batch.extras["privileged_logprobs"], opts.beta)
    value = token_mean(per_token, batch.completion_mask)
    return opts.weight * value, {"opsd/divergence": float(value.detach())}
