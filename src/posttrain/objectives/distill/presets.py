"""The distillation methods as presets (`rl.preset: <name>` or `distill.method: <name>`): each sets the
estimator, policy loss and auxiliary terms that make up the method; their settings stay in rl.options."""

from __future__ import annotations

from typing import Any

from posttrain.objectives.presets import presets

METHODS: dict[str, dict[str, Any]] = {
    "opd": {"advantage": "opd", "loss": "clip", "aux": []},  # §0.3, token advantage logp_T - logp_S
    "gats": {"advantage": "gats", "loss": "clip", "aux": []},  # §7, GRPO + gap-scheduled OPD
    "sipo": {"advantage": "sipo", "loss": "clip", "aux": []},  # §4, GRPO + contrastive redistribution
    "uniopsd": {"advantage": "uniopsd", "loss": "clip", "aux": []},  # §22, fused step credit
    "pr_opd": {"advantage": "grpo", "loss": "clip", "aux": ["pr_opd"]},  # §3, GRPO + representation alignment
    "opsd": {"advantage": "grpo", "loss": "none", "aux": ["opsd"]},  # §0.3, privileged self-teacher divergence
    "think_opd": {"advantage": "grpo", "loss": "none", "aux": ["think_opd"]},  # §8, routed trace distillation
    "ride": {"advantage": "grpo", "loss": "none", "aux": ["ride"]},  # §5, representation extrapolation
    "roft": {"advantage": "grpo", "loss": "none", "aux": ["roft"]},  # §28, retrospection-only NLL
}
DISTILL_METHODS = tuple(METHODS)


def _preset(keys: dict[str, Any]):
    return lambda rl: dict(keys)


for _name, _keys in METHODS.items():
    presets.register(_name, distill=True)(_preset(_keys))
