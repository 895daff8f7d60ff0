"""GLIME's gradient projection and CARE's rubric weights and rewards, on hand-made tensors."""

from __future__ import annotations

import pytest
import torch

from posttrain.recipes.editing.glime import project_gradient, project_parameter_grads
from posttrain.recipes.care.rubric import parse_rubric_weights, rubric_preference_reward, turn_reward


def test_projection_removes_the_conflict():
    g, g_ref = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.0, 1.0, 1.0])
    assert float(torch.dot(g, g_ref)) < 0
    projected = project_gradient(g, g_ref)
    assert float(torch.dot(projected, g_ref)) == pytest.approx(0.0, abs=1e-6)
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        a, b = torch.randn(7, generator=gen), torch.randn(7, generator=gen)
        assert float(torch.dot(project_gradient(a, b), b)) >= -1e-6


def test_no_conflict_or_empty_buffer_leaves_g_unchanged():
    g = torch.tensor([1.0, 2.0])
    assert project_gradient(g, None) is g and project_gradient(g, torch.tensor([1.0, 0.0])) is g


def test_parameter_grads_are_projected_in_place():
    layer = torch.nn.Linear(2, 1, bias=False)
    layer.weight.grad = torch.tensor([[1.0, -1.0]])
    assert project_parameter_grads([layer.weight], [torch.tensor([[0.0, 1.0]])])
    assert torch.allclose(layer.weight.grad, torch.tensor([[1.0, 0.0]]))
    assert not project_parameter_grads([layer.weight], None)


@pytest.mark.parametrize("text,expected", [
    ("cognitive=0.5 affective=0.3 proactive=0.2", [0.5, 0.3, 0.2]),
    ("cognitive: 2, affective: 1, proactive: 1", [0.5, 0.25, 0.25]),
    ("cognitive=-1 affective=1 proactive=1", [0.0, 0.5, 0.5]),
])
def test_weights_are_clipped_and_renormalised(text, expected):
    w = parse_rubric_weights(text)
    assert torch.allclose(w, torch.tensor(expected)) and float(w.sum()) == pytest.approx(1.0) and bool((w >= 0).all())


@pytest.mark.parametrize("text", ["", "be kind", "cognitive=0.5 affective=0.5", "cognitive=0 affective=0 proactive=0", "cognitive=nan"])
def test_unparseable_weights_fall_back_to_uniform(text):
    assert torch.allclose(parse_rubric_weights(text), torch.full((3,), 1 / 3))


def test_turn_reward_bounds_and_static_rubric():
    scores = torch.tensor([[0.2, 0.9, 0.4], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    uniform = parse_rubric_weights("")
    assert torch.allclose(turn_reward(uniform, scores), scores.mean(-1))
    r = turn_reward(parse_rubric_weights("cognitive=0.7 affective=0.2 proactive=0.1"), scores)
    assert bool(((r >= 0) & (r <= 1)).all())


def test_generator_reward_is_one_exactly_when_the_preferred_reply_ranks_higher():
    preferred, rejected = torch.tensor([0.9, 0.2, 0.5]), torch.tensor([0.3, 0.8, 0.5])
    cognitive_heavy, affective_heavy = torch.tensor([0.8, 0.1, 0.1]), torch.tensor([0.1, 0.8, 0.1])
    assert float(rubric_preference_reward(cognitive_heavy, preferred, rejected)) == 1.0
    assert float(rubric_preference_reward(affective_heavy, preferred, rejected)) == 0.0
    assert float(rubric_preference_reward(torch.full((3,), 1 / 3), rejected, rejected)) == 0.0  # a tie is not a win
