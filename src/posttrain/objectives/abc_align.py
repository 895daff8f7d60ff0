"""ABC-Align, Adaptive Bias Correction with pseudo labels (2026, github.com/SewoongLab/abc-align;
derived from its abstract).

Abundant AI pseudo-labels are biased; a small human-labelled subset Lb is unbiased but noisy. Start from the
pseudo-label DPO objective and add a prediction-powered correction on Lb, with a strength alpha chosen from
plug-in estimates of the correction's bias^2 and variance:

    L_ABC = mean_U l(theta; y_hat) + alpha * mean_Lb [ l(theta; y) - l(theta; y_hat) ]
    Delta_j = l(theta; y_j) - l(theta; y_hat_j)  (j in Lb; the loss-value form of the plug-in)
    b = mean_j Delta_j,  v = var_j Delta_j / n,   alpha* = b^2 / (b^2 + v)  in [0, 1]
    alpha <- EMA(alpha*) recomputed every K steps  (alpha = 0: pseudo labels only; 1: PPI's unbiased form)

l is the sigmoid DPO loss with the label choosing which response is chosen: a pair is stored in its pseudo
order, so l(y_hat) = -log sigmoid(beta h) and, where the human disagrees, l(y) = -log sigmoid(-beta h).
Rows with a human label (gold not NaN) form Lb (the trainer appends them to every batch: `gold_rows`);
the other rows are the pool U, whose human labels are not used.
Invariants: alpha* in [0, 1]; -> 0 as b -> 0; -> 1 when b^2 >> v; the correction is exactly 0 when human
and pseudo labels agree on Lb; alpha* shrinks as n shrinks at fixed bias.
Settings: preference.options.abc_align (every, ema, fixed_alpha).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives.preference import PairLogps, log_ratio_margin, pair_metrics, preference_objectives, sigmoid_loss


class ABCAlignOptions(Section):
    every: int = Field(10, gt=0)  # K: steps between re-estimates of alpha
    ema: float = Field(0.9, ge=0, lt=1)  # smoothing of alpha across re-estimates
    fixed_alpha: float | None = Field(None, ge=0, le=1)  # set: no adaptation (0 = pseudo labels only, 1 = PPI)


def plug_in_alpha(delta: Tensor) -> tuple[float, float, float]:
    """(alpha*, b_hat, v_hat) from the per-example correction values Delta_j on the labelled subset."""
    n = delta.numel()
    if n == 0:
        return 0.0, 0.0, 0.0
    b = float(delta.mean())
    v = float(delta.var(unbiased=True)) / n if n > 1 else float("inf")  # one label: no variance estimate, trust none
    if b == 0.0:
        return 0.0, b, v
    return min(max(b * b / (b * b + v), 0.0), 1.0), b, v


def correction_terms(h: Tensor, gold: Tensor, beta: float) -> Tensor:
    """Delta_j = l(y_j) - l(y_hat_j) on labelled rows (gold 1: agree -> 0; gold 0: disagree)."""
    agree = gold > 0.5
    human = torch.where(agree, sigmoid_loss(h, beta), sigmoid_loss(-h, beta))
    return human - sigmoid_loss(h, beta)


@preference_objectives.register("abc_align", options=ABCAlignOptions, gold_rows=True)
def abc_align(p: PairLogps, cfg, state: dict) -> tuple[Tensor, dict[str, float]]:
    opts: ABCAlignOptions = cfg.options_for("abc_align")
    h = log_ratio_margin(p)
    labelled = ~torch.isnan(p.gold)
    pseudo = sigmoid_loss(h[~labelled], cfg.beta).mean() if bool((~labelled).any()) else h.sum() * 0.0
    delta = correction_terms(h[labelled], p.gold[labelled], cfg.beta)
    step = state.get("step", 0)
    if opts.fixed_alpha is not None:
        state["alpha"] = opts.fixed_alpha
    elif step % opts.every == 0:
        alpha_star, b, v = plug_in_alpha(delta.detach())
        state.update(alpha_star=alpha_star, bias=b, variance=v)
        state["alpha"] = alpha_star if "alpha" not in state else opts.ema * state["alpha"] + (1 - opts.ema) * alpha_star
    state["step"] = step + 1
    correction = delta.mean() if delta.numel() else h.sum() * 0.0
    loss = pseudo + state["alpha"] * correction
    metrics = {**pair_metrics(p, cfg.beta), "abc/alpha": float(state["alpha"]), "abc/correction": float(correction.detach())}
    metrics.update({f"abc/{k}": float(state[k]) for k in ("alpha_star", "bias", "variance") if k in state and math.isfinite(state[k])})
    return loss, metrics
