"""QGLAS and ReSPO: every listed invariant on hand-made tensors, plus their options."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from helpers import repo_params

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.objectives import advantages, losses
from posttrain.objectives.qglas import QGLASOptions, strength
from posttrain.objectives.respo import ReSPOOptions, log_kernel, phi_neg, phi_pos
from posttrain.rollout import RolloutBatch

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
RL = resolve.load(PARAMS).rl


def rl(agg="token_mean", **options):
    """The repo's rl settings with `loss_agg` and some options replaced (by name -> dict of changed keys)."""
    return resolve.updated(RL, "rl", loss_agg=agg, options=options, std_scaling="group", std_eps=1e-4)


def make_batch(rewards_, lengths, group=None, T=None) -> RolloutBatch:
    r = torch.as_tensor(rewards_, dtype=torch.float32)[:, None]
    B = r.shape[0]
    T = T or max(lengths)
    mask = (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.zeros(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
        completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask,
        group=torch.as_tensor(group if group is not None else [0] * B), old_logp=torch.zeros(B, T), rewards=r,
        reward_names=("q",), reward_weights=torch.ones(1),
    )


def qglas_and_grpo(batch, cfg=None):
    cfg = cfg or rl()
    return advantages.get("qglas")(batch, cfg), advantages.get("grpo")(batch, cfg)


Q = [0.9, 0.8, 0.7, 0.2, 0.1, 0.0, 0.5, 0.85]
L = [3, 6, 9, 2, 8, 5, 4, 12]


# ---------------------------------------------------------------- QGLAS


@pytest.mark.parametrize("mode", ["additive", "multiplicative"])
def test_qglas_preserves_sign_and_leaves_non_positive_advantages(mode):
    adv, base = qglas_and_grpo(make_batch(Q + Q[::-1], L + L[::-1], [0] * 8 + [1] * 8), rl(qglas={"mode": mode}))
    assert torch.equal(torch.sign(adv), torch.sign(base))
    assert torch.equal(adv[base <= 0], base[base <= 0])
    assert (adv >= base).all() and (adv > base).any()


def test_qglas_bonus_is_bounded_and_the_longest_positive_gets_none():
    b_max = 0.05  # small enough to bind
    adv, base = qglas_and_grpo(make_batch(Q, L), rl(qglas={"b_max": b_max, "gamma_max": 5.0}))
    bonus = adv - base
    assert (bonus >= 0).all() and (bonus <= b_max + 1e-7).all()
    assert float(bonus.max()) == pytest.approx(b_max)
    positive = torch.nonzero(base > 0).flatten()
    longest = positive[torch.tensor(L)[positive].argmax()]
    assert float(bonus[longest]) == 0.0
    # hand value with the default options: P = {0, 1, 2, 7}, mean L_P = 7.5; row 0 is shortest
    adv, base = qglas_and_grpo(make_batch(Q, L))
    q = torch.tensor(Q)
    sep = q[[0, 1, 2, 7]].std() / (q.std() + 1e-6)
    expected = min(0.5, 0.5 * math.exp(-float(sep) / 0.5) * (7.5 - 3) / 7.5)
    assert float(adv[0] - base[0]) == pytest.approx(expected, rel=1e-5)


def test_qglas_equal_lengths_in_p_change_nothing():
    lengths = [4 if q > 0.45 else length for q, length in zip(Q, L)]  # every positive has length 4
    adv, base = qglas_and_grpo(make_batch(Q, lengths))
    torch.testing.assert_close(adv, base, rtol=0, atol=0)


def test_qglas_needs_two_positives_and_ignores_unscored_rows():
    adv, base = qglas_and_grpo(make_batch([1.0, 0.0, 0.0, 0.0], [1, 5, 5, 5]))  # |P| = 1
    torch.testing.assert_close(adv, base, rtol=0, atol=0)
    adv, base = qglas_and_grpo(make_batch([1.0, float("nan"), 1.0, 0.0], [2, 1, 6, 6]))
    assert float(adv[1]) == 0.0 and float(adv[0]) > float(base[0])


def test_qglas_strength_is_non_increasing_in_the_positive_spread():
    opts = rl().options_for("qglas")
    s = strength(torch.linspace(0, 3, 50), opts)
    assert (s[1:] <= s[:-1]).all() and float(s[0]) == opts.gamma_max
    big_cap = rl(qglas={"b_max": 100.0})
    bonuses = []
    for spread in (0.0, 0.05, 0.2, 0.4):  # the same P (rows 0, 1) with the same lengths; only q spread in P moves
        adv, base = qglas_and_grpo(make_batch([0.6 + spread, 0.6, 0.0, 0.0], [2, 6, 4, 4]), big_cap)
        assert (base[:2] > 0).all()
        bonuses.append(float(adv[0] - base[0]))
    assert all(a >= b for a, b in zip(bonuses, bonuses[1:])) and bonuses[0] > bonuses[-1]


# ---------------------------------------------------------------- ReSPO


OPTS = RL.options_for("respo")


@pytest.mark.parametrize("opts", [OPTS, ReSPOOptions(**{**OPTS.model_dump(), "a_pos": 0.0})])
def test_respo_phi_is_one_at_w_one_on_both_branches(opts):
    zero = torch.zeros(1)
    assert float(phi_pos(zero, opts)) == 1.0 and float(phi_neg(zero, opts)) == 1.0


def test_respo_positive_branch_never_starves_under_generated_positives():
    log_w = torch.linspace(-20, 0, 200)  # w in (0, 1]
    assert (phi_pos(log_w, OPTS) >= OPTS.phi_min).all()
    assert float(phi_pos(torch.tensor([-20.0]), OPTS)) == pytest.approx(OPTS.phi_min)
    a0 = ReSPOOptions(**{**OPTS.model_dump(), "a_pos": 0.0})
    assert float(phi_pos(torch.tensor([-20.0]), a0)) == pytest.approx(math.exp(a0.lambda_pos), rel=1e-5)


def test_respo_negative_branch_vanishes_for_large_w_and_peaks_at_a_over_lambda():
    assert float(phi_neg(torch.tensor([math.log(50.0)]), OPTS)) < 1e-30
    assert float(phi_neg(torch.tensor([20.0]), OPTS)) == 0.0
    w = torch.linspace(0.01, 6, 6000, dtype=torch.float64)
    peak = w[phi_neg(w.log(), OPTS).argmax()]
    assert float(peak) == pytest.approx(OPTS.a_neg / OPTS.lambda_neg, abs=2e-3)
    torch.testing.assert_close(log_kernel(torch.tensor([0.0]), 3.0, 2.0), torch.zeros(1))


def respo_grad(offsets, adv, mask, cfg):
    old = -torch.rand(*mask.shape, generator=torch.Generator().manual_seed(0)) - 0.1
    logp = (old + torch.as_tensor(offsets, dtype=torch.float32)).requires_grad_(True)
    loss, metrics = losses.get("respo")(logp, old, torch.as_tensor(adv), mask, cfg)
    loss.backward()
    return loss, logp.grad, metrics, (logp.detach() - old)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_respo_gradient_is_phi_a_grad_logp_exactly(agg):
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    offsets = torch.tensor([[-5.0, -5.0, -5.5], [0.2, 0.1, 9.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0, 0.5, -1.0])
    _, grad, metrics, diff = respo_grad(offsets, adv, mask, rl(agg))
    w = (diff * mask).sum(-1).exp()
    k_pos = torch.clamp(w ** OPTS.a_pos * torch.exp(OPTS.lambda_pos * (1 - w)), min=OPTS.phi_min)
    phi = torch.where(adv >= 0, k_pos, w ** OPTS.a_neg * torch.exp(OPTS.lambda_neg * (1 - w)))
    m = mask.float()
    norm = m.sum() if agg == "token_mean" else m.sum(-1, keepdim=True) * mask.shape[0]
    torch.testing.assert_close(grad, -(phi * adv)[:, None] * m / norm)
    assert float(phi[2]) == 1.0 and float(phi[0]) == pytest.approx(OPTS.phi_min)  # on-policy; floored positive
    assert metrics["floored_pos_fraction"] == pytest.approx(3 / 6) and metrics["clip_fraction"] == pytest.approx(3 / 9)
    assert metrics["phi_mean"] == pytest.approx(float((phi[:, None] * m).sum() / m.sum()), rel=1e-5)


def test_respo_keeps_gradient_where_ppo_clip_starves_under_generated_positives():
    mask = torch.ones(2, 2, dtype=torch.long)
    adv = torch.tensor([1.0, 1.0])
    offsets = torch.tensor([[-10.0, -10.0], [0.3, 0.3]])  # row 0: w ~ e^-20 (under-generated); row 1: over 1 + eps
    cfg = rl()
    _, respo_g, _, _ = respo_grad(offsets, adv, mask, cfg)
    old = -torch.full((2, 2), 0.5)
    logp = (old + offsets).requires_grad_(True)
    clip_loss, _ = losses.get("clip")(logp, old, adv, mask, cfg)
    clip_loss.backward()
    assert torch.equal(logp.grad[1], torch.zeros(2))  # PPO-clip: no gradient once the ratio passes 1 + eps
    assert float(logp.grad[0].abs().max()) < 1e-4  # ... and a ratio-weighted one (∝ w) as w -> 0
    assert (-respo_g[0] >= OPTS.phi_min * 1.0 / 4 - 1e-7).all()  # ReSPO: at least phi_min A / n per token
    assert (-respo_g[1] > 0).all()


# ---------------------------------------------------------------- options


def test_repo_params_select_qglas_and_respo():
    cfg = resolve.load(PARAMS, ["rl.advantage=qglas"])
    assert cfg.rl.advantage == "qglas" and isinstance(cfg.rl.options_for("qglas"), QGLASOptions)
    cfg = resolve.load(PARAMS, ["rl.advantage=qglas", "rl.loss=respo", "rl.options.qglas.mode=multiplicative"])
    assert cfg.rl.options_for("qglas").mode == "multiplicative" and isinstance(cfg.rl.options_for("respo"), ReSPOOptions)
    defaults = repo_params(PARAMS)["rl"]["options"]
    assert cfg.rl.options_for("respo").model_dump() == defaults["respo"]


@pytest.mark.parametrize(
    "override,message",
    [
        ("rl.options.qglas.gamma_maxx=1", "unknown key 'rl.options.qglas.gamma_maxx' (did you mean 'rl.options.qglas.gamma_max'?)"),
        ("rl.options.respo.phi_mn=0.1", "unknown key 'rl.options.respo.phi_mn' (did you mean 'rl.options.respo.phi_min'?)"),
        ("rl.options.qglas.mode=sideways", "rl.options.qglas.mode: Input should be 'additive' or 'multiplicative'"),
        ("rl.options.respo.a_pos=1.5", "rl.options.respo.a_pos: Input should be less than 1"),
    ],
)
def test_bad_options_are_one_line_user_errors(override, message):
    with pytest.raises(UserError) as err:
        resolve.load(PARAMS, [override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("selected,name", [("rl.advantage=qglas", "qglas"), ("rl.loss=respo", "respo")])
def test_selected_method_without_a_block_runs_on_its_defaults(tmp_path, selected, name):
    raw = repo_params(PARAMS)
    del raw["rl"]["options"][name]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    resolve.load(path)  # not selected: fine
    assert resolve.load(path, [selected]).rl.options_for(name) == {"qglas": QGLASOptions, "respo": ReSPOOptions}[name]()
