"""GM-DPO, Graded Margin Direct Preference Optimization (with the FlexBench benchmark, 2026;
derived from its abstract): DPO whose required margin
and loss weight grow with the severity gap g between the chosen and the rejected caption, so pairs whose
rejected response holds severe errors (a fabricated or wrong action) are separated by more:

    m(g) = gamma * g,    w(g) = 1 + eta * g  (renormalised to mean 1 over the batch)
    L    = mean_pairs  w(g) * ( -log sigmoid( beta * h(x, y_w, y_l) - m(g) ) )

Invariants: g = 0 on a pair gives plain DPO on it (m = 0, w = 1 before renormalisation; exactly DPO for an
all-zero batch); at fixed h the per-pair loss and gradient magnitude grow with g.
Settings: preference.options.gm_dpo (gamma, eta).
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives.preference import PairLogps, log_ratio_margin, pair_metrics, preference_objectives, sigmoid_loss


class GMDPOOptions(Section):
    gamma: float = Field(2.0, ge=0)  # margin per unit of severity gap, in logit units
    eta: float = Field(1.0, ge=0)  # extra loss weight per unit of severity gap


def graded_terms(severity: Tensor, opts: GMDPOOptions) -> tuple[Tensor, Tensor]:
    """(margin m(g), weight w(g) before batch renormalisation), per pair."""
    return opts.gamma * severity, 1.0 + opts.eta * severity


@preference_objectives.register("gm_dpo", options=GMDPOOptions)
def gm_dpo(p: PairLogps, cfg, state: dict) -> tuple[Tensor, dict[str, float]]:
    opts: GMDPOOptions = cfg.options_for("gm_dpo")
    margin, weight = graded_terms(p.severity, opts)
    weight = weight / weight.mean()
    loss = (weight * sigmoid_loss(log_ratio_margin(p), cfg.beta, margin)).mean()
    return loss, {**pair_metrics(p, cfg.beta), "gm_dpo/margin_mean": float(margin.mean())}
