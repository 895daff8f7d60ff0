"""UniOPSD's anchors on hand-built multi-turn rollouts: steps are the runs of produced tokens, coinciding
states form anchor groups (GiGPO Eq. 6), step credit is the discounted return against the anchor's mean
(Eq. 7) and so differs from the episode credit, and the peer-hindsight teacher never teaches a lone success
with itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.objectives import advantages
from posttrain.objectives.distill.anchors import step_rows, step_spans
from posttrain.objectives.distill.uniopsd import arbitration, c_star, successful_peers, tiers
from posttrain.rollout import RolloutBatch

RL = resolve.load(Path(__file__).resolve().parents[2] / "params.yaml").rl
A, B, S, X = 1, 2, 3, 4  # action tokens (S stops); observation tokens are 8 and 9


def rl(**uniopsd):
    return resolve.updated(RL, "rl", options={"uniopsd": {"gamma": 0.5, **uniopsd}})


def episodes(rows, rewards, group=None) -> RolloutBatch:
    """rows: lists of (token, produced) pairs after the prompt [5, 6]; right-padded with 0."""
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    produced, seen = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, row in enumerate(rows):
        for t, (token, by_policy) in enumerate(row):
            ids[i, t], produced[i, t], seen[i, t] = token, int(by_policy), 1
    n = len(rows)
    return RolloutBatch(
        prompt_ids=torch.tensor([[5, 6]] * n), prompt_mask=torch.ones(n, 2, dtype=torch.long), completion_ids=ids, completion_mask=produced,
        group=torch.tensor(group or [0] * n), old_logp=torch.zeros(n, T), rewards=torch.tensor(rewards)[:, None], reward_names=("correctness",),
        reward_weights=torch.ones(1), attention_mask=seen,
    )


def act(token):
    return (token, True)


def obs(token):
    return (token, False)


# r0: A -> 9, S (success); r1: A -> 9, X (fail); r2: B -> 8, S (fail); r3: B -> 9, S (fail, same cell as r0/r1 by another path)
ROWS = [[act(A), obs(9), act(S)], [act(A), obs(9), act(X)], [act(B), obs(8), act(S)], [act(B), obs(9), act(S)]]
REWARDS = [1.0, 0.0, 0.0, 0.0]


def test_steps_are_the_runs_of_produced_tokens():
    mask = torch.tensor([[1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    assert step_spans(mask) == [[(0, 1), (3, 5)], [(0, 3)]]


def test_anchors_are_found_where_the_histories_coincide():
    batch = episodes(ROWS, REWARDS)
    steps = step_rows(batch, torch.tensor(REWARDS), 0.5, "history")
    assert steps.row.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    a = steps.anchor.tolist()
    assert a[0] == a[2] == a[4] == a[6]  # step 0: every rollout stands at the prompt
    assert a[1] == a[3]  # r0 and r1 both did A and read 9
    assert len({a[1], a[5], a[7]}) == 3  # r2 and r3 reached their step 1 by other histories
    assert steps.step_return.tolist() == [0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # gamma^(K-1-k) R
    assert steps.mask[1].tolist() == [0, 0, 1] and steps.mask[0].tolist() == [1, 0, 0]


def test_observation_anchors_merge_states_reached_by_different_paths():
    batch = episodes(ROWS, REWARDS)
    a = step_rows(batch, torch.tensor(REWARDS), 0.5, "observation").anchor.tolist()
    assert a[1] == a[3] == a[7] != a[5]  # r3 reads 9 like r0 and r1; r2 reads 8


def test_anchors_never_cross_rollout_groups():
    batch = episodes(ROWS[:2] * 2, [1.0, 0.0, 1.0, 0.0], group=[0, 0, 1, 1])
    a = step_rows(batch, torch.tensor([1.0, 0.0, 1.0, 0.0]), 0.5, "history").anchor.tolist()
    assert a[0] == a[2] != a[4] == a[6]


def test_step_credit_is_the_return_against_the_anchor_mean_and_differs_from_the_episode_credit():
    """By hand, mode mean_norm, gamma 0.5, no teacher (c = 1): each step's tokens get A^E + A^S."""
    batch = episodes(ROWS, REWARDS).with_extras(peer_logp_gap=torch.zeros(4, 3), uniopsd_rho=torch.tensor(0.0), train_step=torch.tensor(1.0))
    cfg = rl(anchor="history")
    steps, tier = tiers(batch, batch.extras["peer_logp_gap"], cfg, cfg.options_for("uniopsd"))
    a_e = torch.tensor([0.75, -0.25, -0.25, -0.25])
    torch.testing.assert_close(tier.a_episode, a_e[steps.row])
    # step 0: returns (0.5, 0, 0, 0), anchor mean 0.125; step 1: r0/r1 share (1, 0), mean 0.5; r2, r3 alone
    torch.testing.assert_close(tier.a_step, torch.tensor([0.375, 0.5, -0.125, -0.5, -0.125, 0.0, -0.125, 0.0]))
    assert not torch.allclose(tier.a_step, tier.a_episode)
    assert tier.has_step.tolist() == [True, True, True, True, True, False, True, False]  # a lone state has no step evidence
    adv = advantages.get("uniopsd")(batch, cfg)
    expected = torch.tensor([[0.75 + 0.375, 0.0, 0.75 + 0.5], [-0.25 - 0.125, 0.0, -0.25 - 0.5],
                             [-0.25 - 0.125, 0.0, -0.25], [-0.25 - 0.125, 0.0, -0.25]])
    torch.testing.assert_close(adv, expected)  # observation tokens get no credit


def test_mean_std_norm_divides_both_tiers_by_their_std():
    batch = episodes(ROWS, REWARDS)
    cfg = rl(anchor="history", mode="mean_std_norm")
    _, tier = tiers(batch, torch.zeros(4, 3), cfg, cfg.options_for("uniopsd"))
    r = torch.tensor(REWARDS)
    torch.testing.assert_close(tier.a_episode[::2], (r - r.mean()) / (r.std() + cfg.std_eps))
    assert tier.a_step[1].item() == pytest.approx(0.5 / (torch.tensor([1.0, 0.0]).std().item() + cfg.std_eps))


def test_teacher_credit_enters_only_on_taught_steps_and_keeps_the_episode_tier():
    gap = torch.tensor([[0.0, 0.0, 0.0], [0.4, 0.0, -0.6], [0.2, 0.0, 0.3], [-0.1, 0.0, 0.5]])  # r0 untaught (lone success)
    batch = episodes(ROWS, REWARDS).with_extras(peer_logp_gap=gap, uniopsd_rho=torch.tensor(0.9), train_step=torch.tensor(1.0))
    cfg = rl(anchor="history")
    steps, tier = tiers(batch, gap, cfg, cfg.options_for("uniopsd"))
    assert tier.has_teacher.tolist() == [False, False, True, True, True, True, True, True]
    assert (tier.a_teacher[:2] == 0).all() and tier.a_teacher[2:].abs().sum() > 0
    adv = advantages.get("uniopsd")(batch, cfg)
    torch.testing.assert_close(adv[0], torch.tensor([0.75 + 0.375, 0.0, 0.75 + 0.5]))  # untaught: A^E + A^S exactly
    plain = advantages.get("uniopsd")(batch.with_extras(peer_logp_gap=torch.zeros(4, 3)), cfg)
    assert not torch.allclose(adv[1:], plain[1:])  # trusted teacher moves the step credit of taught rows


def test_arbitration_reads_out_whether_the_teacher_entered_the_credit():
    gap = torch.tensor([[0.0, 0.0, 0.0], [0.4, 0.0, -0.6], [0.2, 0.0, 0.3], [-0.1, 0.0, 0.5]])
    batch = episodes(ROWS, REWARDS).with_extras(peer_logp_gap=gap, uniopsd_rho=torch.tensor(0.0), train_step=torch.tensor(1.0))
    cfg = rl(anchor="history")
    untrusted = arbitration(batch, cfg)  # rho_used 0: c* = 1, every c_k = 1, the teacher enters nothing
    assert untrusted["rho_used"] == 0.0 and untrusted["c_star"] == 1.0 and untrusted["arbitrated_share"] == 0.0
    assert untrusted["taught_share"] == 6 / 8
    trusted = arbitration(batch.with_extras(uniopsd_rho=torch.tensor(0.6)), cfg)
    assert trusted["c_star"] == pytest.approx(c_star(0.6, 0.5)) and trusted["c_star"] < 1
    assert 0 < trusted["arbitrated_share"] <= trusted["taught_share"]  # only taught rows are arbitrated
    _, tier = tiers(batch, gap, cfg, cfg.options_for("uniopsd"))
    differs = (tier.a_step - tier.a_episode).abs() > 1e-6
    assert trusted["tiers_differ_share"] == pytest.approx(float(differs.float().mean())) and trusted["tiers_differ_share"] > 0


def test_a_lone_success_is_never_its_own_peer():
    assert successful_peers([True, False, False], [0, 0, 0]) == [None, 0, 0]
    assert successful_peers([True, True, False, True, False], [0, 0, 0, 1, 1]) == [1, 0, 0, None, 3]
    assert successful_peers([False, False], [0, 0]) == [None, None]
