"""Invariants of the 2026 catalogue's losses and estimators (docs/objectives.md), on hand-built tensors: what each
reduces to on-policy, where its clip / mask / gate binds, and the estimators' defining properties."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import advantages, losses
from posttrain.objectives.clip_cov import ClipCovOptions
from posttrain.objectives.dppo import DPPOOptions
from posttrain.objectives.dppo_reg import DPPORegOptions
from posttrain.objectives.dro import DROOptions
from posttrain.objectives.dual_clip import DualClipOptions
from posttrain.objectives.ipo import IPOOptions
from posttrain.objectives.kl_cov import KLCovOptions
from posttrain.objectives.max_rl import MaxRLOptions
from posttrain.objectives.sapo import SAPOOptions
from posttrain.objectives.topr import TOPROptions
from posttrain.objectives.vespo import VESPOOptions
from test_catalogue_parity import reward_batch

OPTIONS = {
    "dual_clip": DualClipOptions(c=3.0), "dppo_tv": DPPOOptions(delta_low=0.2, delta_high=0.2, cap=20.0),
    "dppo_kl": DPPOOptions(delta_low=0.05, delta_high=0.05, cap=20.0),
    "dppo_reg": DPPORegOptions(delta_low=0.2, delta_high=0.2, adv_tau=1.0, kl_tau=1e-3),
    "ipo": IPOOptions(threshold=0.1, adv_tau=1.0, kl_tau=1e-3), "sapo": SAPOOptions(tau_pos=1.0, tau_neg=1.05),
    "clip_cov": ClipCovOptions(ratio=2e-4, lb=1.0, ub=5.0), "kl_cov": KLCovOptions(ratio=2e-4, coef=1.0),
    "dro": DROOptions(beta=0.1), "vespo": VESPOOptions(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0),
    "topr": TOPROptions(positive_weight=1.0, negative_weight=1.0), "max_rl": MaxRLOptions(eps=0.0),
}
POLICY_GRADIENT = ["dual_clip", "dppo_tv", "dppo_kl", "dppo_reg", "ipo", "sapo", "gpg", "clip_cov", "kl_cov", "dro",
                   "importance_sampling", "vespo", "topr"]


def cfg(agg="token_mean", low=0.2, high=0.2):
    return LossSettings(loss_agg=agg, clip_eps_low=low, clip_eps_high=high, max_new_tokens=4, options=OPTIONS)


def on_policy():
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(4, 4, 6), -1)[..., 0].clone().requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])
    return logp, logp.detach().clone(), mask, torch.tensor([1.0, -0.5, 2.0, -1.0])


@pytest.mark.parametrize("name", POLICY_GRADIENT)
def test_on_policy_every_loss_has_the_policy_gradient(name):
    """At rho = 1 (the first pass) every loss's gradient is - AGG(A grad logp): nothing clips, masks or gates yet
    (Clip-Cov's random drop and KL-Cov's |log rho| are the exceptions: 1 token in 2e-4, and a 0 penalty at rho = 1)."""
    logp, old, mask, adv = on_policy()
    loss, metrics = losses.get(name)(logp, old, adv, mask, cfg())
    (grad,) = torch.autograd.grad(loss, logp)
    reference, _ = losses.get("gpg")(logp, old, adv, mask, cfg())
    (expected,) = torch.autograd.grad(reference, logp)
    if name == "clip_cov":  # at most max(1, 2e-4 n) = 1 token is dropped, only if its covariance is in (1, 5)
        assert int(((grad - expected).abs() > 1e-6).sum()) <= 1
    else:
        torch.testing.assert_close(grad, expected, atol=1e-6, rtol=1e-5)
    assert metrics["clip_fraction"] == 0.0 or name in ("clip_cov", "kl_cov")  # their "clip" share is the selected tokens


def test_dual_clip_floors_negative_advantages_only():
    logp = torch.tensor([[math.log(0.9)], [math.log(0.9)]], requires_grad=True)
    old = torch.tensor([[math.log(0.1)], [math.log(0.1)]])  # rho = 9 > c = 3
    loss, m = losses.get("dual_clip")(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), cfg("seq_mean"))
    # A = 1: min(9, 1.2) = 1.2; A = -1: max(min(-9, -1.2), -3) = -3  -> loss = -(1.2 - 3) / 2
    assert float(loss) == pytest.approx(0.9) and m["dual_clip_fraction"] == 0.5


def test_dppo_tv_masks_by_probability_difference_not_ratio():
    logp = torch.log(torch.tensor([[0.02, 0.9]])).requires_grad_()
    old = torch.log(torch.tensor([[0.01, 0.6]]))  # ratios 2 and 1.5; p - q = 0.01 and 0.3
    loss, m = losses.get("dppo_tv")(logp, old, torch.tensor([1.0]), torch.ones(1, 2), cfg())
    assert m["clip_fraction"] == 0.5  # the rare token moved 2x but only 0.01 in probability: kept; the other is masked
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(grad[0, 1]) == 0.0 and float(grad[0, 0]) == pytest.approx(-2.0 / 2)


def test_sapo_gate_is_one_on_policy_and_decays_faster_for_negatives():
    logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.25]]))  # rho = 2
    _, pos = losses.get("sapo")(logp, old, torch.tensor([1.0]), torch.ones(1, 2), cfg())
    _, neg = losses.get("sapo")(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), cfg())
    s = torch.sigmoid(torch.tensor(1.0))
    assert pos["sapo/gate_mean"] == pytest.approx(float(4 * s * (1 - s)), rel=1e-6)
    assert neg["sapo/gate_mean"] < pos["sapo/gate_mean"] < 1


def test_vespo_weight_is_one_on_policy_and_peaks_at_k_over_lambda():
    logp, old, mask, adv = on_policy()
    _, m = losses.get("vespo")(logp, old, adv, mask, cfg())
    assert m["vespo/phi_mean"] == pytest.approx(1.0)
    lp = torch.zeros(1, 1, requires_grad=True)
    phis = {}
    for w in (0.5, 2.0 / 3.0, 1.0, 1.5):  # k_pos / lambda_pos = 2/3: phi is largest there
        _, m = losses.get("vespo")(lp, torch.full((1, 1), -math.log(w)), torch.tensor([1.0]), torch.ones(1, 1), cfg())
        phis[w] = m["vespo/phi_mean"]
    assert max(phis, key=phis.get) == pytest.approx(2.0 / 3.0)


def test_geo_mean_is_the_geometric_mean_of_clipped_ratios():
    logp = torch.log(torch.tensor([[0.4, 0.5]])).requires_grad_()
    old = torch.log(torch.tensor([[0.2, 0.5]]))  # ratios 2 (clipped to e^0.4 for A > 0) and 1
    loss, m = losses.get("geo_mean")(logp, old, torch.tensor([1.0]), torch.ones(1, 2), cfg("seq_mean", 0.4, 0.4))
    assert float(loss) == pytest.approx(-math.exp(0.4 / 2)) and m["clip_fraction"] == 0.5


def test_topr_positives_are_sft_and_negatives_truncate_the_ratio():
    logp = torch.log(torch.tensor([[0.5], [0.5]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25], [0.25]]))  # rho = 2
    loss, m = losses.get("topr")(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), cfg())
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[:, 0].tolist() == pytest.approx([-0.5, 0.5])  # weights 1 (positive, not rho = 2) and min(rho, 1) = 1
    assert m["clip_fraction"] == 0.5


def test_dppo_reg_and_ipo_regulariser_pulls_masked_tokens_back():
    logp = torch.log(torch.tensor([[0.9]])).requires_grad_()
    old = torch.log(torch.tensor([[0.3]]))  # p - q = 0.6: masked by both
    for name in ("dppo_reg", "ipo"):
        loss, m = losses.get(name)(logp, old, torch.tensor([1.0]), torch.ones(1, 1), cfg())
        (grad,) = torch.autograd.grad(loss, logp)
        assert m["clip_fraction"] == 1.0 and float(grad) == pytest.approx(2e-3 * math.log(3.0))  # only kl_tau (log rho)^2


def test_kl_cov_penalises_the_top_covariance_token():
    logp = torch.log(torch.tensor([[0.9, 0.1, 0.5, 0.5]])).requires_grad_()
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    adv = torch.tensor([[2.0, -2.0, 0.0, 0.0]])  # the first token: high A and high logp, the largest covariance
    _, m = losses.get("kl_cov")(logp, old, adv, torch.ones(1, 4), cfg())
    assert m["kl_cov/penalised_fraction"] == 0.25


def test_clip_cov_drops_a_candidate_token():
    logp = torch.log(torch.tensor([[0.9, 0.1, 0.5, 0.5]])).requires_grad_()
    adv = torch.tensor([[3.0, -3.0, 0.0, 0.0]])
    options = {"clip_cov": ClipCovOptions(ratio=0.25, lb=0.5, ub=5.0)}
    c = replace(cfg(), options=options)
    loss, m = losses.get("clip_cov")(logp, logp.detach(), adv, torch.ones(1, 4), c)
    assert m["clip_fraction"] == 0.25  # one of the two candidates (cov 1.7 and 1.7 > lb) is dropped


# ---------------------------------------------------------------- estimators


def test_pass_at_k_credits_only_the_best_of_each_group():
    batch = reward_batch([0.0, 1.0, 0.0, 0.0, 0.5, 0.5], [0, 0, 0, 1, 1, 1])
    adv = advantages.get("grpo_passk")(batch, SimpleNamespace(std_scaling="none", std_eps=1e-6))
    assert adv.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # group 1's best two tie: no credit


def test_opo_baseline_is_the_length_weighted_mean():
    batch = reward_batch([1.0, 0.0], [0, 0], lengths=[6, 2])
    adv = advantages.get("opo")(batch, SimpleNamespace())
    assert adv.tolist() == pytest.approx([1 - 0.75, -0.75])  # b = (6 * 1 + 2 * 0) / 8


def test_max_rl_weighs_hard_prompts_by_one_over_the_pass_rate():
    batch = reward_batch([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0] * 4 + [1] * 4 + [2] * 4)
    adv = advantages.get("max_rl")(batch, SimpleNamespace(options_for=OPTIONS.get))
    assert float(adv[0]) == pytest.approx(3.0) and float(adv[4]) == pytest.approx(1 / 3)  # p = 1/4: 1/p - 1; p = 3/4
    assert adv[8:].tolist() == [0.0] * 4  # no success: no signal


def test_gpg_rescales_by_the_share_of_rows_with_a_reward():
    batch = reward_batch([1.0, 0.0, 0.0, 0.0], [0, 0, 1, 1])
    adv = advantages.get("gpg")(batch, SimpleNamespace())
    assert adv.tolist() == pytest.approx([4 * 0.5, -4 * 0.5, 0.0, 0.0])  # alpha = B / #nonzero = 4


def test_lite_ppo_divides_by_the_batch_std_of_the_centred_rewards():
    batch = reward_batch([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    adv = advantages.get("lite_ppo")(batch, SimpleNamespace(std_eps=0.0))
    centred = torch.tensor([0.5, -0.5, 0.0, 0.0])
    torch.testing.assert_close(adv, centred / centred.std())
