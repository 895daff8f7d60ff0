"""The anchors' family (GRPO, Dr. GRPO, RLOO, REINFORCE++, ReMax, GDPO; clip, GSPO, CISPO; aggregations;
presets; dynamic sampling; reward-composition diagnostics) on hand-made tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from helpers import REPO, micro_params
from posttrain.objectives.loss_settings import LossSettings
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.objectives import advantages, aggregations, losses, needs_of
from posttrain.objectives.aggregation import token_sum_norm
from posttrain.objectives.diagnostics import composition_metrics
from posttrain.rewards import rewards
from posttrain.rollout import RolloutBatch
from posttrain.trainers.dynamic_sampling import concat, informative_groups, select_groups

NAN = float("nan")
# the reward-based edge-case checks below apply to estimators that score rewards; witness scores outcomes
# against a target distribution (tests/unit/test_witness.py covers its invariants)
# estimators that need only what make_batch provides (the distillation family's token-level estimators need
# teacher tensors and have their own edge-case tests in test_distill_estimators.py)
ESTIMATORS = [n for n in advantages.names() if set(advantages.entry(n).meta.get("needs", ())) <= {"greedy_rewards"}]


def make_batch(rewards_, group, weights=None, greedy=None, T=3) -> RolloutBatch:
    r = torch.as_tensor(rewards_, dtype=torch.float32)
    r = r[:, None] if r.dim() == 1 else r
    B, K = r.shape
    batch = RolloutBatch(
        prompt_ids=torch.zeros(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
        completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=torch.ones(B, T, dtype=torch.long),
        group=torch.as_tensor(group), old_logp=torch.zeros(B, T), rewards=r, reward_names=tuple(f"r{k}" for k in range(K)),
        reward_weights=torch.ones(K) if weights is None else torch.as_tensor(weights, dtype=torch.float32),
    )
    greedy = torch.zeros(B) if greedy is None else torch.as_tensor(greedy, dtype=torch.float32)
    return batch.with_extras(greedy_rewards=greedy)


CFG = SimpleNamespace(std_scaling="group", std_eps=1e-4, options_for=resolve.load(REPO / "params.yaml").rl.options_for)


def estimate(name, batch, cfg=CFG):
    return advantages.get(name)(batch, cfg)


def per_row(adv):
    """[B] from an estimator's [B] or [B, T] advantages (make_batch's responses all have every token)."""
    return adv[:, 0] if adv.dim() == 2 else adv


# ---------------------------------------------------------------- registries


def test_registered_names_and_needs():
    assert {"grpo", "sum_then_normalize", "gdpo", "dr_grpo", "rloo", "reinforce_pp", "remax"} <= set(advantages.names())
    assert {"clip", "gspo", "cispo"} <= set(losses.names())
    assert {"token_mean", "seq_mean", "token_sum_norm"} <= set(aggregations.names())
    assert advantages.get("sum_then_normalize") is advantages.get("grpo")
    assert needs_of(SimpleNamespace(advantage="remax", loss="clip", beta=0.0)) == {"greedy_rewards"}
    assert needs_of(SimpleNamespace(advantage="gdpo", loss="gspo", beta=0.0)) == frozenset()


# ---------------------------------------------------------------- estimators: hand values


def test_dr_grpo_subtracts_the_group_mean_only():
    adv = estimate("dr_grpo", make_batch([1.0, 0.0, 0.0, 0.0, 2.0, 6.0], [0, 0, 0, 0, 1, 1]))
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, -2.0, 2.0]))


def test_rloo_leave_one_out_baseline():
    rewards_ = torch.tensor([1.0, 0.0, 2.0, 5.0])
    adv = estimate("rloo", make_batch(rewards_, [0, 0, 0, 0]))
    expected = torch.stack([rewards_[i] - torch.cat([rewards_[:i], rewards_[i + 1:]]).mean() for i in range(4)])
    torch.testing.assert_close(adv, expected)  # [1 - 7/3, 0 - 8/3, 2 - 2, 5 - 1]


def reinforce_pp_cfg(whiten: str):
    rl = resolve.updated(resolve.load(REPO / "params.yaml").rl, "rl", options={"reinforce_pp": {"whiten": whiten}})
    return SimpleNamespace(std_scaling="group", std_eps=1e-4, options_for=rl.options_for)


def test_reinforce_pp_group_baseline_then_batch_whitening_per_sequence():
    adv = estimate("reinforce_pp", make_batch([0.0, 2.0, 1.0, 7.0], [0, 0, 1, 1]), reinforce_pp_cfg("sequences"))
    centred = torch.tensor([-1.0, 1.0, -3.0, 3.0])
    torch.testing.assert_close(adv, (centred - centred.mean()) / (centred.std() + 1e-4))


def test_reinforce_pp_whitens_over_response_tokens_by_default():
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage: masked_whiten over the response tokens, so a
    long response weighs more in the batch mean and std than a short one."""
    assert resolve.load(REPO / "params.yaml").rl.options_for("reinforce_pp").whiten == "tokens"
    batch = make_batch([0.0, 2.0, 1.0, 7.0], [0, 0, 1, 1])
    lengths = [1, 3, 3, 1]
    mask = (torch.arange(3)[None, :] < torch.tensor(lengths)[:, None]).long()
    batch = RolloutBatch(**{**batch.__dict__, "completion_mask": mask})
    adv = estimate("reinforce_pp", batch)
    centred = [-1.0, 1.0, -3.0, 3.0]
    tokens = torch.tensor([c for c, n in zip(centred, lengths) for _ in range(n)])  # -1, 1 1 1, -3 -3 -3, 3
    expected = (torch.tensor(centred)[:, None] - tokens.mean()) / (tokens.std() + 1e-4) * mask
    torch.testing.assert_close(adv, expected)
    assert adv.shape == (4, 3) and (adv[mask == 0] == 0).all()
    per_sequence = estimate("reinforce_pp", batch, reinforce_pp_cfg("sequences"))
    assert not torch.allclose(adv[:, 0], per_sequence)  # variable lengths: the two conventions differ
    with pytest.raises(Exception, match="whiten"):
        reinforce_pp_cfg("rows")


def test_remax_baseline_is_the_greedy_reward():
    batch = make_batch([1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1], greedy=[0.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(estimate("remax", batch), torch.tensor([1.0, 1.0, -1.0, 0.0]))
    # equal sampled rewards still learn when the greedy answer differs (ReMax's own definition)
    assert (estimate("remax", make_batch([1.0, 1.0], [0, 0], greedy=[0.0, 0.0])) == 1.0).all()
    with pytest.raises(KeyError, match="greedy_rewards"):
        advantages.get("remax")(RolloutBatch(**{**make_batch([1.0], [0]).__dict__, "extras": {}}), CFG)


def test_gdpo_hand_values():
    r = [[1.0, 0.0], [0.0, 0.0], [1.0, 3.0], [0.0, 1.0]]
    adv = estimate("gdpo", make_batch(r, [0, 0, 1, 1], weights=[1.0, 0.5]))
    # a pair (hi, lo): centred +-|hi - lo| / 2, Bessel std |hi - lo| / sqrt(2)
    s = 0.5 / (1 / math.sqrt(2) + 1e-4)
    a0 = torch.tensor([s, -s, s, -s])
    a1 = torch.tensor([0.0, 0.0, 1 / (math.sqrt(2) + 1e-4), -1 / (math.sqrt(2) + 1e-4)])  # column 1 constant in group 0
    pre = a0 + 0.5 * a1
    torch.testing.assert_close(adv, (pre - pre.mean()) / (pre.std() + 1e-4))


def test_gdpo_constant_reward_contributes_nothing_and_scale_invariance():
    r = torch.tensor([[1.0, 0.3], [0.0, 0.3], [1.0, 0.3], [0.0, 1.0], [1.0, 0.0], [0.5, 2.0]])
    group = [0, 0, 0, 1, 1, 1]
    with_const = estimate("gdpo", make_batch(r, group))
    only_first_in_group0 = estimate("gdpo", make_batch(torch.stack([r[:, 0], torch.cat([torch.zeros(3), r[3:, 1]])], 1), group))
    torch.testing.assert_close(with_const, only_first_in_group0)
    scaled = estimate("gdpo", make_batch(r * torch.tensor([7.0, 0.5]), group))
    torch.testing.assert_close(scaled, with_const, atol=1e-3, rtol=0)
    # GRPO on the sum is not scale invariant
    assert not torch.allclose(estimate("grpo", make_batch(r * torch.tensor([7.0, 0.5]), group)), estimate("grpo", make_batch(r, group)), atol=1e-2)


# ---------------------------------------------------------------- estimators: edge cases


@pytest.mark.parametrize("name", ESTIMATORS)
def test_singleton_groups_give_finite_advantages(name):
    adv = per_row(estimate(name, make_batch([3.0, 1.0, 2.0], [0, 1, 1])))
    assert torch.isfinite(adv).all()
    # remax: vs greedy; batch-whitened ones move the row; verl's gpg and opo give a singleton group baseline 0 (A ~ r)
    if name not in ("remax", "gdpo", "reinforce_pp", "gpg", "opo"):
        assert float(adv[0]) == 0.0
    one = estimate(name, make_batch([3.0], [0]))
    assert torch.isfinite(one).all()


@pytest.mark.parametrize("name", [n for n in ESTIMATORS if n != "remax"])
def test_all_equal_rewards_give_zero_advantage(name):
    adv = per_row(estimate(name, make_batch([1.0, 1.0, 1.0, 0.3, 0.3, 0.3], [0, 0, 0, 1, 1, 1])))
    torch.testing.assert_close(adv, torch.zeros(6), atol=1e-6, rtol=0)
    mixed = per_row(estimate(name, make_batch([1.0, 1.0, 1.0, 0.0, 1.0, 0.5], [0, 0, 0, 1, 1, 1])))
    torch.testing.assert_close(mixed[:3], torch.zeros(3), atol=1e-5, rtol=0)
    assert mixed[3:].abs().max() > 0.1


@pytest.mark.parametrize("name", ESTIMATORS)
def test_nan_rewards_are_sanitised(name):
    r = [[1.0, NAN], [0.0, 1.0], [NAN, NAN], [1.0, 0.0], [0.0, 0.0], [0.5, 1.0]]
    batch = make_batch(r, [0, 0, 0, 1, 1, 1], greedy=[NAN] * 6)
    adv = estimate(name, batch)
    assert torch.isfinite(adv).all()
    assert (adv[2] == 0.0).all(), "an unscorable row gets no advantage"
    assert composition_metrics(batch, adv)["reward/r1_nan"] == 2.0


# ---------------------------------------------------------------- losses


def loss_cfg(low=0.2, high=0.2, agg="token_mean", max_new_tokens=None):
    return LossSettings(clip_eps_low=low, clip_eps_high=high, loss_agg=agg, max_new_tokens=max_new_tokens)


def loss_and_grad(name, offsets, adv, mask, cfg):
    old = -torch.rand(*mask.shape, generator=torch.Generator().manual_seed(0)) - 0.1
    logp = (old + torch.as_tensor(offsets, dtype=torch.float32)).requires_grad_(True)
    loss, metrics = losses.get(name)(logp, old, torch.as_tensor(adv, dtype=torch.float32), mask, cfg)
    loss.backward()
    return loss, logp.grad, metrics, logp.detach()


def test_gspo_sequence_ratio_and_clip():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # row 0: mean log-ratio (0.1 + 0.3) / 2 = 0.2 -> s = e^0.2 > 1 + eps: clipped for A > 0, zero gradient
    # row 1: mean log-ratio 0 -> s = 1: gradient A / |y| per token, then seq_mean's 1/B
    offsets = [[0.1, 0.3, 5.0], [0.2, -0.1, -0.1]]
    loss, grad, metrics, _ = loss_and_grad("gspo", offsets, [1.0, -2.0], mask, loss_cfg(3e-4, 4e-4, "seq_mean"))
    assert torch.equal(grad[0], torch.zeros(3))
    torch.testing.assert_close(grad[1], torch.full((3,), 2.0 / 3 / 2))
    torch.testing.assert_close(loss, -torch.tensor((1 + 4e-4) * 1.0 + 1.0 * -2.0) / 2)
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ratios = torch.tensor([[2.0, 1.0, 0.5], [3.0, 0.9, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    _, grad, metrics, _ = loss_and_grad("cispo", ratios.log(), adv, mask, loss_cfg(high=0.2))
    weight = ratios.clamp(max=1.2)
    torch.testing.assert_close(grad, -(weight * adv[:, None] * mask) / 5)
    assert (grad[mask == 1] != 0).all()
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)


@pytest.mark.parametrize("loss", ["clip", "gspo", "cispo"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "token_sum_norm"])
def test_padded_tokens_get_no_gradient(loss, agg):
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    offsets = torch.randn(3, 4, generator=torch.Generator().manual_seed(2)) * 0.05
    _, grad, _, _ = loss_and_grad(loss, offsets, [1.0, -0.5, 2.0], mask, loss_cfg(agg=agg, max_new_tokens=6))
    assert torch.equal(grad[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert (grad[mask == 1] != 0).all()


def test_token_sum_norm_divides_by_batch_times_max_len():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert token_sum_norm(values, mask, max_len=10).item() == pytest.approx(7 / 20)
    assert token_sum_norm(values, mask).item() == pytest.approx(7 / 6)  # without L_max: the padded width


# ---------------------------------------------------------------- overlong reward, presets


def test_overlong_soft_punishment_eq13():
    fn = rewards.get("overlong")
    out = fn(None, [], [], [], lengths=torch.tensor([2, 4, 5, 6, 7]), max_len=6, overlong_buffer=2)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))


def test_presets_expand_below_explicit_overrides(tmp_path):
    params = micro_params(tmp_path)
    dapo = resolve.load(params, ["rl.preset=dapo"]).rl
    assert (dapo.clip_eps_high, dapo.loss_agg, dapo.dynamic_sampling) == (0.28, "token_mean", True)
    assert [r.name for r in dapo.rewards][-1] == "overlong"
    assert resolve.load(params, ["rl.preset=dapo", "rl.clip_eps_high=0.3"]).rl.clip_eps_high == 0.3
    assert resolve.load(params, ["rl.clip_eps_high=0.3", "rl.preset=dapo"]).rl.clip_eps_high == 0.3
    dr = resolve.load(params, ["rl.preset=dr_grpo"]).rl
    assert (dr.advantage, dr.loss_agg) == ("dr_grpo", "token_sum_norm")
    gspo = resolve.load(params, ["rl.preset=gspo"]).rl
    assert (gspo.loss, gspo.clip_eps_low, gspo.clip_eps_high) == ("gspo", 3e-4, 4e-4)
    assert resolve.load(params).rl.preset is None
    with pytest.raises(UserError, match="rl.preset: unknown preset 'dappo'; did you mean .*'dapo'"):
        resolve.load(params, ["rl.preset=dappo"])


# ---------------------------------------------------------------- dynamic sampling, diagnostics


def test_dynamic_sampling_selects_and_concatenates_groups():
    batch = make_batch([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 1, 1, 2, 2])
    keep = informative_groups(batch)
    assert keep.tolist() == [False, True, False]
    kept = select_groups(batch, keep)
    assert kept.group.tolist() == [0, 0] and kept.rewards[:, 0].tolist() == [0.0, 1.0]
    other = make_batch([0.0, 2.0], [0, 0], T=5)
    other = RolloutBatch(**{**other.__dict__, "prompt_ids": torch.ones(2, 4, dtype=torch.long), "prompt_mask": torch.ones(2, 4, dtype=torch.long)})
    both = concat([kept, other], pad_id=0)
    assert both.group.tolist() == [0, 0, 1, 1]
    assert both.completion_ids.shape == (4, 5) and both.completion_mask[:2, 3:].sum() == 0
    assert both.prompt_ids.shape == (4, 4) and both.prompt_mask[:2].tolist() == [[0, 0, 1, 1]] * 2  # left-padded


def test_dynamic_sampling_keeps_each_rows_prompt_inputs():
    """A policy's per-prompt inputs (rollout/policy.py's Prompts.inputs, e.g. images) ride on the batch as one extra row
    per sample: selecting groups and concatenating batches keeps each row's own."""
    batch = make_batch([1.0, 1.0, 0.0, 1.0, 0.5, 0.0], [0, 0, 1, 1, 2, 2]).with_extras(images=torch.arange(6.0)[:, None].expand(6, 3))
    kept = select_groups(batch, informative_groups(batch))
    assert kept.extras["images"][:, 0].tolist() == [2.0, 3.0, 4.0, 5.0]
    other = make_batch([0.0, 2.0], [0, 0]).with_extras(images=torch.full((2, 3), 9.0))
    assert concat([kept, other], pad_id=0).extras["images"][:, 0].tolist() == [2.0, 3.0, 4.0, 5.0, 9.0, 9.0]


def test_composition_metrics_collapse_and_share():
    r = [[1.0, 0.3], [0.0, 0.3], [1.0, 0.0], [0.0, 1.0]]
    batch = make_batch(r, [0, 0, 1, 1])
    adv = estimate("gdpo", batch)
    m = composition_metrics(batch, adv)
    assert m["reward/r0_collapsed"] == 0.0 and m["reward/r1_collapsed"] == 0.5
    assert m["reward/r0_adv_share"] + m["reward/r1_adv_share"] == pytest.approx(1.0)
    assert m["reward/r0_adv_share"] > m["reward/r1_adv_share"]
    zero = composition_metrics(make_batch([1.0, 1.0], [0, 0]), torch.zeros(2))
    assert zero["reward/r0_adv_share"] == 0.0 and zero["reward/r0_collapsed"] == 1.0


def test_all_fail_groups_and_the_signal_they_still_carry():
    """reward/<k>_all_zero is the share of groups where reward k is 0 on every row (NaN read as 0);
    advantage/<k>_all_zero_abs the mean |A_t| over their valid tokens and _spread the per-row token std of A_t there,
    0 for a sequence-level advantage, the redistribution's size for a token-level one."""
    batch = make_batch([[0.0, 0.5], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [float("nan"), 1.0], [0.0, 0.0]], [0, 0, 1, 1, 2, 2])
    sequence = torch.tensor([0.2, -0.2, 0.5, -0.5, 0.4, -0.4])
    m = composition_metrics(batch, sequence)
    assert m["reward/r0_all_zero"] == pytest.approx(2 / 3) and m["reward/r1_all_zero"] == pytest.approx(1 / 3)
    assert m["advantage/r0_all_zero_abs"] == pytest.approx(0.3) and m["advantage/r0_all_zero_spread"] == 0.0
    tokens = sequence[:, None] + torch.tensor([[-1.0, 0.0, 1.0]] * 6)  # the same rows, redistributed over 3 tokens
    m = composition_metrics(batch, tokens)
    assert m["advantage/r0_all_zero_spread"] == pytest.approx((2 / 3) ** 0.5) and m["advantage/r1_all_zero_abs"] == pytest.approx(5 / 6)
    none = composition_metrics(make_batch([1.0, 0.0], [0, 0]), torch.zeros(2))
    assert none["reward/r0_all_zero"] == 0.0 and none["advantage/r0_all_zero_abs"] == 0.0 and none["advantage/r0_all_zero_spread"] == 0.0
