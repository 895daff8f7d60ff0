"""AURA (spec §12): the chronological market sandbox (recipes/aura/market.py, recipes/aura/task.py) and the direction-magnitude
score (recipes/aura/reward.py). Invariants: mean score = directional accuracy x conditional magnitude agreement exactly;
a wrong direction or an unparseable forecast scores 0; no tool ever returns data dated after the decision time
(property-tested over random calls by perturbing every later value); the demonstrations carry signal and the
reward varies within groups on the sandbox."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from posttrain import resolve
from posttrain.recipes.aura import market as M
from posttrain.recipes.aura.reward import bucket, score, score_parts
from posttrain.recipes.aura.task import tool_shares
from posttrain.rewards import reward_matrix, rewards
from posttrain.tasks import build_task
from posttrain.trainers.online_rl import reward_metrics

PARAMS = Path(__file__).resolve().parents[3] / "params.yaml"


@pytest.fixture(scope="module")
def task():
    cfg = resolve.load(PARAMS, ["task.name=market", "task.n_train=400", "task.n_heldout=100"])
    return build_task(cfg.task)


@pytest.fixture(scope="module")
def sandbox(task):
    return task.sandbox


# -- the score -------------------------------------------------------------------------------------------------------

def test_score_by_hand():
    assert score(+2.0, +1.5) == 1.0  # same sign, same bucket [1, 3)
    assert score(+2.0, +4.0) == 0.0  # right direction, wrong bucket
    assert score(-7.0, -6.5) == 1.0  # [6, inf)
    assert score(+0.5, -0.5) == 0.0  # wrong direction, same bucket
    assert score(0.0, 0.4) == 0.0  # a zero forecast has no direction
    assert score(None, 2.0) == 0.0  # unparseable
    assert score(+2.0, +3.0, "soft", tau=2.0) == pytest.approx(0.5)
    assert [bucket(x, (1.0, 3.0, 6.0)) for x in (0.0, 0.99, 1.0, -2.9, 3.0, 6.0, -40.0)] == [0, 0, 1, 1, 2, 3, 3]


@pytest.mark.parametrize("mode", ["buckets", "soft"])
def test_mean_score_is_directional_accuracy_times_conditional_magnitude_agreement(mode):
    rng = random.Random(0)
    for _ in range(20):
        pairs = [(None if rng.random() < 0.1 else round(rng.gauss(0, 4), 1), rng.gauss(0, 4)) for _ in range(rng.randrange(5, 60))]
        parts = [score_parts(f, r, mode) for f, r in pairs]
        scores = [score(f, r, mode) for f, r in pairs]
        directional = sum(d for d, _ in parts) / len(parts)
        right = [m for d, m in parts if d]
        conditional = sum(right) / len(right) if right else 0.0
        assert sum(scores) / len(scores) == pytest.approx(directional * conditional, abs=1e-12)
        assert all(0.0 <= s <= 1.0 for s in scores)
        for (f, _r), s, (d, m) in zip(pairs, scores, parts):
            if f is None or not d:  # wrong direction or unparseable: 0 whatever the magnitude
                assert s == 0.0 and math.isnan(m)


def test_the_abstracts_figures_are_the_product():
    """The spec's check: 62.9% x 33.3% = 20.94% and 65.4% x 66.2% = 43.31% (up to the rounding of the reported figures)."""
    assert 0.629 * 0.333 * 100 == pytest.approx(20.94, abs=0.02) and 0.654 * 0.662 * 100 == pytest.approx(43.31, abs=0.03)


def test_rewards_through_the_registry_and_the_logged_factors(task):
    examples = [task.example(0, 100, random.Random(0))] * 4
    realised = float(examples[0].answer)
    sign = "+" if realised > 0 else "-"
    right = f"[rel 5]=+1.0;{sign}{min(abs(realised), 9.9):.1f}"
    wrong_bucket = f"{sign}{0.1 if abs(realised) >= 1 else 8.0:.1f}"
    texts = [right, wrong_bucket, ("-" if sign == "+" else "+") + "2.0", "[rel 5]=+1.0;soon"]
    specs = [resolve.load(PARAMS, ["task.name=market", "rl.rewards=[{name: aura}, {name: aura_direction, weight: 0}, "
                                   "{name: aura_magnitude, weight: 0}]"]).rl.rewards][0]
    matrix, names, weights = reward_matrix(specs, task, examples, texts, [True] * 4)
    assert matrix[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0] and matrix[:, 1].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert matrix[:2, 2].tolist() == [1.0, 0.0] and torch.isnan(matrix[2:, 2]).all()
    cut = rewards.get("aura")(task, examples, [right], [False])  # an episode cut before EOS scores 0
    assert cut.tolist() == [0.0]
    batch = type("B", (), {"rewards": matrix, "reward_names": names, "reward_weights": weights})()
    logged = reward_metrics(batch)
    assert logged["reward/aura_magnitude_mean"] == 0.5  # the conditional agreement: over the two right directions
    assert logged["reward/aura_mean"] == pytest.approx(logged["reward/aura_direction_mean"] * logged["reward/aura_magnitude_mean"])


# -- no look-ahead -----------------------------------------------------------------------------------------------------

def _perturbed_after(sandbox: M.Sandbox, day: int, rng: np.random.Generator) -> M.Sandbox:
    """A copy whose every value dated after `day` is replaced by noise."""
    other = object.__new__(M.Sandbox)
    other.__dict__.update(sandbox.__dict__)
    other.close, other.volume, other.market = sandbox.close.copy(), sandbox.volume.copy(), sandbox.market.copy()
    other.close[:, day + 1 :] = rng.uniform(1, 500, other.close[:, day + 1 :].shape)
    other.volume[:, day + 1 :] = rng.uniform(1, 1e5, other.volume[:, day + 1 :].shape)
    other.market[day + 1 :] = rng.uniform(1, 500, other.market[day + 1 :].shape)
    return other


def test_no_tool_call_returns_data_after_the_decision_time(sandbox):
    """Property over random calls: a result is dated at or before the decision day, and changing every later value
    (the future) changes no result; unknown tools or windows answer nothing."""
    rng = random.Random(1)
    np_rng = np.random.default_rng(1)
    days = sandbox.decision_days
    for _ in range(60):
        day = rng.choice(days)
        future = _perturbed_after(sandbox, day, np_rng)
        past, past_future = sandbox.history(day), future.history(day)
        assert past.close.shape[1] == past.volume.shape[1] == past.market.shape[0] == day + 1
        for _ in range(10):
            ticker, name, window = rng.randrange(sandbox.n_tickers), rng.choice(M.TOOLS + ("peek",)), rng.choice(M.WINDOWS + (7,))
            result = M.call_tool(past, ticker, name, window, day)
            if name == "peek" or window == 7:
                assert result is None
                continue
            assert result.as_of <= day
            assert M.call_tool(past_future, ticker, name, window, day) == result
    assert M.call_tool(sandbox.history(100), 0, "price", 5, 99) is None  # a history of another day is refused


def test_the_tool_layer_refuses_a_result_dated_after_the_decision(sandbox, monkeypatch):
    monkeypatch.setitem(M._TOOL_FNS, "price", lambda h, i, n: M.ToolResult("1.0", h.day + 1))
    with pytest.raises(M.LookAhead):
        M.call_tool(sandbox.history(80), 0, "price", 5, 80)
    with pytest.raises(M.LookAhead):  # a history that holds more days than its date
        M.History(80, sandbox.close[:, :82], sandbox.volume[:, :82], sandbox.market[:82])


def test_episode_observations_do_not_depend_on_the_future(sandbox):
    rng, np_rng = random.Random(2), np.random.default_rng(2)
    for _ in range(5):
        ticker, day = rng.randrange(sandbox.n_tickers), rng.choice(sandbox.decision_days)
        future = _perturbed_after(sandbox, day, np_rng)
        actions = "[price 5][market 20][volume 10][rel 5]"
        seen = []
        for world in (sandbox, future):
            env = M.MarketEpisode(world, M.prompt_of(ticker, day), max_calls=8)
            env.reset()
            seen.append("".join(env.step(ch).observation for ch in actions))
        assert seen[0] == seen[1] and seen[0].count(";") == 4


# -- the episode and its text ---------------------------------------------------------------------------------------------

def test_an_episode_replays_the_analyst_and_parses_its_forecast(task, sandbox):
    for example in task.splits(0)["train"][:20]:
        ticker, day = M.parse_prompt(example.prompt)
        env = M.MarketEpisode(sandbox, example.prompt, max_calls=8)
        assert env.reset() == example.prompt
        actions = M.actions_of(example.completion)
        transcript = "".join(ch + env.step(ch).observation for ch in actions)
        assert transcript == example.completion and M.replays(sandbox, ticker, day, example.completion)
        assert task.reference_verified(example) and task.forecast(actions) is not None
    assert not M.replays(sandbox, ticker, day, example.completion.replace("=", "=9", 1))


def test_forecast_format_and_call_budget():
    assert M.parse_forecast("[rel 5]=+1.0;+1.2", 8) == 1.2 and M.parse_forecast("-0.3", 8) == -0.3
    for bad in ("[rel 5]+1.2x", "+1.2[rel 5]", "1.2", "+1.25", "[rel 5]", "", "+1.2+1.2"):
        assert M.parse_forecast(bad, 8) is None, bad
    assert M.parse_forecast("[rel 5]" * 3 + "+1.0", 2) is None
    env = M.MarketEpisode(M.Sandbox(0, 2, 100, 5), "A@70>", max_calls=1)
    env.reset()
    assert [env.step(c).done for c in "[rel 5]"][-1] is False and [env.step(c).done for c in "[rel 5]"][-1] is True
    assert env.step("x").observation == "" and M.MarketEpisode(M.Sandbox(0, 2, 100, 5), "A@70>", 8).step("[foo 5]").observation == "=?;"


def test_splits_are_chronological_and_deterministic(task):
    a, b = task.splits(0), task.splits(0)
    assert [e.completion for e in a["train"]] == [e.completion for e in b["train"]]
    last_train = max(M.parse_prompt(e.prompt)[1] for e in a["train"])
    first_held = min(M.parse_prompt(e.prompt)[1] for e in a["heldout"])
    assert last_train + task.opts.horizon < first_held  # every train outcome is known before the first held-out decision
    assert not {e.prompt for e in a["train"]} & {e.prompt for e in a["heldout"]}


def test_tool_shares_by_hand():
    shares = tool_shares(["[rel 5]=+1;[rel 5]=+1;+1.0", "[price 5]=1,+1;[foo 5]=?;-1.0", "+0.5"])
    assert shares["tools/share_rel"] == pytest.approx(2 / 3) and shares["tools/share_price"] == pytest.approx(1 / 3)
    assert shares["tools/share_volume"] == 0.0 and shares["tools/calls_per_episode"] == pytest.approx(4 / 3) and shares["tools/unknown_calls"] == 1.0


# -- signal ------------------------------------------------------------------------------------------------------------

def test_demonstrations_carry_signal_and_the_reward_varies_within_groups(task, sandbox):
    """The analyst's forecasts beat chance on direction and a constant forecast on the score; G = 8 analyst episodes of one
    decision (random tool plans, as a policy imitating them samples) disagree on the reward in many groups."""
    rng = random.Random(3)
    train = task.splits(0)["train"]
    demos = [task.correctness_reward(e.completion, True, e) for e in train]
    directions = [task.parts(e.completion, e)[0] for e in train]
    constant = [score(1.5, float(e.answer)) for e in train]
    assert sum(directions) / len(train) > 0.56 and sum(demos) > 1.1 * sum(constant)
    varied = 0
    for e in train[:100]:
        ticker, day = M.parse_prompt(e.prompt)
        group = [task.correctness_reward(M.scripted_analyst(sandbox, ticker, day, rng), True, e) for _ in range(8)]
        varied += max(group) > min(group)
    assert varied >= 20


def test_an_environment_task_refuses_an_eval_sampler_that_cannot_play_episodes(task):
    from posttrain.errors import UserError
    from posttrain.eval.harness import evaluate

    cfg = resolve.load(PARAMS, ["task.name=market", "eval.sampler=beam"])
    with pytest.raises(UserError, match="eval.sampler beam cannot play the episodes of a multi-turn task; use one that can: greedy, temperature$"):
        evaluate(None, None, task, [], cfg.eval, 0)
