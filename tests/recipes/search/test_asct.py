"""ASCT (specs/seed_methods.md §24): the centred credit (recipes/search/asct_objective.py), the tree policies (rollout/tree.py) and
the trainer's arms (recipes/search/asct_trainer.py) on a toy recoverable environment, with the spec's invariants."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch

from posttrain.recipes.search.recoverable import RecoverableEnv
from posttrain.recipes.search.asct_objective import centred_advantages, local_credit, mixed_credit
from posttrain.rollout.tree import Simulation, search, tree_policies, uct_scores
from posttrain.recipes.search.asct_trainer import ASCTTrainer, credits, mc_value_credit, play


@dataclass(frozen=True)
class Probe:
    target: int
    probed: tuple[int, ...] = ()
    answer: int | None = None


class ProbeEnv(RecoverableEnv):
    """Find the hidden box 0..2: `("probe", k)` tells whether k holds it (cost 0.1), `("answer", k)` ends the episode;
    utility 1[answer = target] - 0.1 probes. Probing first is worth it; guessing scores 1/3."""

    n_features = 5

    def start(self, example):
        return Probe(example)

    def legal_actions(self, s):
        return [("probe", k) for k in range(3) if k not in s.probed] + [("answer", k) for k in range(3)]

    def step(self, s, a):
        return replace(s, probed=(*s.probed, a[1])) if a[0] == "probe" else replace(s, answer=a[1])

    def done(self, s):
        return s.answer is not None

    def utility(self, s):
        return float(s.answer == s.target) - 0.1 * len(s.probed)

    def features(self, s, actions):
        found = [k for k in s.probed if k == s.target]
        return torch.tensor([[a[0] == "probe", a[0] == "answer", a[1] in found, a[1] in s.probed and a[1] not in found, len(s.probed) / 3]
                             for a in actions], dtype=torch.float32)

    def tokens(self, s, a):
        return 3 if a[0] == "probe" else 2

    def calls(self, s):
        return len(s.probed)


def settings(**kw):
    base = dict(actor="mlp", credit="asct", tree_policy="uniform", n_sim=6, uct_c=1.0, cost_weight=0.1, lambda_mix=1.0, mc_rollouts=6, mc_token_budget=0, episodes=6,
                iterations=2, epochs=2, lr=0.05, clip_eps=0.2, entropy_coef=0.0, max_grad_norm=1.0, hidden_size=8, max_steps=6, log_every=1, eval_samples=0)
    return SimpleNamespace(**{**base, **kw})


# --- the centred credit ------------------------------------------------------------------------------------------

def test_hand_computed_table():
    q, pi0 = torch.tensor([[1.0, 0.0, 0.5]]), torch.tensor([[0.5, 0.25, 0.25]])
    table, value = centred_advantages(q, pi0, torch.ones_like(q, dtype=torch.bool))
    assert value.item() == pytest.approx(0.625)
    assert torch.allclose(table, torch.tensor([[0.375, -0.625, -0.125]]))
    # action 1 not evaluated: pi_0 renormalised over {0, 2} -> V = (0.5 * 1 + 0.25 * 0.5) / 0.75
    table, value = centred_advantages(q, pi0, torch.tensor([[True, False, True]]))
    assert value.item() == pytest.approx(0.625 / 0.75)
    assert table[0, 1] == 0 and table[0, 0].item() == pytest.approx(1 - 0.625 / 0.75)


def test_centred_advantages_sum_to_zero_under_frozen_probabilities():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(64, 7, generator=g, dtype=torch.float64)
    pi0 = torch.softmax(torch.randn(64, 7, generator=g, dtype=torch.float64), -1)
    evaluated = torch.rand(64, 7, generator=g) < 0.7
    evaluated[:, 0] = True
    table, _ = centred_advantages(q, pi0, evaluated)
    weights = pi0 * evaluated
    weights = weights / weights.sum(-1, keepdim=True)
    assert torch.allclose((weights * table).sum(-1), torch.zeros(64, dtype=torch.float64), atol=1e-12)
    assert table.abs().max() > 0.1  # not trivially zero


def test_equal_q_and_single_action_give_zero():
    pi0 = torch.softmax(torch.randn(5, 4), -1)
    table, _ = centred_advantages(torch.full((5, 4), 0.7), pi0, torch.ones(5, 4, dtype=torch.bool))
    assert torch.allclose(table, torch.zeros(5, 4), atol=1e-6)
    single, _ = centred_advantages(torch.tensor([[0.9]]), torch.tensor([[1.0]]), torch.tensor([[True]]))
    assert single.item() == 0.0
    one_evaluated = local_credit(torch.tensor([[0.3, 0.0]]), torch.tensor([[0.4, 0.6]]), torch.tensor([[True, False]]), torch.tensor([0]))
    assert one_evaluated.item() == 0.0


def test_mix_and_no_gradient_pi0():
    assert torch.allclose(mixed_credit(torch.tensor([1.0]), torch.tensor([3.0]), 0.25), torch.tensor([2.5]))
    with pytest.raises(AssertionError):
        centred_advantages(torch.zeros(1, 2), torch.full((1, 2), 0.5, requires_grad=True), torch.ones(1, 2, dtype=torch.bool))


# --- the tree policies -------------------------------------------------------------------------------------------

def noisy(means, costs=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    costs = costs or [0] * len(means)
    return lambda a: Simulation(float(means[a] + 0.3 * torch.randn(1, generator=g)), 5 + costs[a], costs[a])


@pytest.mark.parametrize("budget,n", [(8, 3), (16, 5), (7, 7), (5, 6), (13, 1)])
def test_uniform_allocates_floor_n_over_a(budget, n):
    tree = search(n, noisy([0.0] * n), budget, "uniform", 1.0, 0.0, first=n - 1, generator=torch.Generator().manual_seed(budget))
    assert tree.visits.sum() == budget and tree.tokens == 5 * budget
    assert set(tree.visits.tolist()) <= {budget // n, budget // n + 1} and tree.visits[n - 1] >= 1


def test_a_budget_below_the_actions_evaluates_the_taken_action_and_a_random_rest():
    g, evaluated = torch.Generator().manual_seed(0), []
    for policy in ("uniform", "uct", "agent_uct"):
        for _ in range(6):
            tree = search(8, noisy([0.1] * 8), 3, policy, 1.0, 0.1, first=5, generator=g)
            assert tree.visits[5] == 1 and tree.visits.sum() == 3
            evaluated.append(tuple(tree.evaluated.tolist()))
    assert len(set(evaluated)) > 3  # not the same actions every time (a fixed order would starve the last ones)


def test_agent_uct_with_zero_cost_weight_is_uct():
    means, costs = [0.2, 0.8, 0.5, 0.1], [3, 0, 1, 2]
    a = search(4, noisy(means, costs), 40, "uct", 1.0, 0.0)
    b = search(4, noisy(means, costs), 40, "agent_uct", 1.0, 0.0)
    assert torch.equal(a.visits, b.visits) and torch.equal(a.q, b.q)
    # cost-aware: with a cost weight the costly best arm gets fewer simulations than under UCT
    c = search(4, noisy([0.8, 0.75, 0.1, 0.1], [4, 0, 0, 0]), 40, "agent_uct", 1.0, 0.2)
    d = search(4, noisy([0.8, 0.75, 0.1, 0.1], [4, 0, 0, 0]), 40, "uct", 1.0, 0.2)
    assert c.visits[0] < d.visits[0]


def test_uct_concentrates_on_the_best_action():
    tree = search(4, noisy([0.0, 1.0, 0.0, 0.0]), 40, "uct", 0.5, 0.0)
    assert tree.visits.min() >= 1 and int(tree.visits.argmax()) == 1 and tree.visits[1] > 20
    scores = uct_scores(torch.tensor([0.5, 0.5]), torch.tensor([1, 3]), torch.tensor([0.0, 1.0]), 1.0, 0.5)
    assert scores[0] > scores[1]  # fewer visits and no cost: the larger bonus
    assert set(tree_policies.names()) >= {"uniform", "uct", "agent_uct"}


# --- the trainer's arms ------------------------------------------------------------------------------------------

def test_live_actor_updates_do_not_change_the_credit():
    trainer = ASCTTrainer(settings(), ProbeEnv(), [0, 1, 2], seed=0)
    episodes, frozen = trainer.collect()
    state = trainer.generator.get_state()
    before, metrics = trainer.credit(episodes, frozen)
    assert metrics["q_spread"] > 0 and before.abs().max() > 0  # the tree feeds a real signal
    visits = [v for e in episodes for v in e.visits]
    from posttrain.trainers.loop import TrainLoop

    for step in range(5):
        trainer.update(visits, before, step + 1, TrainLoop())
    live = trainer.actor.distribution(trainer.env, visits[0].state, trainer.env.legal_actions(visits[0].state))
    assert not torch.allclose(live, visits[0].pi0, atol=1e-3)  # the live actor did move
    trainer.generator.set_state(state)
    after, _ = trainer.credit(episodes, frozen)
    assert torch.equal(before, after)


def test_mc_value_telescopes_and_arms_are_registered():
    env, trainer = ProbeEnv(), ASCTTrainer(settings(credit="mc_value"), ProbeEnv(), [0, 1, 2], seed=1)
    episodes, frozen = trainer.collect()
    advantages, _ = mc_value_credit(episodes, frozen, env, trainer.cfg, trainer.generator)
    for e, a in zip(episodes, advantages):
        # sum_t A_t = U - V_hat(s_0), and V_hat(s_0) is a mean of utilities in [-0.3, 1]
        assert -0.3 - 1e-9 <= e.utility - float(a.sum()) <= 1 + 1e-9
    assert set(credits.names()) == {"asct", "trajectory", "mc_value"}


def test_asct_training_runs_and_counts_auxiliary_tokens():
    from posttrain.recipes.search.asct_trainer import train_asct

    _, history, metrics, episodes = train_asct(settings(iterations=3), ProbeEnv(), [0, 1, 2], [0, 1, 2], seed=0)
    assert len(history) == 3 and all(h["aux_tokens"] > 0 and h["informative"] > 0 for h in history)
    assert metrics["aux_tokens"] == sum(h["aux_tokens"] for h in history) and len(episodes) == 3
    _, plain, flat, _ = train_asct(settings(iterations=3, credit="trajectory"), ProbeEnv(), [0, 1, 2], [0, 1, 2], seed=0)
    assert flat["aux_tokens"] == 0
    greedy = play(ASCTTrainer(settings(), ProbeEnv(), [0], 0).actor, ProbeEnv(), 1, None, greedy=True)
    assert ProbeEnv().done(greedy.final) or len(greedy.visits) == 6
