"""ASCT's view of the search environment (recipes/search/search_tree.py) on a micro corpus: recoverable states, the legal actions,
utility = F1 - cost per call, the tokens a transition writes, the features, and a non-degenerate tree credit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from posttrain import resolve
from posttrain.envs.search import observation
from posttrain.recipes.search.search_tree import RELATIONS, UNKNOWN, parse_passage, subject_of
from posttrain.recipes.search.asct_stages import search_setup
from posttrain.recipes.search.asct_trainer import ASCTTrainer

PARAMS = Path(__file__).resolve().parents[3] / "recipes" / "search" / "params.yaml"
MICRO = ["task.n_train=40", "task.n_heldout=20", "task.options.search.people=30", "task.options.search.companies=6",
         "task.options.search.cities=5", "asct.n_heldout=5"]


@pytest.fixture(scope="module")
def setup():
    return search_setup(resolve.load(PARAMS, MICRO), 0)


def test_states_are_values_and_the_reference_path_scores_f1_minus_cost(setup):
    env, train, _ = setup
    hq = next(q for q in train if q.kind == "hq")
    start = env.start(hq)
    assert env.legal_actions(start) == [("search", f"{subject_of(hq)} {r}") for r in RELATIONS] + [("answer", UNKNOWN)]
    state = start
    for query in hq.queries:
        assert ("search", query) in env.legal_actions(state)
        state = env.step(state, ("search", query))
    assert start.queries == () and env.step(start, ("search", hq.queries[0])) == env.step(start, ("search", hq.queries[0]))
    assert ("answer", hq.answer) in env.legal_actions(state)  # BM25 found both hops
    done = env.step(state, ("answer", hq.answer))
    assert env.done(done) and env.utility(done) == pytest.approx(1.0 - 0.1 * 2) and env.figures(done)["recall"] == 1.0
    assert env.utility(env.step(start, ("answer", UNKNOWN))) == 0.0
    passages = [env.corpus.passages[i] for i in state.results[0]]
    assert env.tokens(start, ("search", hq.queries[0])) == len(f"<search>{hq.queries[0]}</search>" + observation(passages))
    assert parse_passage("p3 works at c1") == ("p3", "works at", "c1") and parse_passage("nothing here") is None


def test_features_cross_the_action_with_the_question_kind(setup):
    env, train, _ = setup
    for kind, block in (("employer", 0), ("home", 1), ("hq", 2)):
        q = next(q for q in train if q.kind == kind)
        s = env.step(env.start(q), ("search", q.queries[0]))
        f = env.features(s, env.legal_actions(s))
        width = env.n_features // 4
        assert f.shape == (len(env.legal_actions(s)), env.n_features)
        crossed = f[:, width:].view(len(f), 3, width)
        assert torch.equal(crossed[:, block], f[:, :width]) and crossed.abs().sum() == f[:, :width].abs().sum()


def test_the_tree_feeds_a_non_degenerate_credit_in_the_search_environment(setup):
    env, train, _ = setup
    cfg = SimpleNamespace(actor="mlp", credit="asct", tree_policy="uniform", n_sim=6, uct_c=1.0, cost_weight=0.1, lambda_mix=1.0, mc_rollouts=2,
                          mc_token_budget=0, episodes=6, epochs=1, lr=0.01, clip_eps=0.2, entropy_coef=0.0, max_grad_norm=1.0,
                          hidden_size=8, max_steps=6)
    trainer = ASCTTrainer(cfg, env, train, seed=0)
    episodes, frozen = trainer.collect()
    advantages, metrics = trainer.credit(episodes, frozen)
    assert metrics["q_spread"] > 0 and metrics["aux_tokens"] > 0 and (advantages != 0).float().mean() > 0.3


def test_sampled_held_out_episodes_read_the_policy_beyond_its_argmax(setup):
    """evaluate() with eval_samples k: k sampled episodes per question beside the greedy one, from a generator of their
    own seeded by the run's seed (the same figures twice; the training generator untouched); an untrained actor's
    near-uniform policy samples other episodes than its argmax, so the sampled figures are not the greedy ones."""
    env, train, held = setup
    cfg = SimpleNamespace(actor="mlp", episodes=6, lr=0.01, clip_eps=0.2, hidden_size=8, max_steps=6, eval_samples=4)
    trainer = ASCTTrainer(cfg, env, train, seed=0)
    state = trainer.generator.get_state()
    first, episodes = trainer.evaluate(held[:5])
    assert torch.equal(trainer.generator.get_state(), state) and len(episodes) == 5
    assert {"utility", "f1", "sampled_utility", "sampled_f1", "sampled_tokens"} <= set(first) and first == trainer.evaluate(held[:5])[0]
    assert (first["sampled_utility"], first["sampled_tokens"]) != (first["utility"], first["tokens"])
    greedy_only, _ = ASCTTrainer(SimpleNamespace(**{**vars(cfg), "eval_samples": 0}), env, train, seed=0).evaluate(held[:5])
    assert greedy_only == {k: v for k, v in first.items() if not k.startswith("sampled_")}


def test_the_stage_refuses_a_task_other_than_search():
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="task.name=search"):
        search_setup(resolve.load(PARAMS.parents[2] / "params.yaml"), 0)
