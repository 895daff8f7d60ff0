"""Objectives = an advantage estimator + a policy loss (+ loss aggregation and auxiliary terms).

Each part is registered by name with the extra tensors it `needs` (e.g. "ref_logp"); `params.yaml`
selects parts by these names and the trainer computes exactly what the selected parts need.

    AdvantageEstimator(batch, cfg) -> Tensor [B] or [B, T]
    PolicyLoss(logp, old_logp, advantages, mask, cfg) -> (loss, metrics)
    Aggregation(values [B, T], mask [B, T], *, max_len=None) -> scalar

Presets (`rl.preset`, objectives/presets.py) name combinations of these parts, e.g. DAPO.
"""

from posttrain.registry import Registry

advantages: Registry = Registry("advantage estimator")
losses: Registry = Registry("policy loss")
aggregations: Registry = Registry("loss aggregation")
auxiliaries: Registry = Registry("auxiliary loss")  # AuxiliaryLoss(run, batch) -> (loss, metrics), added to the policy loss

from posttrain.objectives import (  # noqa: E402,F401  (registers)
    aggregation, cispo, dr_grpo, gdpo, grpo, gspo, kl, policy_losses, qglas, reinforce_pp, remax, respo, rloo, witness,
)
from posttrain.objectives import distill  # noqa: E402,F401  (registers the on-policy distillation family)

__all__ = ["advantages", "losses", "aggregations", "auxiliaries", "needs_of"]


def needs_of(cfg) -> frozenset[str]:
    """The extra tensors the configured objective needs from the trainer."""
    needed = set(advantages.entry(cfg.advantage).meta.get("needs", ()))
    needed |= set(losses.entry(cfg.loss).meta.get("needs", ()))
    for name in getattr(cfg, "aux", ()):
        needed |= set(auxiliaries.entry(name).meta.get("needs", ()))
    if cfg.beta > 0:
        needed.add("ref_logp")
    return frozenset(needed)
