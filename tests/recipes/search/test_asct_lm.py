"""ASCT with the language model as the actor (recipes/search/asct_actors.py `lm`; specs/seed_methods.md §24) on a micro search
corpus and a micro char-level LM: the policy is the LM's sequence probability of each legal action's text normalised
over the legal set, the spec's invariants hold under its frozen probabilities, and the tree feeds it a real signal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.recipes.search.asct_objective import centred_advantages, local_credit
from posttrain.rollout.tree import search
from posttrain.recipes.search.asct_stages import search_setup
from posttrain.recipes.search.asct_trainer import ASCTTrainer, simulate
from posttrain.recipes.search.asct_actors import LMActor
from posttrain.trainers.loop import TrainLoop

PARAMS = Path(__file__).resolve().parents[3] / "recipes" / "search" / "params.yaml"
MICRO = ["task.n_train=40", "task.n_heldout=10", "task.options.search.people=30", "task.options.search.companies=6",
         "task.options.search.cities=5", "asct.n_heldout=3", "asct.actor=lm", "asct.episodes=4", "asct.n_sim=4", "asct.epochs=1",
         "asct.lm.sft_steps=0", "asct.lm.lr=0.01", "asct.entropy_coef=0", "model.hidden_size=16", "model.intermediate_size=32",
         "model.layers=1", "model.heads=2", "model.kv_heads=1"]


@pytest.fixture(scope="module")
def run():
    cfg = resolve.load(PARAMS, MICRO)
    env, train, _ = search_setup(cfg, 0)
    trainer = ASCTTrainer(cfg.asct, env, train, seed=0, model_cfg=cfg.model)
    episodes, frozen = trainer.collect()
    state = trainer.generator.get_state()
    advantages, metrics = trainer.credit(episodes, frozen)
    return trainer, episodes, frozen, state, advantages, metrics


def test_the_policy_is_the_lm_sequence_probability_normalised_over_the_legal_actions(run):
    trainer, episodes, frozen, *_ = run
    actor, env = trainer.actor, trainer.env
    assert isinstance(actor, LMActor)
    state = episodes[0].visits[-1].state
    actions = env.legal_actions(state)
    by_hand = []
    for a in actions:  # one plain forward over the state's text followed by the action's text
        prefix, action = actor.ids(env.text(state)), actor.ids(env.action_text(a))
        with torch.no_grad():
            logits = actor.lm(input_ids=torch.tensor([prefix + action])).logits[0]
        logp = torch.log_softmax(logits[len(prefix) - 1 : -1], -1).gather(1, torch.tensor(action)[:, None]).sum()
        by_hand.append(float(logp))
    expected = torch.softmax(torch.tensor(by_hand), 0)
    probs = actor.distribution(env, state, actions)
    assert torch.allclose(probs, expected, atol=1e-5) and float(probs.sum()) == pytest.approx(1.0)
    assert env.text(state).startswith(state.question.text) and all(env.action_text(a).startswith("<") for a in actions)


def test_the_tree_gives_the_lm_actor_a_non_degenerate_credit(run):
    trainer, episodes, _, _, advantages, metrics = run
    assert metrics["q_spread"] > 0  # Q_hat differs across legal actions at the visited states
    assert (advantages != 0).any() and metrics["aux_tokens"] > 0
    visit = episodes[0].visits[0]
    actions = trainer.env.legal_actions(visit.state)
    written = trainer.env.tokens(visit.state, actions[visit.taken])
    assert visit.tokens > written  # the LM scored the other legal actions' tokens too: counted as it spends them


def test_centred_advantages_sum_to_zero_under_the_frozen_lm(run):
    trainer, episodes, frozen, *_ = run
    env, cfg = trainer.env, trainer.cfg
    g = torch.Generator().manual_seed(1)
    checked = 0
    for v in (v for e in episodes for v in e.visits):
        actions = env.legal_actions(v.state)
        tree = search(len(actions), lambda a: simulate(frozen, env, v.state, g, cfg.max_steps, actions[a]), 2 * len(actions), "uniform",  # noqa: B023  (search calls it now)
                      1.0, 0.0, first=v.taken, generator=g)
        pi0 = frozen.distribution(env, v.state, actions).double()
        assert torch.equal(pi0.float(), v.pi0)  # pi_0 is the frozen actor's, the same at rollout and credit time
        table, _ = centred_advantages(tree.q[None], pi0[None], tree.evaluated[None])
        assert float((pi0 * table[0]).sum()) == pytest.approx(0.0, abs=1e-12)  # every action evaluated: pi_0 itself
        checked += int(table.abs().max() > 0)
        equal, _ = centred_advantages(torch.full_like(tree.q, 0.4)[None], pi0[None], tree.evaluated[None])
        assert torch.allclose(equal, torch.zeros_like(equal))
    assert checked > 0
    single = [actions[0]]  # a state whose legal set is one action: pi_0 = 1 and the credit is 0
    pi_single = frozen.distribution(env, episodes[0].visits[0].state, single)
    assert float(pi_single) == pytest.approx(1.0)
    assert float(local_credit(torch.tensor([[0.7]]), pi_single[None].double(), torch.tensor([[True]]), torch.tensor([0]))) == 0.0


def test_live_lm_updates_do_not_change_the_credit(run):
    trainer, episodes, frozen, state, before, _ = run
    visits = [v for e in episodes for v in e.visits]
    logp, _ = trainer.actor.log_probs(trainer.actor.prepare(trainer.env, visits))
    taken = torch.tensor([v.taken for v in visits])
    old = torch.tensor([v.logp for v in visits])
    assert torch.allclose(logp.gather(1, taken[:, None]).squeeze(1), old, atol=1e-5)  # PPO's ratio starts at 1
    for step in range(3):
        trainer.update(visits, before, step + 1, TrainLoop())
    v = visits[0]
    live = trainer.actor.distribution(trainer.env, v.state, trainer.env.legal_actions(v.state))
    assert not torch.allclose(live, v.pi0, atol=1e-4)  # the live LM did move
    trainer.generator.set_state(state)
    after, _ = trainer.credit(episodes, frozen)
    assert torch.equal(before, after)
