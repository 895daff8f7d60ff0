"""VLM-Safe-RL (specs §16): the invariants of PPO-Lagrangian with the VLM terms over hand-computed tensors, the
driving environment's costs and frames, and the frozen image-text encoder (built tiny from a config, saved and
loaded by path as a real CLIP checkpoint is)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posttrain.envs.driving import CAR_LENGTH, DrivingEnv, vocabulary
from posttrain.objectives.ppo_lagrangian import (LagrangeMultiplier, episode_cost, lagrangian_advantage, ppo_lagrangian_loss,
                                                 safety_score, shaped_reward, violation)

ENV = SimpleNamespace(lanes=3, cars=3, horizon=6, image_size=16, speed_min=0.2, speed_max=1.0, speed_step=0.1, steer_step=0.25,
                      traffic_speed=(0.2, 0.5), danger_ttc=4.0, edge_margin=0.15)


# -- the multiplier -----------------------------------------------------------------------------------------------
def test_lambda_stays_nonnegative_and_rises_exactly_on_a_positive_violation():
    rng = random.Random(0)
    for _ in range(2000):
        lam0 = rng.choice([0.0, rng.uniform(0, 3)])
        args = dict(cost=rng.uniform(0, 3), limit=rng.uniform(0, 3), risk=rng.uniform(-2, 2), risk_threshold=rng.uniform(-1, 1),
                    kappa=rng.choice([0.0, rng.uniform(0, 1)]))
        m = LagrangeMultiplier(lam0, rng.uniform(0.001, 0.5))
        lam1 = m.update(**args)
        v = violation(**args)
        assert lam1 >= 0.0
        assert (lam1 > lam0) == (v > 0), (lam0, lam1, v)


def test_augmented_update_by_hand_and_kappa_zero_is_the_plain_update():
    m = LagrangeMultiplier(0.5, 0.1)
    assert m.update(cost=1.5, limit=1.0, risk=0.3, risk_threshold=0.1, kappa=0.5) == pytest.approx(0.5 + 0.1 * (0.5 + 0.5 * 0.2))
    plain, augmented = LagrangeMultiplier(0.5, 0.1), LagrangeMultiplier(0.5, 0.1)
    assert augmented.update(1.2, 1.0, risk=1.7, risk_threshold=-0.4, kappa=0.0) == plain.update(1.2, 1.0)
    assert LagrangeMultiplier(0.01, 0.1).update(0.0, 1.0) == 0.0  # projected onto lambda >= 0


def test_lambda_decays_to_zero_when_the_cost_stays_below_the_limit_with_kappa_zero():
    m, rng = LagrangeMultiplier(2.0, 0.05), random.Random(1)
    values = [m.update(cost=0.6, limit=1.0, risk=rng.uniform(-2, 2), risk_threshold=0.0, kappa=0.0) for _ in range(200)]
    assert all(b <= a for a, b in zip(values, values[1:])) and values[-1] == 0.0
    m.load_state_dict({"value": 0.7})
    assert m.state_dict() == {"value": 0.7}


# -- the VLM terms ------------------------------------------------------------------------------------------------
def test_safety_score_is_the_cosine_difference_in_minus_two_to_two():
    safe, danger = torch.tensor([1.0, 0.0]), torch.tensor([-2.0, 0.0])
    images = torch.tensor([[3.0, 0.0], [-1.0, 0.0], [0.0, 5.0], [1.0, 1.0]])
    assert torch.allclose(safety_score(images, safe, danger), torch.tensor([2.0, -2.0, 0.0, 2 ** 0.5]))
    rand = safety_score(torch.randn(500, 8), torch.randn(8), torch.randn(8))
    assert bool((rand >= -2).all() and (rand <= 2).all()) and float(rand.std()) > 0
    with pytest.raises(AssertionError, match="must not carry gradient"):
        safety_score(torch.randn(3, 8, requires_grad=True), torch.randn(8), torch.randn(8))


def test_alpha_zero_leaves_the_reward_unshaped():
    r, s = torch.rand(4, 5), torch.rand(4, 5) * 4 - 2
    assert shaped_reward(r, s, 0.0) is r
    assert torch.allclose(shaped_reward(r, s, 0.1), r + 0.1 * s)


def test_progress_normalised_cost_by_hand():
    costs = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    progress = torch.tensor([0.5, 1.0, 0.05])
    assert torch.allclose(episode_cost(costs, progress, "progress", 0.1), torch.tensor([4.0, 0.0, 10.0]))
    assert torch.allclose(episode_cost(costs, progress, "episodic", 0.1), torch.tensor([2.0, 0.0, 1.0]))


def test_actor_gradient_follows_the_lagrangian_advantage():
    """At ratio 1 the clipped surrogate's gradient in logp_i is -A_i / n, A = (A_R - lambda A_C) / (1 + lambda)."""
    a_r, a_c = torch.tensor([1.0, -0.5, 2.0, 0.0]), torch.tensor([0.5, 1.0, -1.0, 2.0])
    assert torch.allclose(lagrangian_advantage(a_r, a_c, 0.0), a_r)
    for lam in (0.0, 1.0, 3.0):
        logp = torch.log(torch.tensor([0.2, 0.5, 0.3, 0.4])).requires_grad_()
        zeros = torch.zeros(4)
        loss, figures = ppo_lagrangian_loss(logp, logp.detach(), zeros, a_r, a_c, lam, zeros, zeros, zeros, zeros, zeros, zeros,
                                            clip_eps=0.2, value_clip=1.0, entropy_coef=0.0)
        loss.backward()
        assert torch.allclose(logp.grad, -((a_r - lam * a_c) / (1 + lam)) / 4)
        assert figures["value_loss"] == figures["cost_value_loss"] == 0.0  # V = returns: no value loss


def test_critic_losses_are_the_clipped_value_loss_of_each():
    vr, vc = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([0.0, 3.0], requires_grad=True)
    zeros = torch.zeros(2)
    _, f = ppo_lagrangian_loss(zeros, zeros, zeros, zeros, zeros, 0.5, vr, vr.detach(), torch.tensor([2.0, 2.0]),
                               vc, vc.detach(), torch.tensor([0.0, 1.0]), clip_eps=0.2, value_clip=10.0, entropy_coef=0.0)
    assert f["value_loss"] == pytest.approx(0.5 * (1.0 + 0.0) / 2) and f["cost_value_loss"] == pytest.approx(0.5 * (0.0 + 4.0) / 2)


# -- the environment ---------------------------------------------------------------------------------------------
def test_environment_is_seeded_and_its_costs_are_collisions_and_road_exits():
    a, b = DrivingEnv(ENV, 4, 7), DrivingEnv(ENV, 4, 7)
    actions = np.random.default_rng(0).integers(5, size=(ENV.horizon, 4))
    for row in actions:
        ra, rb = a.step(row), b.step(row)
        assert np.array_equal(ra.cost, rb.cost) and np.array_equal(ra.reward, rb.reward)
    assert np.array_equal(a.render(), b.render()) and a.done.all()

    env = DrivingEnv(ENV, 2, 0)
    env.x[:] = [1.5, 0.35]  # episode 0: a car right in front, closing in; episode 1: at the left edge
    env.v[:] = 1.0
    env.car_x[:] = [[1.5, 2.5, 2.5], [2.5, 2.5, 2.5]]
    env.car_y[:] = [[CAR_LENGTH + 0.3, 10.0, 12.0], [10.0, 11.0, 12.0]]
    env.car_v[:] = 0.2
    caps = env.captions()
    assert caps[0][0] == "a car about to crash into another vehicle" and caps[0][1] == "car ahead in my lane close"
    assert caps[1][0] == "a car about to leave the road" and caps[1][2] == "no lane on my left"
    step = env.step(np.array([0, 1]))  # keep (runs into the car), steer left (off the road)
    assert step.collision.tolist() == [1, 0] and step.road_exit.tolist() == [False, True]
    assert step.cost.tolist() == [1.0, 1.0] and step.done.tolist() == [False, True]
    assert env.car_y[0, 0] > 10  # the car hit is respawned ahead
    assert step.reward.tolist() == [1.0, 1.0] and set(w for c in caps for p in c for w in p.split()) <= set(vocabulary())


def test_frames_show_the_ego_car_and_other_cars():
    env = DrivingEnv(ENV, 2, 0)
    env.car_y[0] = [3.0, 30.0, 40.0]  # one car in view in episode 0, none in episode 1
    env.car_y[1] = [30.0, 40.0, 50.0]
    frames = env.render()
    assert frames.shape == (2, 16, 16, 3) and frames.dtype == np.uint8
    red = (frames[..., 0] > 200) & (frames[..., 1] < 80)
    blue = (frames[..., 2] > 200) & (frames[..., 0] < 80)
    assert red.any(axis=(1, 2)).all() and blue.any(axis=(1, 2)).tolist() == [True, False]
    env.x[0] = 0.5
    assert not np.array_equal(env.render()[0], frames[0])  # the camera sees the ego car move
