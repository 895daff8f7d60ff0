"""The on-policy distillation family (docs/distillation.md): estimators (opd, gats, sipo, uniopsd),
auxiliary losses (opsd, think_opd, ride, ride_logits, pr_opd, roft), the `none` policy loss and one
preset per method. Teacher-side tensors come from the extras registry (trainers/extras.py)."""

from posttrain.objectives.distill import (  # noqa: F401  (registers)
    gats, no_policy_gradient, opd, opsd, pr_opd, presets, ride, roft, sipo, think_opd, uniopsd,
)
