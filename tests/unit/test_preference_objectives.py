"""Invariants of the preference objectives (DPO, GM-DPO, ABC-Align) on hand-made tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from posttrain.objectives.abc_align import ABCAlignOptions, correction_terms, plug_in_alpha
from posttrain.objectives.gm_dpo import GMDPOOptions
from posttrain.objectives.preference import PairLogps, log_ratio_margin, preference_objectives, sigmoid_loss

BETA = 0.1


def cfg(**options):
    opts = {"gm_dpo": GMDPOOptions(**options.get("gm_dpo", {"gamma": 2.0, "eta": 1.0})),
            "abc_align": ABCAlignOptions(**options.get("abc_align", {"every": 1, "ema": 0.0, "fixed_alpha": None}))}
    return SimpleNamespace(beta=BETA, options_for=lambda name: opts[name])


def pairs(chosen, rejected, ref_chosen=None, ref_rejected=None, severity=None, gold=None, grad=True):
    chosen = torch.tensor(chosen, dtype=torch.float32, requires_grad=grad)
    rejected = torch.tensor(rejected, dtype=torch.float32, requires_grad=grad)
    n = chosen.shape[0]
    ref_c = torch.tensor(ref_chosen, dtype=torch.float32) if ref_chosen is not None else chosen.detach().clone()
    ref_r = torch.tensor(ref_rejected, dtype=torch.float32) if ref_rejected is not None else rejected.detach().clone()
    sev = torch.tensor(severity, dtype=torch.float32) if severity is not None else torch.zeros(n)
    gold_t = torch.tensor(gold, dtype=torch.float32) if gold is not None else torch.full((n,), math.nan)
    return PairLogps(chosen, rejected, ref_c, ref_r, sev, gold_t)


def test_dpo_is_log2_at_init():
    loss, metrics = preference_objectives.get("dpo")(pairs([-3.0, -7.5, -1.0], [-4.0, -2.0, -9.0]), cfg(), {})
    assert float(loss.detach()) == pytest.approx(math.log(2), abs=1e-7)
    assert metrics["rewards/margin"] == 0.0


def test_dpo_gradient_matches_the_closed_form():
    p = pairs([-3.0, -2.0], [-4.0, -5.0], ref_chosen=[-3.5, -1.0], ref_rejected=[-3.0, -5.5])
    loss, _ = preference_objectives.get("dpo")(p, cfg(), {})
    loss.backward()
    h = log_ratio_margin(p).detach()
    expected = -BETA * torch.sigmoid(-BETA * h) / 2  # mean over 2 pairs
    assert torch.allclose(p.chosen.grad, expected, atol=1e-7)
    assert torch.allclose(p.rejected.grad, -expected, atol=1e-7)
    assert bool((p.chosen.grad < 0).all())


def test_dpo_invariant_to_a_shared_shift():
    base = pairs([-3.0, -2.0], [-4.0, -5.0], ref_chosen=[-3.5, -1.0], ref_rejected=[-3.0, -5.5], grad=False)
    shifted = pairs([-3.0 + 4.2, -2.0 + 4.2], [-4.0 + 4.2, -5.0 + 4.2], ref_chosen=[-3.5, -1.0], ref_rejected=[-3.0, -5.5], grad=False)
    dpo = preference_objectives.get("dpo")
    assert float(dpo(base, cfg(), {})[0]) == pytest.approx(float(dpo(shifted, cfg(), {})[0]), abs=1e-6)


def test_margin_raises_the_loss_at_zero_h():
    assert float(sigmoid_loss(torch.zeros(1), BETA, 0.5)) > math.log(2)


def test_reference_with_gradient_is_refused():
    with pytest.raises(AssertionError):
        PairLogps(torch.zeros(1), torch.zeros(1), torch.zeros(1, requires_grad=True), torch.zeros(1), torch.zeros(1), torch.zeros(1))


def test_gm_dpo_equals_dpo_at_zero_severity_gap():
    p = pairs([-3.0, -2.0, -6.0], [-4.0, -5.0, -1.0], ref_chosen=[-3.5, -1.0, -6.0], ref_rejected=[-3.0, -5.5, -2.0], grad=False)
    gm, _ = preference_objectives.get("gm_dpo")(p, cfg(), {})
    dpo, _ = preference_objectives.get("dpo")(p, cfg(), {})
    assert float(gm) == pytest.approx(float(dpo), abs=1e-7)


def test_gm_dpo_loss_and_gradient_grow_with_severity():
    p = pairs([-3.0, -3.0, -3.0], [-4.0, -4.0, -4.0], ref_chosen=[-3.2] * 3, ref_rejected=[-4.1] * 3, severity=[0.0, 0.5, 1.0])
    loss, _ = preference_objectives.get("gm_dpo")(p, cfg(), {})
    loss.backward()
    magnitude = p.chosen.grad.abs()
    assert bool(magnitude[0] < magnitude[1] < magnitude[2])
    margin = 2.0 * p.severity
    per_pair = sigmoid_loss(log_ratio_margin(p).detach(), BETA, margin)
    assert bool(per_pair[0] < per_pair[1] < per_pair[2])


def test_abc_alpha_bounds_and_limits():
    big_bias = torch.tensor([1.0, 1.01, 0.99, 1.0])
    no_bias = torch.tensor([0.5, -0.5, 0.5, -0.5])
    for delta in (big_bias, no_bias, torch.randn(7)):
        assert 0.0 <= plug_in_alpha(delta)[0] <= 1.0
    assert plug_in_alpha(big_bias)[0] > 0.99
    assert plug_in_alpha(no_bias)[0] == 0.0
    assert plug_in_alpha(torch.zeros(5))[0] == 0.0


def test_abc_alpha_shrinks_with_fewer_labels_at_fixed_bias():
    pattern = torch.tensor([0.2, 1.8])  # mean 1.0, the same spread at every n
    alphas = [plug_in_alpha(pattern.repeat(k))[0] for k in (1, 2, 8, 32)]
    assert alphas == sorted(alphas) and alphas[0] < alphas[-1]


def test_abc_correction_is_zero_when_human_and_pseudo_agree():
    h = torch.tensor([0.3, -2.0, 5.0])
    assert torch.equal(correction_terms(h, torch.ones(3), BETA), torch.zeros(3))
    p = pairs([-3.0, -2.0, -6.0, -1.0], [-4.0, -5.0, -1.0, -2.0], ref_chosen=[-3.5, -1.0, -6.0, -1.0],
              ref_rejected=[-3.0, -5.5, -2.0, -1.5], gold=[math.nan, math.nan, 1.0, 1.0], grad=False)
    loss, metrics = preference_objectives.get("abc_align")(p, cfg(), {})
    pseudo = sigmoid_loss(log_ratio_margin(p)[:2], BETA).mean()
    assert float(loss) == pytest.approx(float(pseudo), abs=1e-7) and metrics["abc/correction"] == 0.0


def test_abc_with_alpha_one_is_unbiased_for_the_human_objective():
    """Monte Carlo: alpha = 1 with a uniform random labelled subset => E[L_ABC] = the all-human-label loss."""
    g = torch.Generator().manual_seed(0)
    n_pool, n_lab = 200, 10
    h = torch.randn(n_pool, generator=g) * 30  # beta * h of order 3: pseudo and human losses differ
    human_agrees = 1.0 - ((h > 10) & (torch.rand(n_pool, generator=g) < 0.6)).float()  # the labeller errs where confident
    human_loss = torch.where(human_agrees > 0, sigmoid_loss(h, BETA), sigmoid_loss(-h, BETA)).mean()
    subsets = torch.rand(4000, n_pool, generator=g).argsort(dim=1)[:, :n_lab]  # uniform random labelled subsets
    values = sigmoid_loss(h, BETA).mean() + correction_terms(h[subsets], human_agrees[subsets], BETA).mean(dim=1)
    standard_error = float(values.std() / values.numel() ** 0.5)
    assert abs(float(values.mean()) - float(human_loss)) < 4 * standard_error
    assert abs(float(sigmoid_loss(h, BETA).mean()) - float(human_loss)) > 20 * standard_error  # pseudo alone is biased


def test_abc_fixed_alpha_and_ema_state():
    p = pairs([-3.0, -2.0, -6.0], [-4.0, -5.0, -1.0], gold=[math.nan, 0.0, 0.0], grad=False)
    state: dict = {}
    _, metrics = preference_objectives.get("abc_align")(p, cfg(abc_align={"every": 1, "ema": 0.0, "fixed_alpha": 1.0}), state)
    assert metrics["abc/alpha"] == 1.0 and state["step"] == 1
    state = {}
    c = cfg(abc_align={"every": 2, "ema": 0.5, "fixed_alpha": None})
    for _ in range(3):
        _, metrics = preference_objectives.get("abc_align")(p, c, state)
    assert state["step"] == 3 and 0.0 <= metrics["abc/alpha"] <= 1.0
