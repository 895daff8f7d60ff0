"""Offline preference objectives, registered by name (`preference.objective` in params.yaml).

    PreferenceObjective(pairs: PairLogps, cfg: PreferenceConfig, state: dict) -> (loss, metrics)

`PairLogps` holds the policy's and the frozen reference's sequence log-probs of each pair's chosen and
rejected response (sums over response tokens), with each pair's severity gap and optional human label.
`state` is a dict the trainer keeps across steps for objectives with memory (ABC-Align's EMA of alpha).

DPO (Rafailov et al. 2023, "Direct Preference Optimization", arXiv 2305.18290, eq. 7):

    h(x, y_w, y_l) = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]
    L_DPO          = -log sigmoid(beta * h)            implicit reward r(x, y) = beta * (log pi - log pi_ref)

Invariants: L = log 2 at theta = ref; dL/dlog pi(y_w) = -beta sigmoid(-beta h); a constant added to both
sequence log-probs leaves L unchanged; a margin m > 0 raises the loss at h = 0 above log 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.registry import Registry

preference_objectives: Registry = Registry("preference objective")


@dataclass(frozen=True)
class PairLogps:
    chosen: Tensor  # [N] log pi_theta(y_w | x), with gradient
    rejected: Tensor  # [N] log pi_theta(y_l | x), with gradient
    ref_chosen: Tensor  # [N] log pi_ref(y_w | x), no gradient
    ref_rejected: Tensor  # [N] log pi_ref(y_l | x), no gradient
    severity: Tensor  # [N] normalised severity gap g in [0, 1]
    gold: Tensor  # [N] human label: 1 agrees with the pair's order, 0 disagrees, NaN unlabelled

    def __post_init__(self) -> None:
        assert not (self.ref_chosen.requires_grad or self.ref_rejected.requires_grad), "reference log-probs must not carry gradient"


def log_ratio_margin(p: PairLogps) -> Tensor:
    """h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)), per pair."""
    return (p.chosen - p.ref_chosen) - (p.rejected - p.ref_rejected)


def sigmoid_loss(h: Tensor, beta: float, margin: Tensor | float = 0.0) -> Tensor:
    """-log sigmoid(beta * h - m), per pair (the margin form of ODPO / IPO-style offsets)."""
    return -F.logsigmoid(beta * h - margin)


def pair_metrics(p: PairLogps, beta: float) -> dict[str, float]:
    """Implicit-reward diagnostics, as TRL names them: accuracy, margin, chosen and rejected rewards."""
    with torch.no_grad():
        chosen = beta * (p.chosen - p.ref_chosen)
        rejected = beta * (p.rejected - p.ref_rejected)
        return {
            "rewards/accuracy": float((chosen > rejected).float().mean()),
            "rewards/margin": float((chosen - rejected).mean()),
            "rewards/chosen": float(chosen.mean()),
            "rewards/rejected": float(rejected.mean()),
        }


@preference_objectives.register("dpo")
def dpo(p: PairLogps, cfg, state: dict) -> tuple[Tensor, dict[str, float]]:
    """Sigmoid DPO, mean over pairs: -log sigmoid(beta * h) (Rafailov et al. 2023, arXiv 2305.18290, eq. 7)."""
    loss = sigmoid_loss(log_ratio_margin(p), cfg.beta).mean()
    return loss, pair_metrics(p, cfg.beta)


from posttrain.objectives import abc_align, gm_dpo  # noqa: E402,F401  (registers)
