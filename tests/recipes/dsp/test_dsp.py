"""DSP (specs §20): the guidance, flow and expectile formulas on hand-computed tensors, the spec's invariants, the maze
family and the hindsight relabelling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posttrain.recipes.dsp.maze import explore, heldout_pairs, make_maze
from posttrain.recipes.dsp.networks import SubgoalFlow
from posttrain.recipes.dsp.objective import (euler_sample, expectile_loss, flow_matching_loss, goal_dropout, guided_sampler, guided_velocity,
                                      interpolate, target_velocity)


def test_guidance_weight_one_is_conditional_zero_unconditional_and_linear_between():
    g = torch.Generator().manual_seed(0)
    v_u, v_c = torch.randn(5, 2, generator=g), torch.randn(5, 2, generator=g)
    assert torch.equal(guided_velocity(v_u, v_c, 1.0), v_c)
    assert torch.equal(guided_velocity(v_u, v_c, 0.0), v_u)
    assert torch.allclose(guided_velocity(v_u, v_c, 0.5), (v_u + v_c) / 2)
    a, w1, w2 = 0.3, 2.5, -1.0  # linear in omega (an affine map of it): f(a w1 + (1-a) w2) = a f(w1) + (1-a) f(w2)
    assert torch.allclose(guided_velocity(v_u, v_c, a * w1 + (1 - a) * w2), a * guided_velocity(v_u, v_c, w1) + (1 - a) * guided_velocity(v_u, v_c, w2))
    assert torch.allclose(guided_velocity(v_u, v_c, 3.0), v_u + 3 * (v_c - v_u))


def test_the_sampler_with_the_network_at_omega_one_and_zero_uses_one_branch_each():
    torch.manual_seed(0)
    net = SubgoalFlow(2, 16, 2, 2)
    s, goal, z0 = torch.rand(4, 2) * 2 - 1, torch.rand(4, 2) * 2 - 1, torch.randn(4, 2)
    field = lambda z, tau, null: net(z, tau, s, goal, null)  # noqa: E731
    only = lambda null_value: euler_sample(lambda z, tau: net(z, tau, s, goal, torch.full((4,), null_value)), z0, 5)  # noqa: E731
    assert torch.allclose(guided_sampler(field, z0, 5, 1.0), only(False))
    assert torch.allclose(guided_sampler(field, z0, 5, 0.0), only(True))
    assert not torch.allclose(only(False), only(True))  # the goal enters the velocity
    assert guided_sampler(field, z0, 5, 2.0).shape == s.shape  # a subgoal has the state's shape


def test_a_null_goal_in_both_branches_makes_guidance_a_no_op():
    torch.manual_seed(1)
    net = SubgoalFlow(2, 16, 2, 2)
    s, goal, z0 = torch.rand(3, 2), torch.rand(3, 2), torch.randn(3, 2)
    both_null = lambda z, tau, null: net(z, tau, s, goal, torch.ones(3, dtype=torch.bool))  # noqa: E731
    out = [guided_sampler(both_null, z0, 4, omega) for omega in (0.0, 0.5, 1.0, 2.0, 7.0)]
    assert all(torch.allclose(o, out[0], atol=1e-6) for o in out)
    # and the null goal ignores the goal's value: any goal under null gives the same velocity
    tau = torch.full((3,), 0.4)
    null = torch.ones(3, dtype=torch.bool)
    assert torch.equal(net(z0, tau, s, goal, null), net(z0, tau, s, torch.randn(3, 2), null))


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_euler_with_the_exact_velocity_reproduces_the_target(steps):
    torch.manual_seed(2)
    z0, w = torch.randn(6, 2), torch.randn(6, 2)
    assert torch.allclose(euler_sample(lambda z, tau: target_velocity(z0, w), z0, steps), w, atol=1e-6)
    # the same field written in z: (w - z_tau) / (1 - tau) on the straight path
    assert torch.allclose(euler_sample(lambda z, tau: (w - z) / (1 - tau[:, None]), z0, steps), w, atol=1e-5)
    assert torch.allclose(interpolate(z0, w, torch.zeros(6)), z0) and torch.allclose(interpolate(z0, w, torch.ones(6)), w)
    assert torch.allclose(interpolate(z0, w, torch.full((6,), 0.25)), 0.75 * z0 + 0.25 * w)


def test_flow_matching_loss_by_hand():
    z0, w = torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, -1.0]])
    assert flow_matching_loss(torch.tensor([[2.0, -2.0]]), z0, w) == 0.0
    assert flow_matching_loss(torch.tensor([[1.0, 0.0]]), z0, w) == pytest.approx(1.0 + 4.0)


@pytest.mark.parametrize("p", [0.0, 0.15, 0.5])
def test_the_unconditional_fraction_matches_the_dropout_rate(p):
    n = 40_000
    share = float(goal_dropout(n, p, torch.Generator().manual_seed(3)).float().mean())
    assert abs(share - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-9


def test_the_trainer_drops_goals_at_p_uncond():
    from posttrain.resolve import load
    from posttrain.recipes.dsp.trainer import DSPTrainer, load_data
    from helpers import REPO

    cfg = load(REPO / "params.yaml", ["dsp.maze.cells=3", "dsp.data.trajectories=20", "dsp.data.length=10", "dsp.hidden_size=8",
                                              "dsp.layers=1", "dsp.batch_size=2000", "dsp.p_uncond=0.3"]).dsp
    trainer = DSPTrainer(cfg, load_data(cfg, 0), 0)
    shares = [trainer.losses()[1]["uncond_fraction"] for _ in range(3)]
    assert abs(np.mean(shares) - 0.3) < 4 * (0.3 * 0.7 / 6000) ** 0.5


def test_expectile_loss_by_hand_and_a_detached_target():
    value, target = torch.tensor([0.0, 0.0]), torch.tensor([1.0, -2.0])
    assert expectile_loss(value, target, 0.9) == pytest.approx((0.9 * 1.0 + 0.1 * 4.0) / 2)
    assert expectile_loss(value, target, 0.5) == pytest.approx(0.5 * (1 + 4) / 2)
    with pytest.raises(AssertionError):
        expectile_loss(value, target.clone().requires_grad_(True), 0.9)


def test_maze_layouts_are_seeded_connected_and_walled():
    a, b, c = make_maze(5, 0.15, 0), make_maze(5, 0.15, 0), make_maze(5, 0.15, 1)
    assert np.array_equal(a.walls, b.walls) and not np.array_equal(a.walls, c.walls)
    assert a.walls[0].all() and a.walls[:, 0].all() and a.size == 11
    free = a.free_cells()
    assert (a.distances_from(free[0])[tuple(free.T)] >= 0).all()  # every free square reachable
    assert np.array_equal(a.to_cell(a.to_state(free)), free)
    # a move into a wall stays
    r, c0 = free[0]
    blocked = [i for i, (dr, dc) in enumerate([(-1, 0), (1, 0), (0, -1), (0, 1)]) if a.walls[r + dr, c0 + dc]]
    assert blocked and np.array_equal(a.step(free[:1], np.array(blocked[:1])), free[:1])
    # loops: more free squares than the perfect maze's 2 cells^2 - 1
    assert len(free) > len(make_maze(5, 0.0, 0).free_cells()) == 2 * 25 - 1


def test_exploration_moves_and_held_out_pairs_are_far_apart():
    maze = make_maze(4, 0.1, 0)
    cells, actions = explore(maze, 50, 30, 0.3, seed=0)
    assert cells.shape == (50, 31, 2) and actions.shape == (50, 30)
    assert np.array_equal(maze.step(cells[:, 3], actions[:, 3]), cells[:, 4])
    assert not maze.walls[cells[..., 0], cells[..., 1]].any()
    assert (cells[:, 1:] != cells[:, :-1]).any(-1).all()  # the explorer turns at walls: it always moves
    starts, goals, dist = heldout_pairs(maze, 10, 6, seed=5)
    assert (dist >= 6).all() and all(maze.distances_from(s)[tuple(g)] == d for s, g, d in zip(starts, goals, dist))


def test_hindsight_goals_take_the_configured_shares():
    from posttrain.recipes.dsp.trainer import relabel_goals

    rng = np.random.default_rng(0)
    n, length = 20_000, 50
    t, rows = rng.integers(length, size=n), rng.integers(100, size=n)
    g_rows, g_t = relabel_goals(rng, t, rows, length, 100, 0.2, 0.5)
    current = (g_rows == rows) & (g_t == t)
    assert (g_t[g_rows == rows] >= t[g_rows == rows]).mean() > 0.9  # same-trajectory goals lie in the future
    assert 0.2 <= current.mean() < 0.27 and abs((g_rows == rows).mean() - 0.7) < 0.02
