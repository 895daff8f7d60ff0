"""CARE (Context-Adaptive Rubric Evolution) on hand-made inputs: the dialogue task's truth and judges, the `care` reward and its weight
sources, the rubric generator's task and its fallback on unparseable output."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import REPO
from posttrain import resolve
from posttrain.resolve import load
from posttrain.errors import UserError
from posttrain.rewards import reward_matrix
from posttrain.recipes.care.reward import RubricGenerator, care_weight_sources
from posttrain.tasks import Example, build_task
from posttrain.recipes.care import dialogue as D
from posttrain.recipes.care import rubric as G
from posttrain.recipes.care.rubric import format_rubric, parse_rubric, turn_reward


def contexts() -> list[str]:
    """One context per (state, turn) of the truth table, with a distracting history."""
    return ["|".join(["hj>qs"] * (turn - 1) + [f"{state}m>"]) for state in D.STATES for turn in range(1, D.MAX_TURNS + 1)]


@pytest.fixture(scope="module")
def cfg():
    return load(REPO / "params.yaml")


@pytest.fixture(scope="module")
def dialogue_cfg():
    return load(REPO / "params.yaml", ["task.name=dialogue", "task.n_train=60", "task.n_heldout=20", "rl.rewards=[{name: care}]"])


def test_every_context_is_solvable_and_the_ideal_weighting_moves_with_the_turn():
    for ctx in contexts():
        w = D.ideal_weights(ctx)
        assert sum(w) == pytest.approx(1.0) and min(w) > 0
        best = D.best_reply(ctx)
        assert D.true_quality(ctx, best) == pytest.approx(D.best_quality(ctx)) and D.best_quality(ctx) < 1.0
        others = [r for r in G.candidate_replies() if set(r) != set(best)]
        assert all(D.true_quality(ctx, r) < D.best_quality(ctx) - 1e-9 for r in others)  # a unique best pair of dimensions
    best_pairs = {state: {frozenset(D.best_reply(c)) for c in contexts() if c.endswith(f"{state}m>")} for state in D.STATES}
    assert any(len(pairs) > 1 for pairs in best_pairs.values())  # the best reply changes with the turn


def test_judges_and_format():
    assert D.judge_scores("qvqv") == (1.0, 1.0, 0.0) and D.judge_scores("qqs") == (1.0, 0.0, 0.5) and D.judge_scores("qqqq") == (1.0, 0.0, 0.0)
    for bad, finished in [("qqvvs", True), ("", True), ("qx", True), ("qq", False)]:
        assert D.judge_scores(bad, finished) == (0.0, 0.0, 0.0)
    with pytest.raises(UserError):
        D.ideal_weights("zz>")


def test_task_splits_are_disjoint_and_references_are_best(dialogue_cfg):
    task = build_task(dialogue_cfg.task)
    splits = task.splits(0)
    prompts = [e.prompt for s in splits.values() for e in s]
    assert len(set(prompts)) == len(prompts) == 80 and splits == task.splits(0)
    for e in splits["train"]:
        assert task.format_reward(e.completion, True) == 1.0 and task.correctness_reward(e.completion, True, e) == 1.0
        assert set(e.prompt + e.completion) <= set(task.alphabet())


def test_compact_rubrics_parse_and_failures_fall_back_to_uniform():
    w, ok = parse_rubric("c=2,a=6,p=2")
    assert ok and torch.allclose(w, torch.tensor([0.2, 0.6, 0.2])) and parse_rubric(format_rubric((1, 7, 2)))[1]
    for bad in ["", "c=2,a=6", "c=0,a=0,p=0", "c=,a=1,p=1", "c=2,a=6,p=2"[:7]]:
        w, ok = parse_rubric(bad)
        assert not ok and torch.allclose(w, torch.full((3,), 1 / 3))


def score(cfg, source: str, prompts: list[str], replies: list[str]) -> torch.Tensor:
    rl = resolve.updated(cfg.rl, "rl", options={"care": {"source": source, "path": "nowhere"}})
    examples = [Example(p, "", "") for p in prompts]
    matrix, names, _ = reward_matrix(rl.rewards, None, examples, replies, [True] * len(replies), rl=rl)
    assert names == ("care",)
    return matrix[:, 0]


def test_uniform_source_is_the_static_rubric_and_oracle_is_the_true_quality(dialogue_cfg):
    rng = random.Random(0)
    prompts = contexts()
    replies = [D.random_reply(rng) for _ in prompts[:-1]] + ["not a reply"]
    uniform = score(dialogue_cfg, "uniform", prompts, replies)
    static = torch.tensor([sum(D.judge_scores(r)) / 3 for r in replies])
    assert torch.allclose(uniform, static) and float(uniform[-1]) == 0.0
    oracle = score(dialogue_cfg, "oracle", prompts, replies)
    assert torch.allclose(oracle, torch.tensor([D.true_quality(p, r) for p, r in zip(prompts, replies)]))
    assert bool(((oracle >= 0) & (oracle <= 1)).all())


def test_generator_source_without_a_model_is_a_user_error(dialogue_cfg):
    with pytest.raises(UserError, match="rl.options.care.path"):
        score(dialogue_cfg, "generator", contexts()[:2], ["qr", "ve"])


def test_unparseable_generator_output_falls_back_to_uniform_without_crashing(monkeypatch):
    outputs = {"xm>": "c=1,a=8,p=1", "om>": "c=1,a=8", "hm>": "#?"}
    monkeypatch.setattr(G, "generate_rubrics", lambda model, tok, prompts: [outputs[p] for p in prompts])
    gen = RubricGenerator.__new__(RubricGenerator)
    gen.model = gen.tokenizer = None
    gen.cache, gen.generated, gen.fallbacks = {}, 0, 0
    w = gen.weights(["xm>", "om>", "hm>", "xm>"])
    assert torch.allclose(w[0], torch.tensor([0.1, 0.8, 0.1])) and torch.allclose(w[1:3], torch.full((2, 3), 1 / 3))
    assert torch.allclose(w[3], w[0]) and (gen.generated, gen.fallbacks) == (3, 2)  # cached: the repeat is not regenerated
    assert torch.allclose(w.sum(-1), torch.ones(4)) and bool((w >= 0).all())


def test_unknown_weight_source_is_refused_by_the_config():
    params_path = REPO / "params.yaml"
    with pytest.raises(UserError, match="rl.options.care.source"):
        load(params_path, ["task.name=dialogue", "rl.rewards=[{name: care}]", "rl.options.care.source=oracel"])
    with pytest.raises(UserError, match="care needs task.name in"):
        load(params_path, ["rl.rewards=[{name: care}]"])
    assert set(care_weight_sources.names()) == {"generator", "uniform", "oracle"}


def test_rubric_task_rewards_rubrics_that_rank_the_preferred_reply_higher(cfg):
    ctx = "xm>"  # truth (0.2, 0.7, 0.1): affective + cognitive is the best reply
    pairs = [("vvqq", "vvss"), ("vvss", "qqss")]
    example = Example(ctx, "", G.encode_pairs(pairs))
    task = G.RubricTask(cfg.care)
    assert task.correctness_reward(G.true_rubric(ctx), True, example) == 1.0
    assert task.correctness_reward("c=1,a=7,p=2", True, example) == 0.5  # proactive over cognitive: loses the first pair
    assert task.correctness_reward("garbage", True, example) == 0.0  # uniform fallback: both pairs tie, and a tie is no win
    assert task.format_reward("c=1,a=7,p=2", True) == 1.0 and task.format_reward("garbage", True) == 0.0
    assert G.decode_pairs(example.answer) == pairs


def test_simulated_labels_and_preferences(cfg):
    rng = random.Random(0)
    assert G.annotator_label("xm>|om>|wm>", "turn_blind", 0.0, rng) == format_rubric(D.IDEAL_TENTHS["w"][0])
    assert G.annotator_label("xm>|om>|wm>", "none", 0.0, rng) == G.true_rubric("xm>|om>|wm>")
    noisy = parse_rubric(G.annotator_label("wm>", "none", 1.0, rng))[0]
    assert 0.5 * float((noisy - torch.tensor(D.ideal_weights("wm>"))).abs().sum()) == pytest.approx(0.1)
    for w, l in G.human_pairs("om>|hm>", 50, 0.0, rng):
        assert D.true_quality("om>|hm>", w) > D.true_quality("om>|hm>", l)
    held = [Example(c, "", G.encode_pairs(G.human_pairs(c, 4, 0.0, rng))) for c in contexts()]
    truth = G.rubric_quality([G.true_rubric(c) for c in contexts()], held)
    assert truth == {"weight_error": pytest.approx(0.0, abs=1e-6), "pair_accuracy": 1.0, "top2_agreement": 1.0, "parse_rate": 1.0}
    assert float(turn_reward(torch.full((3,), 1 / 3), torch.tensor(D.judge_scores("qvqv")))) == pytest.approx(2 / 3)
