"""Off-policy sequence masking, OPSM (DeepSeek-AI 2025, "DeepSeek-V3.2", technical report, "Off-Policy Sequence
Masking"; TRL 1.16's `off_policy_mask_threshold`): a negative-advantage completion that has drifted far from the
policy being trained teaches mostly noise, so it is dropped:

    KL_i  = (1 / |y_i|) sum_t ( log mu(y_{i,t}) - log pi(y_{i,t}) )          (mu: the sampler; pi: the trainer, detached)
    keep  = 1[A_i >= 0] or 1[KL_i <= delta]

= trl.GRPOTrainer.get_off_policy_mask, applied as a 0 / 1 weight on the per-token loss (a dropped completion stays in
the aggregation's denominator, as in TRL). pi is the trainer's first forward of the update (pi_prox); TRL re-reads the
current policy each pass, the same thing with rl.epochs_per_batch = 1. The ratio is taken against pi_prox. The part
reads the advantages (registry meta `advantages=True`). Settings: rl.options.opsm. Metrics:
`opsm/masked_fraction` (completions dropped) and `opsm/kl_mean` (mean KL_i).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives.off_policy import Corrected, corrections


class OPSMOptions(Section):
    delta: float = 0.1  # the largest mean log(mu / pi) a negative-advantage completion may have


@corrections.register("opsm", options=OPSMOptions, advantages=True)
def opsm(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: OPSMOptions, advantages: Tensor) -> Corrected:
    m = mask.to(proximal_logp.dtype)
    kl = ((behaviour_logp - proximal_logp.detach()) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    keep = ((adv >= 0) | (kl <= options.delta)).to(m.dtype).expand_as(m)
    dropped = ((keep == 0) & mask.bool()).any(-1)
    metrics = {"opsm/masked_fraction": float(dropped.to(torch.float64).mean()) if mask.shape[0] else 0.0,
               "opsm/kl_mean": float(kl.mean()) if mask.shape[0] else 0.0}
    return Corrected(proximal_logp, keep * m, mask, metrics)
