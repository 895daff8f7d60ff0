"""Parity of the 2026 catalogue with the anchors' own code (verl, prime-rl, SkyRL, AReaL, ROLL), through the faithful
transcriptions in anchor_transcriptions.py: the same random batch, our part and theirs, loss value and gradient
(or advantages, masks, weights) within 1e-6. TRL's parts are checked against TRL itself (test_trl_parity.py); the
transcriptions were checked once against verl 0.9.1's real core_algos.py (tests/unit/verl_original_check.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import anchor_transcriptions as ref
from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import advantages, losses
from posttrain.objectives.clip_cov import ClipCovOptions
from posttrain.objectives.dppo import DPPOOptions
from posttrain.objectives.dppo_reg import DPPORegOptions
from posttrain.objectives.dro import DROOptions
from posttrain.objectives.dual_clip import DualClipOptions
from posttrain.objectives.ipo import IPOOptions
from posttrain.objectives.kl_cov import KLCovOptions
from posttrain.objectives.m2po import M2POOptions
from posttrain.objectives.max_rl import MaxRLOptions
from posttrain.objectives.off_policy import corrections
from posttrain.objectives.icepop import IcePopOptions
from posttrain.objectives.rejection import RejectionOptions
from posttrain.objectives.reinforce_pp import ReinforcePPOptions
from posttrain.objectives.sapo import SAPOOptions
from posttrain.objectives.topr import TOPROptions
from posttrain.rollout import RolloutBatch

B, T = 8, 7
TOL = 1e-6
AGG = {"token_mean": "token-mean", "seq_mean": "seq-mean-token-mean", "seq_mean_token_sum": "seq-mean-token-sum"}


def batch_tensors(seed=0, spread=0.4):
    """[B, T] log-probs with gradient, old log-probs `spread` away (ratios well off 1), a ragged mask, [B] advantages."""
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2.5 - 0.05).requires_grad_(True)
    old = (logp.detach() + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    lengths = torch.tensor([7, 3, 1, 5, 7, 2, 6, 4])
    mask = (torch.arange(T)[None] < lengths[:, None]).to(torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, mask, adv


def cfg_for(agg="token_mean", low=0.2, high=0.28, **options):
    return LossSettings(loss_agg=agg, clip_eps_low=low, clip_eps_high=high, max_new_tokens=T, options=options)


def compare(ours, theirs, logp):
    """(|loss diff|, max |grad diff|) of two scalar losses of `logp`; fails on a vacuous (zero) gradient."""
    g_ours, = torch.autograd.grad(ours, logp, retain_graph=True)
    g_theirs, = torch.autograd.grad(theirs, logp, retain_graph=True)
    assert float(g_theirs.abs().max()) > 1e-4, "a vacuous comparison: no gradient"
    return abs(float(ours.detach()) - float(theirs.detach())), float((g_ours - g_theirs).abs().max())


def assert_close(name, ours, theirs, logp):
    loss_diff, grad_diff = compare(ours, theirs, logp)
    print(f"PARITY {name}: |loss diff| = {loss_diff:.3e}, max |grad diff| = {grad_diff:.3e}")
    assert loss_diff < TOL and grad_diff < TOL


# --- verl policy losses ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "seq_mean_token_sum"])
def test_dual_clip_matches_verl_vanilla_and_skyrl(agg):
    logp, old, mask, adv = batch_tensors(spread=1.5)  # ratios > 3 exist: the dual clip binds
    cfg = cfg_for(agg, dual_clip=DualClipOptions(c=3.0))
    ours, metrics = losses.get("dual_clip")(logp, old, adv, mask, cfg)
    assert metrics["dual_clip_fraction"] > 0
    assert_close(f"dual_clip/verl/{agg}", ours, ref.verl_vanilla(old, logp, adv[:, None], mask, AGG[agg], 0.2, 0.28, 3.0), logp)
    if agg == "token_mean":  # SkyRL sums after scaling the advantages by 1 / n_valid
        theirs = ref.skyrl_dual_clip(logp, old, adv[:, None] / mask.sum(), mask, 0.2, 0.28, 3.0)
        assert_close("dual_clip/skyrl", ours, theirs, logp)


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_dppo_matches_verl_and_skyrl_gradient(kind):
    logp, old, mask, adv = batch_tensors(spread=0.6)
    opts = DPPOOptions(delta_low=0.05, delta_high=0.08, cap=1.5)  # a low cap: the truncation binds too
    cfg = cfg_for(**{f"dppo_{kind}": opts})
    ours, metrics = losses.get(f"dppo_{kind}")(logp, old, adv, mask, cfg)
    assert 0 < metrics["clip_fraction"] < 1 and metrics["truncated_fraction"] > 0
    theirs = ref.verl_dppo(old, logp, adv[:, None], mask, "token-mean", 0.05, 0.08, 1.5, kind)
    assert_close(f"dppo_{kind}/verl", ours, theirs, logp)
    # SkyRL's dppo differentiates the untruncated ratio: the same gradient where no ratio exceeds C
    cfg_big = cfg_for(**{f"dppo_{kind}": DPPOOptions(delta_low=0.05, delta_high=0.08, cap=1e6)})
    ours_big, _ = losses.get(f"dppo_{kind}")(logp, old, adv, mask, cfg_big)
    sky = ref.skyrl_dppo(logp, old, adv[:, None].expand(B, T) / mask.sum(), mask, 0.05, 0.08, f"binary_{kind}")
    g_ours, = torch.autograd.grad(ours_big, logp)
    g_sky, = torch.autograd.grad(sky, logp)
    print(f"PARITY dppo_{kind}/skyrl gradient: {float((g_ours - g_sky).abs().max()):.3e}")
    assert float((g_ours - g_sky).abs().max()) < TOL


def test_sapo_matches_verl():
    logp, old, mask, adv = batch_tensors()
    cfg = cfg_for("seq_mean", sapo=SAPOOptions(tau_pos=1.0, tau_neg=1.05))
    ours, metrics = losses.get("sapo")(logp, old, adv, mask, cfg)
    assert 0 < metrics["sapo/gate_mean"] < 1
    assert_close("sapo/verl", ours, ref.verl_sapo(old, logp, adv[:, None], mask, 1.0, 1.05), logp)


def test_gpg_loss_matches_verl():
    logp, old, mask, adv = batch_tensors()
    ours, _ = losses.get("gpg")(logp, old, adv, mask, cfg_for())
    assert_close("gpg/verl", ours, ref.verl_gpg(logp, adv[:, None], mask, "token-mean"), logp)


def test_clip_cov_matches_verl_with_the_same_draw():
    logp, old, mask, adv = batch_tensors(spread=0.1)
    adv = adv * 3  # covariances in (lb, ub) = (0.2, 5) exist
    cfg = cfg_for(clip_cov=ClipCovOptions(ratio=0.1, lb=0.2, ub=5.0))
    torch.manual_seed(7)
    ours, metrics = losses.get("clip_cov")(logp, old, adv, mask, cfg)
    torch.manual_seed(7)
    theirs = ref.verl_clip_cov(old, logp, adv[:, None].expand(B, T).clone(), mask, "token-mean", 0.2, 0.28, 0.1, 0.2, 5.0)
    assert metrics["clip_fraction"] > 0
    assert_close("clip_cov/verl", ours, theirs, logp)


def test_kl_cov_matches_verl():
    logp, old, mask, adv = batch_tensors()
    cfg = cfg_for(kl_cov=KLCovOptions(ratio=0.1, coef=1.0))
    ours, metrics = losses.get("kl_cov")(logp, old, adv, mask, cfg)
    theirs = ref.verl_kl_cov(old, logp, adv[:, None].expand(B, T).clone(), mask, "token-mean", 0.1, 1.0)
    assert metrics["clip_fraction"] > 0
    assert_close("kl_cov/verl", ours, theirs, logp)


def test_geo_mean_matches_verl():
    logp, old, mask, adv = batch_tensors()
    ours, metrics = losses.get("geo_mean")(logp, old, adv, mask, cfg_for("seq_mean", low=0.4, high=0.4))
    assert metrics["clip_fraction"] > 0
    theirs = ref.verl_geo_mean(old, logp, adv[:, None].expand(B, T), mask, 0.4, 0.4)
    assert_close("geo_mean/verl", ours, theirs, logp)


def test_dro_matches_verl():
    logp, old, mask, adv = batch_tensors()
    ours, _ = losses.get("dro")(logp, old, adv, mask, cfg_for(dro=DROOptions(beta=0.3)))
    assert_close("dro/verl", ours, ref.verl_dro(old, logp, adv[:, None], mask, "token-mean", 0.3), logp)


# --- prime-rl ----------------------------------------------------------------------------------------------------

def test_dppo_reg_and_ipo_match_prime_rl():
    logp, old, mask, adv = batch_tensors(spread=0.6)
    n = mask.sum()
    cfg = cfg_for(dppo_reg=DPPORegOptions(delta_low=0.05, delta_high=0.08, adv_tau=1.0, kl_tau=0.01),
                  ipo=IPOOptions(threshold=0.1, adv_tau=1.0, kl_tau=0.01))
    ours, metrics = losses.get("dppo_reg")(logp, old, adv, mask, cfg)
    assert 0 < metrics["clip_fraction"] < 1
    theirs = ref.prime_default_loss(logp, old, adv[:, None].expand(B, T), mask.bool(), 0.05, 0.08, 1.0, 0.01) / n
    assert_close("dppo_reg/prime-rl", ours, theirs, logp)
    ours, metrics = losses.get("ipo")(logp, old, adv, mask, cfg)
    assert 0 < metrics["clip_fraction"] < 1
    theirs = ref.prime_ipo_loss(logp, old, adv[:, None].expand(B, T), mask.bool(), 0.1, 1.0, 0.01) / n
    assert_close("ipo/prime-rl", ours, theirs, logp)


# --- SkyRL -------------------------------------------------------------------------------------------------------

def test_cross_entropy_and_importance_sampling_match_skyrl():
    logp, old, mask, adv = batch_tensors()
    n = mask.sum()
    ours, _ = losses.get("cross_entropy")(logp, old, adv, mask, cfg_for())
    assert_close("cross_entropy/skyrl", ours * n, ref.skyrl_cross_entropy(logp, mask), logp)
    ours, _ = losses.get("importance_sampling")(logp, old, adv, mask, cfg_for())
    assert_close("importance_sampling/skyrl", ours, ref.skyrl_importance_sampling(logp, old, adv[:, None] / n, mask), logp)


# --- ROLL ----------------------------------------------------------------------------------------------------------

def test_topr_matches_roll_when_the_advantage_is_the_score():
    logp, old, mask, adv = batch_tensors()
    adv[0] = 0.0  # a zero score goes to the negative branch in both
    cfg = cfg_for(topr=TOPROptions(positive_weight=1.0, negative_weight=0.7))
    ours, metrics = losses.get("topr")(logp, old, adv, mask, cfg)
    assert metrics["clip_fraction"] > 0
    per_token = ref.roll_topr_per_token(torch.exp(logp - old), logp, adv[:, None], adv, 1.0, 0.7)
    assert_close("topr/roll", ours, ref.verl_agg_loss(per_token, mask, "token-mean"), logp)


# --- estimators ------------------------------------------------------------------------------------------------------

def reward_batch(scores, group, lengths=None):
    scores = torch.as_tensor(scores, dtype=torch.float32)
    n = scores.shape[0]
    lengths = torch.full((n,), T) if lengths is None else torch.as_tensor(lengths)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.zeros(n, T, dtype=torch.long), completion_mask=mask, group=torch.as_tensor(group),
        old_logp=torch.zeros(n, T), rewards=scores[:, None], reward_names=("r",), reward_weights=torch.ones(1),
    )


SCORES = [1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.2, 1.0, 0.3, 0.9, 0.9]
GROUP = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
LENGTHS = [7, 3, 5, 2, 6, 1, 4, 7, 3, 3, 6, 2]


@pytest.mark.parametrize("std_scaling", ["group", "none"])
def test_grpo_passk_matches_verl(std_scaling):
    batch = reward_batch(SCORES, GROUP)
    ours = advantages.get("grpo_passk")(batch, SimpleNamespace(std_scaling=std_scaling, std_eps=1e-6))
    theirs = ref.verl_grpo_passk(torch.tensor(SCORES), GROUP, 1e-6, std_scaling != "none")
    print(f"PARITY grpo_passk/verl/{std_scaling}: {float((ours - theirs).abs().max()):.3e}")
    assert torch.allclose(ours, theirs, atol=TOL) and int((ours != 0).sum()) == 2  # group 0's best two tie: no winner


def test_reinforce_pp_tokens_matches_verl_reinforce_plus_plus_baseline():
    batch = reward_batch(SCORES, GROUP, LENGTHS)
    cfg = SimpleNamespace(std_eps=1e-12, options_for=lambda name: ReinforcePPOptions(whiten="tokens"))
    ours = advantages.get("reinforce_pp")(batch, cfg)
    theirs = ref.verl_reinforce_pp_baseline(torch.tensor(SCORES), batch.completion_mask.float(), GROUP)
    print(f"PARITY reinforce_plus_plus_baseline/verl: {float((ours - theirs).abs().max()):.3e}")
    assert torch.allclose(ours, theirs, atol=TOL)


def test_opo_matches_verl():
    batch = reward_batch(SCORES, GROUP, LENGTHS)
    ours = advantages.get("opo")(batch, SimpleNamespace())
    theirs = ref.verl_opo(torch.tensor(SCORES), batch.completion_mask.float(), GROUP)
    print(f"PARITY opo/verl: {float((ours - theirs).abs().max()):.3e}")
    assert torch.allclose(ours, theirs, atol=TOL)


def test_gpg_advantage_matches_verl():
    batch = reward_batch(SCORES, GROUP)
    ours = advantages.get("gpg")(batch, SimpleNamespace())
    theirs = ref.verl_gpg_advantage(torch.tensor(SCORES), GROUP)
    print(f"PARITY gpg advantage/verl: {float((ours - theirs).abs().max()):.3e}")
    assert torch.allclose(ours, theirs, atol=TOL) and float(ours.abs().max()) > 0


@pytest.mark.parametrize("anchor", ["prime-rl", "skyrl"])
def test_max_rl_matches_prime_rl_and_skyrl(anchor):
    batch = reward_batch(SCORES, GROUP)
    eps = 0.0 if anchor == "prime-rl" else 1e-6
    ours = advantages.get("max_rl")(batch, SimpleNamespace(options_for=lambda name: MaxRLOptions(eps=eps)))
    scores = torch.tensor(SCORES)
    if anchor == "prime-rl":
        theirs = torch.cat([ref.prime_max_rl(scores[i:i + 4]) for i in range(0, 12, 4)])
    else:  # SkyRL divides by (0 + eps) in an all-zero group: 0 / eps = 0 there too
        theirs = ref.skyrl_maxrl(scores, GROUP, eps)
    print(f"PARITY max_rl/{anchor}: {float((ours - theirs).abs().max()):.3e}")
    assert torch.allclose(ours, theirs, atol=TOL)


def test_lite_ppo_matches_areal_group_mean_batch_std():
    batch = reward_batch(SCORES, GROUP)
    ours = advantages.get("lite_ppo")(batch, SimpleNamespace(std_eps=1e-5))
    theirs = ref.areal_group_mean_batch_std(torch.tensor(SCORES), 4, 1e-5)
    print(f"PARITY lite_ppo/areal: {float((ours - theirs).abs().max()):.3e}")
    assert torch.allclose(ours, theirs, atol=TOL)


# --- corrections ---------------------------------------------------------------------------------------------------

def mismatch(seed=3):
    g = torch.Generator().manual_seed(seed)
    proximal = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2.0
    behaviour = proximal + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 1, 5, 7, 2, 6, 4])
    return behaviour, proximal, (torch.arange(T)[None] < lengths[:, None]).to(torch.float64)


@pytest.mark.parametrize("mode,low,high", [
    ("token_k1", 0.7, 1.4), ("token_k2", 1.0, 0.05), ("token_k3", 1.0, 0.05), ("seq_sum_k1", 0.5, 2.0), ("seq_sum_k3", 1.0, 0.3),
    ("seq_mean_k1", 0.95, 1.05), ("seq_mean_k2", 1.0, 0.05), ("seq_mean_k3", 1.0, 0.05), ("seq_max_k2", 1.0, 0.2), ("seq_max_k3", 1.0, 0.2),
])
def test_rejection_matches_verl_rollout_rs(mode, low, high):
    behaviour, proximal, mask = mismatch()
    fixed = corrections.get("rejection")(behaviour, proximal, mask, RejectionOptions(mode=mode, low=low, high=high))
    theirs = ref.verl_rejection_mask((proximal - behaviour) * mask, mask, mode, low, high)
    assert torch.equal(fixed.mask, theirs), mode
    assert 0 < fixed.metrics["rejection/masked_fraction"] < 1, "thresholds chosen so that some but not all are rejected"
    assert fixed.weight is None and torch.equal(fixed.old_logp, proximal)


def test_icepop_matches_verl_low_high_threshold():
    behaviour, proximal, mask = mismatch()
    fixed = corrections.get("icepop")(behaviour, proximal, mask, IcePopOptions(low=0.8, high=1.25))
    theirs = ref.verl_icepop_weights((proximal - behaviour) * mask, mask, 0.8, 1.25)
    print(f"PARITY icepop/verl: {float((fixed.weight - theirs).abs().max()):.3e}")
    assert torch.allclose(fixed.weight, theirs, atol=1e-12) and torch.equal(fixed.mask, mask)
    assert 0 < fixed.metrics["icepop/masked_fraction"] < 1


def test_m2po_matches_areal_mask():
    behaviour, proximal, mask = mismatch()
    fixed = corrections.get("m2po")(behaviour, proximal, mask, M2POOptions(threshold=0.04, cap=0.0))
    theirs = ref.areal_m2po_mask(behaviour, proximal, mask.bool(), 0.04)
    assert torch.equal(fixed.mask.bool(), theirs)
    assert 0 < fixed.metrics["m2po/masked_fraction"] < 1
    kept = fixed.mask.bool()
    assert float(((behaviour - proximal) ** 2)[kept].mean()) < 0.04  # the invariant M2PO promises
