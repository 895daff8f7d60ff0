"""BRIDGE's invariants (recipes/search/bridge_objective.py, recipes/search/bridge_trainer.py): freezing the retriever reduces it to search-agent
GRPO; the retriever's policy gradient is zero when every advantage is zero; the first-order penalty scheme solves a
quadratic toy bilevel problem; the retriever steps before the policy every iteration; the memory-efficient theta_hat
equals the copied one and leaves the policy where it was; a loop resumed from its state continues as one run."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.envs.retrievers import DualEncoder, RetrievalPolicy, train_dual_encoder
from posttrain.models import build_tiny, train_char_tokenizer
from posttrain.recipes.search.bridge_objective import (
    bridge_coefficients, follower_direction, importance_weights, leader_direction, penalty_weight, retriever_pg_loss,
)
from posttrain.tasks import build_task
from posttrain.recipes.search.bridge_trainer import BridgeLoop, action_mask_sft, episode_rows

PARAMS = Path(__file__).resolve().parents[3] / "params.yaml"
MICRO = ["task.name=search", "task.n_train=5", "task.n_heldout=1", "task.options.search.people=6", "task.options.search.companies=3",
         "task.options.search.cities=3", "task.options.search.kinds=[employer]", "task.options.search.cost_per_call=0.2",
         "task.options.search.top_k=1", "task.options.search.candidates=4", "task.options.search.max_calls=2",
         "model.hidden_size=32", "model.intermediate_size=64", "model.layers=1", "model.heads=2", "model.kv_heads=1"]


@pytest.fixture(scope="module")
def world():
    """A micro search world, a tiny policy warm-started to write searches, a weakly trained dual encoder. A cost per
    call makes the rewards differ within a group (by the number of searches) before the policy answers right."""
    cfg = resolve.load(PARAMS, MICRO)
    task = build_task(cfg.task)
    train = task.splits(0)["train"]
    tok = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    policy = build_tiny(cfg.model, tok)
    action_mask_sft(policy, tok, train, steps=40, lr=1e-2, batch_size=5, seed=0)
    encoder = DualEncoder(task.corpus.passages, dim=16, seed=0)
    train_dual_encoder(encoder, [(p.split()[0], i) for i, p in enumerate(task.corpus.passages)], steps=3)
    return task, train, tok, policy.state_dict(), encoder.state_dict(), cfg


def make_loop(world, **settings):
    task, _, tok, policy_state, encoder_state, cfg = world
    policy = build_tiny(cfg.model, tok)
    policy.load_state_dict(copy.deepcopy(policy_state))
    encoder = DualEncoder(task.corpus.passages, dim=16, seed=0)
    encoder.load_state_dict(copy.deepcopy(encoder_state))
    retrieval = RetrievalPolicy(encoder, 1, 4, 0.5, torch.Generator().manual_seed(0))
    defaults = dict(prompts_per_step=2, group_size=3, max_new_tokens=80)
    return BridgeLoop(task, policy, tok, retrieval, cfg.bridge.model_copy(update={**defaults, **settings}), seed=0)


def flat(module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_freezing_the_retriever_reduces_bridge_to_search_agent_grpo(world):
    _, train, *_ = world
    frozen, bridge = make_loop(world, arm="frozen"), make_loop(world, arm="bridge", retriever_lr=0.0)
    h_frozen, h_bridge = frozen.train(train, 2), bridge.train(train, 2)
    assert sum(h["calls"] for h in h_frozen) > 0  # the policy searches: the retriever is reached at all
    assert bridge.order == [("retriever", "policy")] * 2  # the retriever stepped, at eta_phi = 0
    assert torch.allclose(flat(frozen.policy), flat(bridge.policy), atol=1e-6)
    assert torch.equal(flat(frozen.retrieval.retriever), flat(bridge.retrieval.retriever))
    assert [h["reward"] for h in h_frozen] == [h["reward"] for h in h_bridge]
    assert not torch.equal(flat(frozen.policy), flat(make_loop(world).policy))  # the policy did move


def test_retriever_gradient_is_zero_when_every_advantage_is_zero(world):
    task = world[0]
    encoder = DualEncoder(task.corpus.passages, dim=16, seed=1)
    policy = RetrievalPolicy(encoder, 2, 4, 0.5, torch.Generator().manual_seed(0))
    events = [policy(q)[1] for q in ("p1 works", "c2 based", "p3 works")]
    zero = bridge_coefficients(torch.zeros(2), torch.tensor([0.3, 1.7]), gamma=4.0)
    assert torch.equal(zero, torch.zeros(2))
    retriever_pg_loss(policy.log_prob(events), torch.tensor([0, 0, 1]), zero).backward()
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in encoder.parameters())
    encoder.zero_grad()
    retriever_pg_loss(policy.log_prob(events), torch.tensor([0, 0, 1]), torch.tensor([1.0, -1.0])).backward()
    assert any(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in encoder.parameters())  # and not otherwise


def test_first_order_penalty_scheme_solves_a_quadratic_bilevel_problem():
    """upper F(phi, theta) = (theta - 1)^2 + phi^2, lower G(theta, phi) = (theta - phi)^2: theta*(phi) = phi, so the
    bilevel solution minimises (phi - 1)^2 + phi^2: phi* = theta* = 1/2 (the joint minimum of F is phi = 0, theta = 1).
    First-order: only gradients of F and G, theta_hat = K = 10 lower steps from theta; the penalty's bias is O(1 / gamma)."""
    phi, theta = 2.0, -1.0
    gaps = []
    for k in range(2000):
        gamma = penalty_weight(1.0, k, 1.0)
        theta_hat = theta
        for _ in range(10):
            theta_hat -= 0.25 * 2 * (theta_hat - phi)
        gaps.append((theta - phi) ** 2 - (theta_hat - phi) ** 2)
        # the leader first: grad_phi F = 2 phi, grad_phi G(t, phi) = -2 (t - phi)
        phi -= 0.5 / (1 + gamma) * leader_direction(2 * phi, -2 * (theta - phi), -2 * (theta_hat - phi), gamma)
        # then the follower, at the new phi
        theta -= 0.2 * follower_direction(2 * (theta - 1), 2 * (theta - phi), gamma)
    assert min(gaps) >= 0  # theta_hat is a better lower-level point: the penalty is non-negative
    assert [penalty_weight(1.0, k, 0.5) for k in range(5)] == sorted(penalty_weight(1.0, k, 0.5) for k in range(5))
    assert phi == pytest.approx(0.5, abs=0.01) and theta == pytest.approx(0.5, abs=0.01)


def test_memory_efficient_theta_hat_matches_the_copy_and_restores_the_policy(world):
    _, train, *_ = world
    lean, full = make_loop(world, memory_efficient=True), make_loop(world, memory_efficient=False)
    b = lean.rollout(train[:2])
    from posttrain.objectives.grpo import group_normalize

    adv = group_normalize(b.rewards, b.group)
    start = flat(lean.policy)
    hat_lean, hat_full = lean.theta_hat_logp(b, adv), full.theta_hat_logp(b, adv)
    assert torch.allclose(hat_lean, hat_full, atol=1e-5)
    assert torch.allclose(flat(lean.policy), start, atol=1e-6) and torch.equal(flat(full.policy), start)
    w = importance_weights(hat_lean, lean.sequence_logp(lean.policy, b), clip=5.0)
    assert w.mean().item() == pytest.approx(1.0, abs=1e-5)
    rows = episode_rows(lean.task, b.episodes, [lean.task.parse(t) for t in b.texts], b.examples)  # the MLflow example-episodes table
    assert len(rows) == len(b.texts) and rows[0]["question"] == train[0].prompt and rows[0]["gold"] == train[0].answer
    assert [r["queries"] for r in rows] == [" || ".join(c.query for c in ep.calls) for ep in b.episodes]
    if adv.abs().sum() > 0:  # the inner step moved theta: theta_hat gives the rollouts other log-probs
        assert not torch.allclose(hat_lean, lean.sequence_logp(lean.policy, b), atol=1e-7)


def test_the_retriever_steps_first_every_iteration_and_a_resumed_loop_continues_as_one_run(world):
    _, train, *_ = world
    whole = make_loop(world, arm="bridge")
    before = flat(whole.retrieval.retriever)
    history = whole.train(train, 2)
    assert whole.order == [("retriever", "policy")] * 2 and history[0]["gamma"] < history[1]["gamma"]
    assert not torch.equal(before, flat(whole.retrieval.retriever))
    first = make_loop(world, arm="policy_first")
    first.train(train, 1)
    assert first.order == [("policy", "retriever")]
    part = make_loop(world, arm="bridge")
    part.train(train, 1)
    state = copy.deepcopy(part.state_dict())
    resumed = make_loop(world, arm="bridge")
    resumed.load_state_dict(state)
    resumed.train(train, 1)
    assert torch.allclose(flat(whole.policy), flat(resumed.policy), atol=1e-6)
    assert torch.allclose(flat(whole.retrieval.retriever), flat(resumed.retrieval.retriever), atol=1e-6)
    assert resumed.order == whole.order
