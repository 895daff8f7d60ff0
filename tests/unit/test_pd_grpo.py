"""PD-GRPO (pairwise dual-group RPO) invariants and the TRM output format: unparseable outputs get zero reward, never an error."""

from __future__ import annotations

import pytest
import torch

from posttrain.objectives.pd_grpo import dual_group_advantages, pairwise_rewards, parse_trm_output, parsed_scores, pd_grpo_rewards

OK = "<rubric>sum the units, then the tens</rubric><assessment>85 is 37+48</assessment><score>9</score>"


def t(values):
    return torch.tensor(values, dtype=torch.float32)


def valid(n):
    return torch.ones(n, dtype=torch.bool)


def test_parse_the_fixed_format():
    out = parse_trm_output(OK, 10)
    assert out is not None and out.score == 9.0 and out.rubric.startswith("sum") and "85" in out.assessment


@pytest.mark.parametrize("text", [
    "", "score: 9", "<rubric>r</rubric><score>9</score>", "<rubric>r</rubric><assessment>a</assessment><score>11</score>",
    "<rubric>r</rubric><assessment>a</assessment><score>nine</score>", OK + " trailing words", "<score>9</score>" + OK,
    "<rubric></rubric><assessment>a</assessment><score>3</score>", "\x00\x01<rubric>", "<rubric>r" * 1000,
])
def test_unparseable_outputs_give_none_and_zero_format_reward(text):
    assert parse_trm_output(text, 10) is None
    scores, ok = parsed_scores([text, OK], 10)
    assert ok.tolist() == [False, True] and scores.tolist() == [0.0, 9.0]
    r_w, r_l = pd_grpo_rewards(scores[:1], ok[:1], t([5.0]), valid(1), alpha_format=0.5)
    assert r_w.tolist() == [0.0]  # no pairwise and no format reward for an unparseable judgement


def test_no_reward_for_a_larger_margin():
    low_l = t([3.0, 4.0, 5.0, 4.0])
    modest, _ = pairwise_rewards(t([6.0, 6.0, 2.0, 6.0]), valid(4), low_l, valid(4))
    extreme, _ = pairwise_rewards(t([10.0, 10.0, 2.0, 10.0]), valid(4), low_l, valid(4))
    assert torch.equal(modest, extreme) and modest.tolist() == [1.0, 1.0, 0.0, 1.0]


def test_each_group_advantage_has_zero_mean():
    r_w, r_l = pd_grpo_rewards(t([6.0, 7.0, 2.0, 9.0]), valid(4), t([3.0, 8.0, 5.0, 1.0]), valid(4), alpha_format=0.5)
    a_w, a_l = dual_group_advantages(r_w, r_l, 1e-4)
    assert abs(float(a_w.sum())) < 1e-5 and abs(float(a_l.sum())) < 1e-5 and float(a_w.abs().sum()) > 0


def test_identical_scores_give_only_the_tie_reward():
    same = t([5.0, 5.0, 5.0])
    r_w, r_l = pairwise_rewards(same, valid(3), same, valid(3))
    assert r_w.tolist() == [0.5] * 3 and r_l.tolist() == [0.5] * 3
    a_w, a_l = dual_group_advantages(r_w, r_l, 1e-4)
    assert torch.equal(a_w, torch.zeros(3)) and torch.equal(a_l, torch.zeros(3))


def test_swapping_the_preferred_candidate_swaps_the_rewards():
    s_a, s_b = t([6.0, 2.0, 8.0]), t([4.0, 7.0, 1.0])
    r_w, r_l = pairwise_rewards(s_a, valid(3), s_b, valid(3))  # a preferred
    r_w_swapped, r_l_swapped = pairwise_rewards(s_b, valid(3), s_a, valid(3))  # b preferred
    # a rollout judging a is paid for landing above b's median when a is preferred, below it when b is
    assert torch.equal(r_w, (s_a > s_b.median()).float()) and torch.equal(r_l_swapped, (s_a < s_b.median()).float())
    assert torch.equal(r_l, (s_b < s_a.median()).float()) and torch.equal(r_w_swapped, (s_b > s_a.median()).float())


def test_no_parseable_opponent_means_no_pairwise_signal():
    r_w, r_l = pairwise_rewards(t([6.0, 7.0]), valid(2), t([0.0, 0.0]), torch.zeros(2, dtype=torch.bool))
    assert r_w.tolist() == [0.0, 0.0] and r_l.tolist() == [0.0, 0.0]
