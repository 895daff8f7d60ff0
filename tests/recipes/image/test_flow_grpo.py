"""Flow-GRPO and GDPO on CrossTimeEdit's image judges: invariants, on hand-made tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from posttrain.objectives import advantages
from posttrain.objectives.flow_grpo import gaussian_kl, sde_step, step_scale
from posttrain.objectives.gdpo import gdpo_on_rewards, per_reward_normalized
from helpers import repo_params

SIGMAS = (0.889, 0.778)


def test_zero_noise_level_gives_the_euler_step():
    x, v = torch.randn(3, 3, 4, 4), torch.randn(3, 3, 4, 4)
    sigma, sigma_prev = SIGMAS
    step = sde_step(x, v, sigma, sigma_prev, noise_level=0.0, sigma_max=0.889)
    torch.testing.assert_close(step.prev, x + v * (sigma_prev - sigma))
    torch.testing.assert_close(step.mean, x + v * (sigma_prev - sigma))
    # and continuously so: a tiny noise level moves the mean by a tiny amount
    small = sde_step(x, v, sigma, sigma_prev, noise_level=1e-4, sigma_max=0.889, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(small.mean, x + v * (sigma_prev - sigma), atol=1e-6, rtol=0)


def test_the_step_is_the_stated_gaussian():
    x, v = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    sigma, sigma_prev, level = 0.6, 0.45, 0.7
    step = sde_step(x, v, sigma, sigma_prev, level, sigma_max=0.9, generator=torch.Generator().manual_seed(1))
    dt = sigma_prev - sigma
    std_t = level * math.sqrt(sigma / (1 - sigma))
    mean = x * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    scale = std_t * math.sqrt(-dt)
    torch.testing.assert_close(step.mean, mean)
    expected = torch.distributions.Normal(mean, scale).log_prob(step.prev).mean(dim=(1, 2, 3))
    torch.testing.assert_close(step.logp, expected)
    assert torch.equal(torch.tensor(step_scale(sigma, sigma_prev, level, 0.9)), step.scale)  # the KL term's variance


def test_sigma_one_uses_sigma_max_and_stays_finite():
    x, v = torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4)
    step = sde_step(x, v, 1.0, 0.9, 0.7, sigma_max=0.9, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(step.prev).all() and torch.isfinite(step.logp).all()
    assert math.isclose(float(step.scale), 0.7 * math.sqrt(1.0 / 0.1) * math.sqrt(0.1), rel_tol=1e-6)


def test_rescoring_the_sampled_step_gives_the_recorded_logp():
    """Ratio = 1 on the first update: the same velocity re-scores the sampled x_prev to the same log-prob."""
    x, v = torch.randn(4, 3, 4, 4), torch.randn(4, 3, 4, 4)
    sampled = sde_step(x, v, *SIGMAS, 0.7, 0.889, generator=torch.Generator().manual_seed(3))
    rescored = sde_step(x, v.clone().requires_grad_(), *SIGMAS, 0.7, 0.889, prev=sampled.prev)
    torch.testing.assert_close(rescored.logp.detach(), sampled.logp)
    assert torch.equal(torch.exp(rescored.logp - sampled.logp).detach(), torch.ones(4))


def test_kl_is_zero_at_equal_velocity_and_positive_otherwise():
    x, v = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    policy = sde_step(x, v.clone().requires_grad_(), *SIGMAS, 0.7, 0.889, prev=torch.zeros_like(x))
    same = sde_step(x, v, *SIGMAS, 0.7, 0.889, prev=torch.zeros_like(x))
    kl = gaussian_kl(policy.mean, same.mean.detach(), policy.scale)
    assert torch.equal(kl.detach(), torch.zeros(2))
    (grad,) = torch.autograd.grad(kl.sum(), policy.mean)
    assert torch.equal(grad, torch.zeros_like(grad))  # no pull at equality
    other = sde_step(x, v + 0.1, *SIGMAS, 0.7, 0.889, prev=torch.zeros_like(x))
    assert (gaussian_kl(policy.mean, other.mean.detach(), policy.scale) > 0).all()


def test_reference_carrying_gradient_is_refused():
    mean = torch.zeros(1, 3, 2, 2, requires_grad=True)
    with pytest.raises(ValueError, match="gradient"):
        gaussian_kl(mean, mean * 2, torch.tensor(0.5))


def cfg(**over):
    base = dict(advantage="gdpo", std_scaling="group", std_eps=1e-4, adv_clip_max=5.0)
    return SimpleNamespace(**{**base, **over})


def image_advantages(rewards, group, weights, settings):
    """The estimator's reward-matrix core, as the core step runs it on the judges' [B, K] matrix (the clip to
    +-adv_clip_max is the step's: tests/recipes/image/test_flow_policy.py)."""
    return advantages.entry(settings.advantage).meta["on_rewards"](rewards, group, weights, settings)


def test_per_prompt_advantages_are_zero_mean():
    torch.manual_seed(0)
    group = torch.arange(4).repeat_interleave(8)
    rewards = torch.rand(32, 1)
    adv = image_advantages(rewards, group, torch.ones(1), cfg(advantage="grpo"))
    for g in range(4):
        assert abs(float(adv[group == g].mean())) < 1e-5


def judge_scores(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(24, 3, generator=g), torch.arange(3).repeat_interleave(8)


def test_gdpo_rescaling_one_judge_changes_nothing():
    rewards, group = judge_scores()
    rescaled = rewards * torch.tensor([10.0, 1.0, 1.0])  # IA on a 0-10 scale, the others on 0-1
    exact = cfg(std_eps=1e-9)  # the invariance is exact up to the eps added to each std
    torch.testing.assert_close(gdpo_on_rewards(rescaled, group, torch.ones(3), exact), gdpo_on_rewards(rewards, group, torch.ones(3), exact))
    # with the default eps = 1e-4 it holds to about eps / std
    default = gdpo_on_rewards(rewards, group, torch.ones(3), cfg())
    torch.testing.assert_close(gdpo_on_rewards(rescaled, group, torch.ones(3), cfg()), default, atol=2e-3, rtol=0)


def test_gdpo_a_constant_criterion_contributes_nothing():
    rewards, group = judge_scores(1)
    with_constant = rewards.clone()
    with_constant[:, 1] = 1.0  # BP = 1 everywhere
    without = gdpo_on_rewards(rewards[:, [0, 2]], group, torch.ones(2), cfg())
    torch.testing.assert_close(gdpo_on_rewards(with_constant, group, torch.ones(3), cfg()), without)
    # the same holds within one group only: that group's advantages ignore the constant column
    partly = rewards.clone()
    partly[group == 0, 1] = 0.25
    normalized = per_reward_normalized(partly, group, 1e-4)
    assert torch.equal(normalized[group == 0, 1], torch.zeros(8))


def test_gdpo_differs_from_sum_then_normalize_on_judges():
    """Two judge vectors with the same sum but different composition get different GDPO advantages."""
    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.5, 0.5, 0.5], [0.2, 0.2, 0.5]])
    group = torch.zeros(4, dtype=torch.long)
    summed = image_advantages(rewards, group, torch.ones(3), cfg(advantage="sum_then_normalize"))
    split = image_advantages(rewards, group, torch.ones(3), cfg(advantage="gdpo"))
    assert torch.isclose(summed[0], summed[1]) and torch.isclose(summed[1], summed[2])
    assert not torch.allclose(split, summed)


def test_only_reward_matrix_estimators_are_accepted_for_images(tmp_path):
    from helpers import REPO
    from posttrain import resolve
    from posttrain.errors import UserError

    assert resolve.load(REPO / "params.yaml").flow_rl.advantage == "gdpo"
    with pytest.raises(UserError, match="flow_rl.advantage.*needs token-level rollouts.*gdpo"):
        resolve.load(REPO / "params.yaml", ["flow_rl.advantage=remax"])
    assert resolve.load(REPO / "params.yaml", ["flow_rl.advantage=sum_then_normalize"]).flow_rl.advantage == "sum_then_normalize"


def test_inner_epochs_move_the_ratio_off_one_and_the_clip_binds():
    """Flow-GRPO's num_inner_epochs (the core step's epochs_per_batch): the first pass over a sampled batch is
    on-policy (ratio exactly 1 against the sampling log-probs: the step's mismatch figures); the later passes re-score
    the same transitions under the updated model, so the ratio leaves 1 and the clip (Flow-GRPO's clip_range 1e-4)
    zeroes part of the gradient (the loss figures are the last pass's)."""

    from posttrain.recipes.image.settings import FlowModelConfig, FlowRLConfig
    from posttrain.recipes.image.vigor.edits import Edits
    from posttrain.recipes.image.flow import build_flow_model
    from posttrain.recipes.image.grpo import train_flow_rl

    params = repo_params()
    assert params["flow_rl"]["epochs_per_batch"] == 1
    model_cfg = FlowModelConfig.model_validate({**params["flow"], "block_channels": [8, 16], "text_dim": 16})
    cfg = FlowRLConfig.model_validate({**params["flow_rl"], "steps": 1, "prompts_per_step": 2, "group_size": 2, "sampling_steps": 3,
                                       "checkpoint_every": 0, "lr": 1e-3, "epochs_per_batch": 2})
    g = torch.Generator().manual_seed(0)
    images = torch.rand(3, 4, 3, 8, 8, generator=g) * 2 - 1
    mask = torch.zeros(3, 1, 8, 8)
    mask[..., :3] = 1
    edits = Edits(images[:, 0], images[:, 1], images[:, 1:].reshape(3, 9, 8, 8), mask, ("remove the tree",) * 3, ("vegetation",) * 3)
    torch.manual_seed(0)
    history = train_flow_rl(build_flow_model(model_cfg, 8), edits, cfg, seed=0, on_log=lambda s, m: None)
    row = history[0]
    assert row["mismatch/max_ratio"] == 1.0 and row["mismatch/min_ratio"] == 1.0 and row["mismatch/k3"] == 0.0
    assert abs(row["ratio_mean"] - 1.0) > 1e-4  # further than the clip range: the policy moved
    assert row["clip_fraction"] > 0
