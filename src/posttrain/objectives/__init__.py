"""Objectives = an advantage estimator + a policy loss (+ loss aggregation and auxiliary terms).

Each part is registered by name with what it reads, and the trainer computes exactly that:

- `needs=(...)`: extra tensors on the batch (`batch.extras[name]`), each made by a registered provider
  (trainers/extras.py) that declares the model role it reads (reference, teacher, base, the policy);
- `policy=("logprobs", "hidden")`: more of the trainer's one policy forward than the sampled-token log-probs;
- `scores=(name, ...)`: token sequences held by an extra that the same policy forward also scores;
- `module=factory`: a trainable side module (`factory(model_config, options) -> nn.Module`, optional attribute
  `lr_scale`) that the trainer builds, steps with the policy and checkpoints; the term receives it;
- `critic=True`: the part trains the critic (the value loss): the trainer runs a critic forward with gradient
  each update pass (`CriticOutputs.values`, objectives/value_loss.py) and steps the critic with the policy (trainers/online_rl.py);
- `options=Model`: its settings (`rl.options.<name>`), parsed once by `posttrain.resolve`.

    AdvantageEstimator(batch, cfg) -> Tensor [B] or [B, T]
    PolicyLoss(logp, old_logp, advantages, mask, settings: LossSettings) -> (loss, metrics)   (objectives/loss_settings.py)
    Aggregation(values [B, T], mask [B, T], *, max_len=None) -> scalar
    AuxiliaryTerm(batch, policy: PolicyOutputs, cfg, module) -> (loss, metrics), added to the policy loss

No part runs a forward pass or owns an optimiser. Presets (`rl.preset`, objectives/presets.py) name
combinations of these parts, e.g. DAPO.
"""

from posttrain.registry import Registry

advantages: Registry = Registry("advantage estimator")
losses: Registry = Registry("policy loss")
aggregations: Registry = Registry("loss aggregation")
auxiliaries: Registry = Registry("auxiliary loss")

from posttrain.objectives import (  # noqa: E402,F401  (registers)
    aggregation, cispo, dr_grpo, gae, gdpo, grpo, gspo, kl, policy_losses, qglas, reinforce_pp, remax, respo, rloo, value_loss,
    witness,
)
from posttrain.objectives import (  # noqa: E402,F401  (the 2026 catalogue: docs/objectives.md)
    clip_cov, cross_entropy, dppo, dppo_reg, dro, dual_clip, geo_mean, gpg, importance_sampling, ipo, kl_cov, lite_ppo,
    max_rl, opo, pass_at_k, sapo, topr, vespo,
)
from posttrain.objectives import distill  # noqa: E402,F401  (registers the on-policy distillation family)

__all__ = ["advantages", "losses", "aggregations", "auxiliaries", "needs_of", "policy_reads", "parts_of", "trains_critic"]


def parts_of(cfg) -> list:
    """The registry entries of the configured estimator, policy loss and auxiliary terms."""
    return [advantages.entry(cfg.advantage), losses.entry(cfg.loss), *(auxiliaries.entry(n) for n in getattr(cfg, "aux", ()))]


def needs_of(cfg) -> frozenset[str]:
    """The extra tensors the configured objective needs from the trainer."""
    needed = {need for entry in parts_of(cfg) for need in entry.meta.get("needs", ())}
    if cfg.beta > 0:
        needed.add("ref_logp")
    return frozenset(needed)


def policy_reads(cfg) -> frozenset[str]:
    """What of the policy forward the configured parts read: "logp" (unless the loss is `none` and no term reads
    it), "logprobs", "hidden", and "scores:<extra>" for each token sequence to score."""
    reads = {read for entry in parts_of(cfg) for read in entry.meta.get("policy", ())}
    reads |= {f"scores:{name}" for entry in parts_of(cfg) for name in entry.meta.get("scores", ())}
    if losses.entry(cfg.loss).meta.get("reads_logp", True) or cfg.beta > 0:
        reads.add("logp")
    return frozenset(reads)


def trains_critic(cfg) -> bool:
    """Whether a configured part trains the critic (registry meta `critic=True`, e.g. the `value` loss)."""
    return any(entry.meta.get("critic") for entry in parts_of(cfg))
