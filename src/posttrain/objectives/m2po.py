"""M2PO, Second-Moment Trust Policy Optimization (Zheng et al. 2025, arXiv 2510.01161, §3; AReaL's
`actor.m2_threshold`): stale data is usable when the second moment of the behaviour log-ratio is bounded, so only the
extreme tokens are masked, the largest first, until the mean second moment of the rest is below tau:

    M2_t  = (log mu(y_t) - log pi_prox(y_t))^2           over the valid tokens, sorted in decreasing order
    drop  the k largest, k the smallest count with mean(M2 of the rest) < tau (all but one if none is)

then AReaL's decoupled loss (`decoupled`: weight pi_prox / mu, ratio against pi_prox, optional cap) on the rest. =
areal/trainer/ppo/actor.py _apply_m2po_masking / _get_m2po_loss_mask with use_decoupled_loss (AReaL's gsm8k_m2po
example: tau 0.04). Settings: rl.options.m2po. Metrics: `m2po/masked_fraction`, `m2po/m2_mean` (before masking).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives.off_policy import Corrected, DecoupledOptions, corrections, decoupled_ppo


class M2POOptions(Section):
    threshold: float = Field(0.04, gt=0)  # tau_M2
    cap: float = Field(5.0, ge=0)  # the decoupled loss's behaviour-weight cap; 0: none


def second_moment_keep(m2: Tensor, threshold: float) -> Tensor:
    """[n] bool: keep all but the largest values, dropping the fewest so that the kept ones average below threshold."""
    n = m2.numel()
    if n == 0:
        return torch.ones_like(m2, dtype=torch.bool)
    ordered, order = torch.sort(m2, descending=True)
    suffix_mean = ordered.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, device=m2.device, dtype=m2.dtype)
    below = torch.nonzero(suffix_mean < threshold, as_tuple=True)[0]
    n_drop = int(below[0]) if below.numel() else n - 1
    keep_sorted = torch.arange(n, device=m2.device) >= n_drop
    return keep_sorted[torch.argsort(order)]


@corrections.register("m2po", options=M2POOptions)
def m2po(behaviour_logp: Tensor, proximal_logp: Tensor, mask: Tensor, options: M2POOptions) -> Corrected:
    valid = mask.bool()
    m2 = (behaviour_logp - proximal_logp) ** 2
    keep = torch.zeros_like(valid)
    keep[valid] = second_moment_keep(m2[valid], options.threshold)
    inner = decoupled_ppo(behaviour_logp, proximal_logp, mask * keep.to(mask.dtype), DecoupledOptions(cap=options.cap))
    n = max(int(valid.sum()), 1)
    metrics = {**inner.metrics, "m2po/masked_fraction": float((valid & ~keep).sum()) / n,
               "m2po/m2_mean": float(m2[valid].mean()) if bool(valid.any()) else 0.0}
    return Corrected(inner.old_logp, inner.weight, inner.mask, metrics)
