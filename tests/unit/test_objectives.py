"""GRPO parts against their invariants (docs/objectives.md), on hand-computed tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import advantages, aggregations, losses, needs_of
from posttrain.objectives.aggregation import seq_mean, token_mean
from posttrain.objectives.grpo import grpo, group_normalize, group_stats
from posttrain.objectives.kl import k3_kl
from posttrain.objectives.policy_losses import clipped_surrogate
from posttrain.rollout import RolloutBatch


def make_batch(rewards, group, weights=None, T: int = 3) -> RolloutBatch:
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() == 1:
        rewards = rewards[:, None]
    B, K = rewards.shape
    weights = torch.ones(K) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=torch.zeros(B, 2, dtype=torch.long),
        prompt_mask=torch.ones(B, 2, dtype=torch.long),
        completion_ids=torch.zeros(B, T, dtype=torch.long),
        completion_mask=torch.ones(B, T, dtype=torch.long),
        group=torch.as_tensor(group),
        old_logp=torch.zeros(B, T),
        rewards=rewards,
        reward_names=tuple(f"r{k}" for k in range(K)),
        reward_weights=weights,
    )


def adv_cfg(std_scaling="group", std_eps=1e-4):
    return SimpleNamespace(std_scaling=std_scaling, std_eps=std_eps)


def loss_cfg(low=0.2, high=0.2, agg="token_mean"):
    return LossSettings(clip_eps_low=low, clip_eps_high=high, loss_agg=agg)


# ---------------------------------------------------------------- advantages


def test_group_stats_hand_values():
    values = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1])
    mean, std = group_stats(values, group)
    torch.testing.assert_close(mean, torch.tensor([0.25] * 4 + [3.0] * 2))
    # Bessel: group 0 -> sqrt(0.75 / 3) = 0.5; group 1 -> sqrt(2 / 1)
    torch.testing.assert_close(std, torch.tensor([0.5] * 4 + [math.sqrt(2.0)] * 2))


def test_group_normalize_hand_values():
    values = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = group_normalize(values, torch.zeros(4, dtype=torch.long), "group", eps=1e-4)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-4)
    torch.testing.assert_close(adv, expected)


def test_advantages_sum_to_zero_and_unit_std_per_group():
    torch.manual_seed(0)
    G, n_groups = 8, 5
    rewards = torch.randn(G * n_groups)
    group = torch.arange(n_groups).repeat_interleave(G)
    adv = grpo(make_batch(rewards, group), adv_cfg(std_eps=1e-6))
    for g in range(n_groups):
        a = adv[group == g]
        assert abs(float(a.sum())) < 1e-5
        assert abs(float(a.std()) - 1.0) < 1e-4  # torch.std is Bessel-corrected, as is the estimator
        assert not torch.allclose(a, torch.zeros_like(a))


def test_binary_rewards_unit_std():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    adv = grpo(make_batch(rewards, torch.zeros(8, dtype=torch.long)), adv_cfg(std_eps=1e-6))
    assert abs(float(adv.sum())) < 1e-6
    assert abs(float(adv.std()) - 1.0) < 1e-4
    assert (adv[rewards == 1] > 0).all() and (adv[rewards == 0] < 0).all()


def test_all_equal_rewards_give_zero_advantage():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.3, 0.3, 0.3, 0.0, 1.0, 0.5])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    for scaling in ("group", "batch", "none"):
        adv = grpo(make_batch(rewards, group), adv_cfg(scaling))
        assert torch.equal(adv[:6], torch.zeros(6)), scaling
        assert not torch.equal(adv[6:], torch.zeros(3)), scaling


def test_singleton_group_has_zero_advantage():
    adv = group_normalize(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert float(adv[0]) == 0.0
    assert float(adv[1]) < 0 < float(adv[2])


def test_group_ids_need_not_be_contiguous_or_sorted():
    rewards = torch.tensor([1.0, 5.0, 0.0, 2.0, 7.0, 3.0])
    group = torch.tensor([42, 7, 42, 7, 1000, 1000])
    adv = grpo(make_batch(rewards, group), adv_cfg())
    for g in (42, 7, 1000):
        rows = group == g
        torch.testing.assert_close(adv[rows], group_normalize(rewards[rows], torch.zeros(2, dtype=torch.long)))
    # each pair is (hi, lo) or (lo, hi) with Bessel std |a - b| / sqrt(2): A = ±(1/sqrt 2) / (1 + eps / std)
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(adv, torch.tensor([s, s, -s, -s, s, -s]), atol=1e-3, rtol=0)


def test_std_scaling_batch_hand_values():
    rewards = torch.tensor([0.0, 2.0, 2.0, 4.0])
    group = torch.tensor([0, 0, 1, 1])
    adv = grpo(make_batch(rewards, group), adv_cfg("batch", 1e-4))
    # group means 1, 3 -> centred [-1, 1, -1, 1]; batch Bessel std = sqrt((4 + 0 + 0 + 4) / 3)
    expected = torch.tensor([-1.0, 1.0, -1.0, 1.0]) / (math.sqrt(8 / 3) + 1e-4)
    torch.testing.assert_close(adv, expected)


def test_std_scaling_none_hand_values():
    rewards = torch.tensor([0.0, 2.0, 5.0, 3.0, 3.0, 0.0])
    group = torch.tensor([0, 0, 1, 1, 1, 0])
    adv = grpo(make_batch(rewards, group), adv_cfg("none"))
    # group 0: rows 0,1,5 mean 2/3; group 1: rows 2,3,4 mean 11/3
    expected = torch.tensor([-2 / 3, 4 / 3, 5 - 11 / 3, 3 - 11 / 3, 3 - 11 / 3, -2 / 3])
    torch.testing.assert_close(adv, expected)


def test_weighted_sum_of_reward_columns():
    rewards = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
    adv = grpo(make_batch(rewards, [0, 0, 0, 0], weights=[1.0, 0.1]), adv_cfg("none"))
    # r = [1.1, 0.1, 0.0, 1.0], mean 0.55
    torch.testing.assert_close(adv, torch.tensor([0.55, -0.45, -0.55, 0.45]))
    unweighted = grpo(make_batch(rewards, [0, 0, 0, 0], weights=[1.0, 1.0]), adv_cfg("none"))
    torch.testing.assert_close(unweighted, torch.tensor([1.0, 0.0, -1.0, 0.0]))


def test_grpo_is_registered_with_no_needs():
    entry = advantages.entry("grpo")
    assert entry.obj is grpo
    assert tuple(entry.meta.get("needs", ())) == ()


# ---------------------------------------------------------------- k3 KL


def test_k3_nonnegative_and_zero_at_equality():
    torch.manual_seed(1)
    logp = -torch.rand(4, 7) * 5
    ref = -torch.rand(4, 7) * 5
    kl = k3_kl(logp, ref)
    assert (kl >= 0).all()
    assert (kl[logp != ref] > 0).all()
    assert torch.equal(k3_kl(logp, logp.clone()), torch.zeros(4, 7))


def test_k3_hand_value():
    # d = ref - logp = ln 2 -> 2 - ln 2 - 1
    kl = k3_kl(torch.tensor([-math.log(4.0)]), torch.tensor([-math.log(2.0)]))
    torch.testing.assert_close(kl, torch.tensor([1.0 - math.log(2.0)]))


def test_k3_gradient_is_zero_at_equality():
    ref = -torch.rand(3, 5)
    logp = ref.clone().requires_grad_(True)
    k3_kl(logp, ref).sum().backward()
    assert torch.equal(logp.grad, torch.zeros(3, 5))
    # and it is not zero away from equality (d/dlogp = 1 - exp(ref - logp))
    logp2 = (ref + 0.5).requires_grad_(True)
    k3_kl(logp2, ref).sum().backward()
    torch.testing.assert_close(logp2.grad, torch.full((3, 5), 1 - math.exp(-0.5)))


def test_k3_rejects_reference_with_gradient():
    ref = torch.zeros(2, 3, requires_grad=True)
    with pytest.raises(AssertionError, match="reference"):
        k3_kl(torch.zeros(2, 3), ref)


# ---------------------------------------------------------------- clipped surrogate


def surrogate_grad(logp_offset, advantages, mask, cfg):
    """Gradient of the loss wrt logp where logp = old_logp + logp_offset (so ratio = exp(offset))."""
    old = -torch.rand(*mask.shape, generator=torch.Generator().manual_seed(3)) - 0.1
    logp = (old + torch.as_tensor(logp_offset, dtype=torch.float32)).requires_grad_(True)
    loss, metrics = clipped_surrogate(logp, old, torch.as_tensor(advantages, dtype=torch.float32), mask, cfg)
    loss.backward()
    return loss, logp.grad, metrics


def test_ratio_one_gives_reinforce_gradient_token_mean():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
    adv = torch.tensor([1.5, -0.5, 2.0])
    old = -torch.rand(3, 4)
    logp = old.clone().requires_grad_(True)  # ratio == 1 exactly, old_logp detached
    loss, metrics = clipped_surrogate(logp, old, adv, mask, loss_cfg())
    loss.backward()
    n = 6.0
    expected = -adv[:, None] * mask / n
    torch.testing.assert_close(logp.grad, expected)
    torch.testing.assert_close(loss, -(adv[:, None] * mask).sum() / n)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def test_ratio_one_gives_reinforce_gradient_seq_mean():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.5, -0.5])
    _, grad, _ = surrogate_grad(torch.zeros(2, 4), adv, mask, loss_cfg(agg="seq_mean"))
    lengths = torch.tensor([3.0, 1.0])
    expected = -adv[:, None] * mask / (2 * lengths[:, None])
    torch.testing.assert_close(grad, expected)


def test_positive_advantage_above_upper_clip_has_zero_gradient():
    mask = torch.ones(1, 2)
    _, grad, metrics = surrogate_grad([[math.log(1.5), 0.0]], [2.0], mask, loss_cfg(0.2, 0.28))
    assert grad[0, 0].item() == 0.0  # exactly zero, not just small
    assert grad[0, 1].item() == pytest.approx(-2.0 / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)


def test_negative_advantage_below_lower_clip_has_zero_gradient():
    mask = torch.ones(1, 2)
    _, grad, _ = surrogate_grad([[math.log(0.5), 0.0]], [-1.0], mask, loss_cfg(0.2, 0.2))
    assert grad[0, 0].item() == 0.0
    assert grad[0, 1].item() == pytest.approx(1.0 / 2)


def test_positive_advantage_below_lower_clip_keeps_gradient():
    # the min picks the unclipped branch: d(-rho A)/dlogp = -rho A (over 1 token)
    _, grad, metrics = surrogate_grad([[math.log(0.5)]], [2.0], torch.ones(1, 1), loss_cfg())
    assert grad[0, 0].item() == pytest.approx(-0.5 * 2.0)
    assert metrics["clip_fraction"] == 0.0


def test_negative_advantage_above_upper_clip_keeps_gradient():
    _, grad, metrics = surrogate_grad([[math.log(1.5)]], [-2.0], torch.ones(1, 1), loss_cfg())
    assert grad[0, 0].item() == pytest.approx(1.5 * 2.0)
    assert metrics["clip_fraction"] == 0.0


def test_decoupled_clip_bounds():
    # ratio 1.25 is inside [0.8, 1.28] (clip-higher) but outside [0.8, 1.2]
    offset = [[math.log(1.25)]]
    _, grad_wide, _ = surrogate_grad(offset, [1.0], torch.ones(1, 1), loss_cfg(0.2, 0.28))
    _, grad_tight, _ = surrogate_grad(offset, [1.0], torch.ones(1, 1), loss_cfg(0.2, 0.2))
    assert grad_wide[0, 0].item() == pytest.approx(-1.25)
    assert grad_tight[0, 0].item() == 0.0


def test_clip_fraction_and_loss_hand_case():
    # rows: A=+1 with ratios [1.5, 1.0, 0.5, (masked 3.0)], A=-1 with ratios [0.5, 1.5, (masked 0.1), (masked)]
    ratios = torch.tensor([[1.5, 1.0, 0.5, 3.0], [0.5, 1.5, 0.1, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    loss, grad, metrics = surrogate_grad(ratios.log(), [1.0, -1.0], mask, loss_cfg())
    # binding: (0,0) A>0 rho>1.2 ; (1,0) A<0 rho<0.8 -> 2 of 5 valid tokens
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 1.0 + 0.5 + 0.5 + 1.5) / 5)
    # surrogates: 1.2, 1.0, 0.5, -0.8, -1.5
    assert loss.item() == pytest.approx(-(1.2 + 1.0 + 0.5 - 0.8 - 1.5) / 5)
    expected = torch.tensor([[0.0, -1.0, -0.5, 0.0], [0.0, 1.5, 0.0, 0.0]]) / 5
    torch.testing.assert_close(grad, expected)


def test_masked_tokens_get_zero_gradient():
    torch.manual_seed(4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    for agg in ("token_mean", "seq_mean"):
        _, grad, _ = surrogate_grad(torch.randn(3, 4) * 0.1, torch.randn(3), mask, loss_cfg(agg=agg))
        assert torch.equal(grad[mask == 0], torch.zeros(int((mask == 0).sum())))
        assert (grad[mask == 1] != 0).all()


def test_per_token_advantages():
    mask = torch.ones(2, 2)
    adv = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    _, grad, _ = surrogate_grad(torch.zeros(2, 2), adv, mask, loss_cfg())
    torch.testing.assert_close(grad, -adv / 4)


def test_clip_is_registered():
    assert losses.get("clip") is clipped_surrogate


# ---------------------------------------------------------------- aggregation


def test_token_mean_and_seq_mean_on_ragged_mask():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    assert token_mean(values, mask).item() == pytest.approx((1 + 2 + 4 + 7 + 8 + 9) / 6)
    assert seq_mean(values, mask).item() == pytest.approx((1.5 + 4.0 + 8.0) / 3)
    assert aggregations.get("token_mean") is token_mean and aggregations.get("seq_mean") is seq_mean


def test_aggregation_gradients_hand_values():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    v = torch.zeros(2, 3, requires_grad=True)
    token_mean(v, mask).backward()
    torch.testing.assert_close(v.grad, mask.float() / 3)
    v = torch.zeros(2, 3, requires_grad=True)
    seq_mean(v, mask).backward()
    torch.testing.assert_close(v.grad, torch.tensor([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]))


def test_aggregation_ignores_values_under_the_mask():
    values = torch.tensor([[1.0, 1e6], [2.0, -1e6]])
    mask = torch.tensor([[1, 0], [1, 0]])
    assert token_mean(values, mask).item() == pytest.approx(1.5)
    assert seq_mean(values, mask).item() == pytest.approx(1.5)


# ---------------------------------------------------------------- needs


def test_needs_of_includes_ref_logp_iff_beta_positive():
    base = dict(advantage="grpo", loss="clip")
    assert "ref_logp" not in needs_of(SimpleNamespace(**base, beta=0.0))
    assert "ref_logp" in needs_of(SimpleNamespace(**base, beta=0.04))
    assert needs_of(SimpleNamespace(**base, beta=0.0)) == frozenset()
