"""The Thinking Reward Model (TRM): its judgement format, the pairwise training rewards grouped by pair, and
the `trm` RL reward on a model whose output does not parse (zero reward, never an error)."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.models import build_tiny, train_char_tokenizer
from posttrain.objectives.pd_grpo import margin_rewards, parse_trm_output
from posttrain.rewards.trm import SETTINGS_FILE, judge_prompt, pairwise_margin_reward, pd_grpo_reward, trm_reward
from posttrain.tasks import Example
from posttrain.trainers.trm import (JudgeTask, add_format_tokens, assessment, judge_examples, judgement, preferred_answers,
                                    warmup_examples)
from posttrain.data.preferences import PreferencePair


def out(score) -> str:
    return f"<rubric>85</rubric><assessment>yy</assessment><score>{score}</score>"


def test_warmup_judgements_parse_and_are_graded():
    assert assessment("84", "85") == "yn" and assessment("5", "85") == "ny" and assessment("", "7") == "n"
    exact, near, far = (parse_trm_output(judgement(y, "85", 10), 10) for y in ("85", "84", "9x"))
    assert (exact.score, near.score, far.score) == (10.0, 5.0, 0.0) and exact.rubric == "85" and near.assessment == "yn"


def test_judge_examples_pair_up_preferred_and_rejected():
    pairs = [PreferencePair("1+1=", "2", "3", 0.3, None), PreferencePair("2+2=", "4", "44", 0.6, None)]
    rows = judge_examples(pairs, 10, {"1+1=": "2", "2+2=": "5"})  # rubrics: the TRM's own answers, right or wrong
    assert [r.answer for r in rows] == ["0:w", "0:l", "1:w", "1:l"]
    assert rows[3].prompt == judge_prompt("2+2=", "44") == "44<judge>2+2="
    assert parse_trm_output(rows[3].completion, 10).rubric == "5" and parse_trm_output(rows[2].completion, 10).score == 0.0
    assert all(r.completion == "" for r in judge_examples(pairs, 10))


def test_reference_guided_warmup_judges_each_response_once_against_the_preferred_answer():
    pairs = [PreferencePair("1+1=", "2", "3", 0.3, None), PreferencePair("1+1=", "2", "11", 0.6, None),
             PreferencePair("2+2=", "4", "5", 0.3, None)]
    rubrics = preferred_answers(pairs)
    assert rubrics == {"1+1=": "2", "2+2=": "4"}
    rows = warmup_examples(pairs, 10, rubrics)
    assert [r.prompt for r in rows] == ["2<judge>1+1=", "3<judge>1+1=", "11<judge>1+1=", "4<judge>2+2=", "5<judge>2+2="]
    parsed = [parse_trm_output(r.completion, 10) for r in rows]
    assert [t.rubric for t in parsed] == ["2", "2", "2", "4", "4"] and [t.score for t in parsed] == [10.0, 0.0, 0.0, 10.0, 0.0]


def grouped(texts_w, texts_l, pair="0"):
    return [Example("p", "", f"{pair}:w")] * len(texts_w) + [Example("p", "", f"{pair}:l")] * len(texts_l), [*texts_w, *texts_l]


def test_pd_grpo_reward_pays_the_side_not_the_margin_and_zero_for_garbage():
    task = JudgeTask(score_max=10, alpha_format=0.5)
    examples, texts = grouped([out(6), out(10), "garbage", out(2)], [out(3), out(6), out(8), out(4)])
    r = pd_grpo_reward(task, examples, texts, [True] * 8)
    # W above median(L) = 4 gets 1 + 0.5 whatever its margin (6 or 10), garbage nothing; L vs median(W) = 6, tie 0.5
    assert r[:4].tolist() == [1.5, 1.5, 0.0, 0.5] and r[4:].tolist() == [1.5, 1.0, 0.5, 1.5]
    unfinished = pd_grpo_reward(task, examples, texts, [False] + [True] * 7)
    assert unfinished[0] == 0.0  # a judgement cut off by the token budget does not count


def test_rewards_of_two_pairs_in_one_batch_stay_apart():
    task = JudgeTask(score_max=10, alpha_format=0.0)
    e0, t0 = grouped([out(9), out(9)], [out(1), out(1)], pair="0")
    e1, t1 = grouped([out(1), out(1)], [out(9), out(9)], pair="1")  # the TRM has this pair backwards
    r = pd_grpo_reward(task, e0 + e1, t0 + t1, [True] * 8)
    assert r.tolist() == [1.0] * 4 + [0.0] * 4


def test_plain_pairwise_margin_pays_a_larger_margin_more():
    valid = torch.ones(2, dtype=torch.bool)
    r_w, r_l = margin_rewards(torch.tensor([6.0, 10.0]), valid, torch.tensor([4.0, 4.0]), valid, 10, 0.0)
    assert r_w[1] > r_w[0] and torch.allclose(r_w, torch.tensor([0.6, 0.8]))
    assert torch.allclose(r_l, torch.tensor([0.7, 0.7]))  # (1 + (8 - 4) / 10) / 2
    task = JudgeTask(score_max=10, alpha_format=0.5)
    examples, texts = grouped([out(6), "nope"], [out(4), out(4)])
    assert pairwise_margin_reward(task, examples, texts, [True] * 4).tolist()[1] == 0.0


class _RL:
    def __init__(self, path):
        self.path = path

    def options_for(self, name):
        assert name == "trm"
        return self


def test_trm_reward_of_an_untrained_model_is_zero_not_an_error(tmp_path):
    tokenizer = train_char_tokenizer(["0123456789+="])
    add_format_tokens(tokenizer)
    cfg = type("M", (), {"arch": "qwen2", "hidden_size": 16, "intermediate_size": 32, "layers": 1, "heads": 2, "kv_heads": 1,
                         "max_positions": 64, "dtype": "float32"})
    torch.manual_seed(0)
    model = build_tiny(cfg, tokenizer)
    (tmp_path / "model").mkdir()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / SETTINGS_FILE).write_text(json.dumps({"score_max": 10, "max_new_tokens": 12}))
    examples = [Example("12+30=", "42", "42")] * 3
    r = trm_reward(None, examples, ["42", "", "9+9=+<score>"], [True, False, True], rl=_RL(str(tmp_path)))
    assert r.shape == (3,) and r.tolist() == [0.0, 0.0, 0.0]


def test_trm_reward_without_a_model_is_a_user_error(tmp_path):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="rl.options.trm.path"):
        trm_reward(None, [Example("1+1=", "2", "2")], ["2"], [True], rl=_RL(str(tmp_path)))
