"""The distillation methods as presets (`rl.preset: <name>` or `distill.method: <name>`): each sets the
estimator, policy loss and auxiliary terms that make up the method; their settings stay in rl.options.

opd:        the OPD token advantage logp_T - logp_S with the clipped surrogate.
gats:       GRPO + the OPD term weighted by the teacher-student success gap (GATS).
sipo:       GRPO + SIPO's zero-mean token redistribution from the contrastive self-teacher.
uniopsd:    UniOPSD's episode advantage + fused step credit with bounded token modulation.
pr_opd:     GRPO + PR-OPD's layer-wise projected hidden-state alignment to the skill-reading self.
opsd:       OPSD's divergence to the privileged self-teacher alone (no policy-gradient term).
think_opd:  ThinkOPD's routed divergence to the trace-reading teacher alone.
ride:       RIDE's hidden-state regression to the extrapolated teacher alone.
roft:       ROFT's next-token loss on on-policy retrospections alone.
"""

from __future__ import annotations

from typing import Any

from posttrain.objectives.presets import presets

METHODS: dict[str, dict[str, Any]] = {
    "opd": {"advantage": "opd", "loss": "clip", "aux": []},  # OPD: token advantage logp_T - logp_S
    "gats": {"advantage": "gats", "loss": "clip", "aux": []},  # GATS: GRPO + gap-scheduled OPD
    "sipo": {"advantage": "sipo", "loss": "clip", "aux": []},  # SIPO: GRPO + contrastive redistribution
    "uniopsd": {"advantage": "uniopsd", "loss": "clip", "aux": []},  # UniOPSD: fused step credit
    "pr_opd": {"advantage": "grpo", "loss": "clip", "aux": ["pr_opd"]},  # PR-OPD: GRPO + representation alignment
    "opsd": {"advantage": "grpo", "loss": "none", "aux": ["opsd"]},  # OPSD: privileged self-teacher divergence
    "think_opd": {"advantage": "grpo", "loss": "none", "aux": ["think_opd"]},  # ThinkOPD: routed trace distillation
    "ride": {"advantage": "grpo", "loss": "none", "aux": ["ride"]},  # RIDE: representation extrapolation
    "roft": {"advantage": "grpo", "loss": "none", "aux": ["roft"]},  # ROFT: retrospection-only NLL
}
DISTILL_METHODS = tuple(METHODS)


def _preset(keys: dict[str, Any]):
    return lambda rl: dict(keys)


for _name, _keys in METHODS.items():
    presets.register(_name, distill=True)(_preset(_keys))
