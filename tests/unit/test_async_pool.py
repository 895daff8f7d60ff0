"""PACE's invariants and the pool policies (rollout/pool.py), over hand-computed versions."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from posttrain.rollout.pool import (
    Group, MaxStalenessOptions, PACEOptions, TrajectoryPool, effective_staleness, group_staleness, largest_staleness,
    naive_generation_staleness, pool_policies, prefix_aware_generation_staleness, rejection_budget, waiting_staleness,
)

PACE = dict(kappa=1.0, rho=1.0, beta_g=1.0, cap=0, order="fifo")


def tensors(rows: list[list[int]]):
    return Group(0, tuple(tuple(r) for r in rows), tuple(max(r) for r in rows)).tensors()


def test_hand_computed_staleness():
    # trajectory 0: 4 tokens at versions 2,2,3,5, completed at 5; trajectory 1: 2 tokens at 5, completed at 5
    versions, mask, v_end = tensors([[2, 2, 3, 5], [5, 5]])
    assert waiting_staleness(7, v_end).tolist() == [2.0, 2.0]
    assert naive_generation_staleness(versions, mask, v_end).tolist() == [3.0, 0.0]
    assert prefix_aware_generation_staleness(versions, mask, v_end).tolist() == [(3 + 3 + 2 + 0) / 4, 0.0]
    assert effective_staleness(7, versions, mask, v_end, beta_g=0.5).tolist() == [2 + 0.5 * 2.0, 2.0]


def test_no_rejection_below_target_and_budget_bounded():
    for occupancy, target, rho in itertools.product(range(0, 12), range(0, 8), (0.0, 0.3, 0.5, 1.0)):
        budget = rejection_budget(occupancy, target, rho)
        if occupancy <= target:
            assert budget == 0
        assert 0 <= budget <= max(0, occupancy - target)
        if rho == 1.0:
            assert budget == max(0, occupancy - target)


def test_rejected_set_is_the_largest_effective_staleness():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 12)
        scores = torch.tensor([rng.choice([0.0, 0.5, 1.0, 2.5, 4.0]) for _ in range(n)], dtype=torch.float64)
        v_end = torch.tensor([rng.randint(0, 5) for _ in range(n)])
        budget = rng.randint(0, n)
        chosen = largest_staleness(scores, v_end, budget)
        assert len(chosen) == budget
        others = [i for i in range(n) if i not in chosen]
        for c, o in itertools.product(chosen, others):  # every rejected item ranks above every kept one
            assert scores[c] > scores[o] or (scores[c] == scores[o] and v_end[c] <= v_end[o])
    # ties broken by the older completion version
    assert largest_staleness(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([4, 2, 0]), 1) == [1]


def test_synchronous_execution_has_zero_effective_staleness():
    v_now = 6
    versions, mask, v_end = tensors([[v_now] * 5, [v_now] * 2, [v_now] * 9])
    assert effective_staleness(v_now, versions, mask, v_end, beta_g=1.0).tolist() == [0.0, 0.0, 0.0]


def test_prefix_awareness_long_trajectory_mostly_after_refresh():
    # 100 tokens: the first 5 under version 0, then refreshes to 1, 2, 3 with the last 95 tokens under version 3
    rows = [[0] * 5 + [3] * 95]
    versions, mask, v_end = tensors(rows)
    gp = prefix_aware_generation_staleness(versions, mask, v_end)
    gn = naive_generation_staleness(versions, mask, v_end)
    assert gn.item() == 3.0 and gp.item() == pytest.approx(0.15) and gp.item() < gn.item()


def test_effective_staleness_is_monotone_in_waiting_staleness():
    versions, mask, v_end = tensors([[1, 2, 2, 3], [3, 3]])
    values = [effective_staleness(v_now, versions, mask, v_end, beta_g=1.0) for v_now in range(3, 12)]
    for before, after in zip(values, values[1:]):
        assert torch.all(after > before)


def group(prompt: int, *rows: list[int]) -> Group:
    return Group(prompt, tuple(tuple(r) for r in rows), tuple(max(r) for r in rows))


def test_pace_pool_rejects_the_stalest_groups_down_to_the_target():
    pool, policy = TrajectoryPool(), pool_policies.get("pace")(PACEOptions(**PACE))
    # pooled groups at v_now = 10: mean E of 8, 9, 0, 1.5, 3 (group 3: tokens 9,9 and 8 -> Gp 0.5, W 1)
    for g in (group(0, [2, 2], [2]), group(1, [1, 1]), group(2, [10]), group(3, [8, 9], [9]), group(4, [7, 7])):
        pool.add(g)
    draw = pool.draw(policy, v_now=10, batch_groups=2)
    assert sorted(g.prompt for g in draw.rejected) == [0, 1, 4]  # P = 5, P* = 2 -> R = 3 largest E
    assert [g.prompt for g in draw.batch] == [2, 3] and len(pool) == 0
    assert draw.figures["pool/occupancy"] == 5.0 and draw.figures["pool/rejected_groups"] == 3.0
    assert draw.figures["pool/rejected_trajectories"] == 4.0
    assert draw.figures["pool/E_mean"] == pytest.approx((0.0 + (1.5 + 1.0) / 2) / 2)  # group 2: E 0; group 3: E 1.5 and 1
    assert draw.figures["pool/E_hist/0"] == 1.0 and draw.figures["pool/E_hist/1"] == 1.0


def test_pace_rejects_nothing_when_the_pool_is_not_overfull_and_orders_lowest_e():
    pool = TrajectoryPool()
    policy = pool_policies.get("pace")(PACEOptions(**{**PACE, "kappa": 2.0, "order": "lowest_e"}))
    for g in (group(0, [1]), group(1, [5]), group(2, [3])):
        pool.add(g)
    draw = pool.draw(policy, v_now=5, batch_groups=2)  # P = 3 <= P* = 4
    assert draw.rejected == [] and [g.prompt for g in draw.batch] == [1, 2] and [g.prompt for g in pool.groups] == [0]


def test_pace_partial_budget_and_hard_cap_first():
    def pool_of_six() -> TrajectoryPool:  # at v_now = 6, group i has E = oldest lag = 6 - i
        pool = TrajectoryPool()
        for i in range(6):
            pool.add(group(i, [i]))
        return pool

    half = pool_policies.get("pace")(PACEOptions(**{**PACE, "rho": 0.5}))
    draw = pool_of_six().draw(half, v_now=6, batch_groups=2)  # R = floor(0.5 * (6 - 2)) = 2
    assert [g.prompt for g in draw.rejected] == [0, 1] and [g.prompt for g in draw.batch] == [2, 3]
    capped = pool_policies.get("pace")(PACEOptions(**{**PACE, "cap": 5}))
    draw = pool_of_six().draw(capped, v_now=6, batch_groups=2)  # the cap drops group 0; then P = 5, R = 3
    assert [g.prompt for g in draw.rejected] == [0, 1, 2, 3] and [g.prompt for g in draw.batch] == [4, 5]


def test_max_staleness_caps_the_oldest_token_and_none_rejects_nothing():
    groups = (group(0, [1, 4], [4]), group(1, [3, 4]), group(2, [5]))
    capped, plain = TrajectoryPool(), TrajectoryPool()
    for g in groups:
        capped.add(g)
        plain.add(g)
    draw = capped.draw(pool_policies.get("max_staleness")(MaxStalenessOptions(cap=2)), v_now=5, batch_groups=2)
    assert [g.prompt for g in draw.rejected] == [0] and [g.prompt for g in draw.batch] == [1, 2]
    draw = plain.draw(pool_policies.get("none")(), v_now=5, batch_groups=2)
    assert draw.rejected == [] and [g.prompt for g in draw.batch] == [0, 1] and len(plain) == 1
    short = capped.draw(pool_policies.get("none")(), v_now=5, batch_groups=1)
    assert short.batch is None  # an empty pool: the trainer waits


def test_group_refuses_tokens_newer_than_completion():
    with pytest.raises(ValueError, match="newer"):
        Group(0, ((1, 3),), (2,))
    assert group_staleness(group(0, [2, 4]), v_now=4).oldest_lag == 2
    assert sorted(pool_policies.names()) == ["max_staleness", "none", "pace"]
