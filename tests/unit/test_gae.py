"""GAE and the clipped value loss (objectives/gae.py, objectives/value_loss.py) against a direct transcription of
verl's `compute_gae_advantage_return` / `compute_value_loss` (verl 0.9.1, trainer/ppo/core_algos.py, with
utils/torch_functional.py's masked_whiten and clip_by_value) on identical tensors, and the spec's invariants.
verl itself is not a dependency: it pulls ray, tensordict and more, so the reference is transcribed here."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import Section
from posttrain.objectives.gae import GAEOptions, gae, gae_advantages_returns, gae_returns, last_token_rewards, masked_whiten
from posttrain.objectives.value_loss import CriticOutputs, ValueLossOptions, clipped_value_loss, explained_variance, value_loss
from posttrain.rollout import RolloutBatch


# --- verl 0.9.1, transcribed ---------------------------------------------------------------------------------

def verl_masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def verl_masked_whiten(values, mask):
    mean = verl_masked_mean(values, mask)
    var = verl_masked_mean((values - mean) ** 2, mask)
    var = var * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    nextvalues, lastgaelam, reversed_ = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        reversed_.append(lastgaelam)
    advantages = torch.stack(reversed_[::-1], dim=1)
    returns = advantages + values
    return verl_masked_whiten(advantages, response_mask), returns


def verl_value_loss(vpreds, returns, values, response_mask, cliprange_value):  # loss_agg_mode token-mean
    vpredclipped = torch.max(torch.min(vpreds, values + cliprange_value), values - cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_loss = 0.5 * verl_masked_mean(torch.max(vf_losses1, vf_losses2), response_mask)
    return vf_loss, verl_masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)


# --- fixtures ------------------------------------------------------------------------------------------------

class Cfg(Section):
    loss_agg: str = "token_mean"
    max_new_tokens: int = 8
    options: dict = {}


def cfg(gamma=1.0, lam=0.95, whiten=True, clip=0.2) -> Cfg:
    return Cfg(options={"gae": GAEOptions(gamma=gamma, lam=lam, whiten=whiten), "value": ValueLossOptions(clip=clip)})


def episode_masks() -> tuple[torch.Tensor, torch.Tensor]:
    """Four rows of width 8: single-turn lengths 8 and 3, and two multi-turn episodes (observations = 0, attended)."""
    mask = torch.tensor([
        [1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 1, 0],  # policy, policy, obs, obs, policy x3, padding
        [1, 0, 0, 1, 0, 1, 1, 1],
    ], dtype=torch.float64)
    attention = torch.tensor([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0], [1] * 8], dtype=torch.float64)
    return mask, attention


def make_batch(values: torch.Tensor, reward: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor) -> RolloutBatch:
    b, t = mask.shape
    return RolloutBatch(
        prompt_ids=torch.zeros(b, 1, dtype=torch.long), prompt_mask=torch.ones(b, 1, dtype=torch.long),
        completion_ids=torch.zeros(b, t, dtype=torch.long), completion_mask=mask.long(), attention_mask=attention.long(),
        group=torch.zeros(b, dtype=torch.long), old_logp=torch.zeros(b, t), rewards=reward[:, None],
        reward_names=("correctness",), reward_weights=torch.ones(1, dtype=reward.dtype), extras={"values": values},
    )


# --- against verl ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_verl_on_identical_tensors(gamma, lam):
    g = torch.Generator().manual_seed(0)
    mask, attention = episode_masks()
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64) * mask  # the provider zeroes V off the loss mask
    reward = torch.randn(mask.shape[0], generator=g, dtype=torch.float64)
    token_rewards = last_token_rewards(reward, mask)
    ours_adv = gae(make_batch(values, reward, mask, attention), cfg(gamma, lam))
    ours_ret = gae_returns(make_batch(values, reward, mask, attention), cfg(gamma, lam))
    verl_adv, verl_ret = verl_gae(token_rewards, values, mask, gamma, lam)
    on = mask.bool()  # off the loss mask verl carries values that every loss masks out; ours are 0 there
    assert torch.allclose(ours_adv[on], verl_adv[on], atol=1e-6, rtol=0)
    assert torch.allclose(ours_ret[on], verl_ret[on], atol=1e-6, rtol=0)
    assert (ours_adv[~on] == 0).all() and (ours_ret[~on] == 0).all()


def test_value_loss_matches_verl_on_identical_tensors():
    g = torch.Generator().manual_seed(1)
    mask, _ = episode_masks()
    old = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    returns = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    vpred = old + 0.5 * torch.randn(mask.shape, generator=g, dtype=torch.float64)  # some beyond the clip range
    ours, ours_frac = clipped_value_loss(vpred, returns, old, mask, 0.2, cfg())
    theirs, their_frac = verl_value_loss(vpred, returns, old, mask, 0.2)
    assert abs(float(ours - theirs)) < 1e-6 and abs(float(ours_frac - their_frac)) < 1e-6
    assert 0 < float(ours_frac) < 1  # both branches of the max were taken


# --- invariants ------------------------------------------------------------------------------------------------

def test_gamma_lambda_one_gives_the_return_minus_the_first_value():
    g = torch.Generator().manual_seed(2)
    mask, attention = episode_masks()
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64) * mask
    reward = torch.randn(mask.shape[0], generator=g, dtype=torch.float64)
    rewards = last_token_rewards(reward, mask)
    adv, returns = gae_advantages_returns(rewards, values, mask, 1.0, 1.0)
    first = mask.argmax(dim=1)
    rows = torch.arange(mask.shape[0])
    assert torch.allclose(adv[rows, first], reward - values[rows, first], atol=1e-12)
    # every policy token's return is the whole (undiscounted) reward, the TD errors telescope
    assert torch.allclose(returns[mask.bool()], reward[:, None].expand_as(mask)[mask.bool()], atol=1e-12)


def test_observation_tokens_are_skipped_as_if_absent():
    g = torch.Generator().manual_seed(3)
    mask, _ = episode_masks()
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64) * mask
    reward = torch.randn(mask.shape[0], generator=g, dtype=torch.float64)
    adv, ret = gae_advantages_returns(last_token_rewards(reward, mask), values, mask, 0.9, 0.7)
    for i in range(mask.shape[0]):
        keep = mask[i].bool()  # the same episode with its observations cut out
        v, m = values[i, keep][None], torch.ones(1, int(keep.sum()), dtype=torch.float64)
        a2, r2 = gae_advantages_returns(last_token_rewards(reward[i : i + 1], m), v, m, 0.9, 0.7)
        assert torch.allclose(adv[i, keep], a2[0]) and torch.allclose(ret[i, keep], r2[0])


def test_reward_sits_on_the_last_policy_token_only():
    mask, _ = episode_masks()
    out = last_token_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), mask)
    assert out.sum(1).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert [int(row.nonzero()) for row in out] == [7, 2, 6, 7]
    assert last_token_rewards(torch.ones(1), torch.zeros(1, 3)).abs().sum() == 0  # no policy token: no reward


def test_whitening_gives_zero_mean_unit_variance_on_policy_tokens():
    mask, _ = episode_masks()
    x = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    w = masked_whiten(x, mask)[mask.bool()]
    assert abs(float(w.mean())) < 1e-9 and abs(float(w.var()) - 1) < 1e-6


def test_value_loss_is_zero_at_the_returns_and_positive_elsewhere():
    g = torch.Generator().manual_seed(5)
    mask, attention = episode_masks()
    reward = torch.randn(4, generator=g, dtype=torch.float64)
    # gamma = lam = 1: R_t = the reward; old values within the clip range of it, so V = R is reachable by clipping
    values = (reward[:, None] + 0.15 * (2 * torch.rand(mask.shape, generator=g, dtype=torch.float64) - 1)) * mask
    batch, c = make_batch(values, reward, mask, attention), cfg(gamma=1.0, lam=1.0)
    returns = gae_returns(batch, c)
    at_returns, m = value_loss(batch, CriticOutputs(logp=None, values=returns.clone().requires_grad_(True)), c)
    assert float(at_returns.detach()) == 0.0
    off, _ = value_loss(batch, CriticOutputs(logp=None, values=(returns + 0.1).requires_grad_(True)), c)
    assert float(off.detach()) > 0 and set(m) >= {"value/loss", "value/clipfrac", "value/explained_variance"}
    # beyond the clip range the pessimistic max keeps the clipped error: V = R is not free there (PPO's rule)
    far = make_batch(values - 1.0 * mask, reward, mask, attention)
    assert float(value_loss(far, CriticOutputs(logp=None, values=gae_returns(far, c)), c)[0]) > 0


def test_explained_variance_is_one_for_a_perfect_critic_and_zero_for_the_mean():
    mask = torch.ones(2, 3)
    returns = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(returns, torch.full_like(returns, 3.5), mask) == pytest.approx(0.0)


def test_the_value_loss_refuses_old_values_with_gradient():
    mask, attention = episode_masks()
    values = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    batch = make_batch(values, torch.ones(4, dtype=torch.float64), mask, attention)
    with pytest.raises(AssertionError, match="must not carry gradient"):
        value_loss(batch, CriticOutputs(logp=None, values=torch.zeros(mask.shape, dtype=torch.float64)), cfg())
