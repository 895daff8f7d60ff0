"""experiments/roft_vs_grpo.py's pieces: the SFT examples that teach the retrospection format, and the measure of
ROFT's premise (its retrospections read as answers, against the attempts they explain) on a hand-made batch."""

from __future__ import annotations

import importlib.util
import math
import sys
from types import SimpleNamespace

import torch

from helpers import REPO
from posttrain.tasks import Example
from posttrain.trainers import contexts


def load():
    sys.path.insert(0, str(REPO / "experiments"))
    spec = importlib.util.spec_from_file_location("claim_roft_vs_grpo", REPO / "experiments" / "roft_vs_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


E = load()


def example(a: int, b: int) -> Example:
    return Example(prompt=f"{a:02d}+{b:02d}=", completion=str(a + b), answer=str(a + b))


def test_retrospection_examples_end_in_the_reference_after_a_right_and_a_wrong_attempt():
    plain = [example(a, b) for a in range(10, 30) for b in range(40, 45)]
    out = E.retrospection_examples(plain, seed=0)
    assert len(out) == 2 * len(plain)
    for i in range(len(plain)):  # each example twice: after its right attempt (ok), then after a failed one
        assert [r.prompt.split(contexts.INCORRECT, 1)[1][0] for r in out[2 * i : 2 * i + 2]] == [contexts.OUTCOME_OK, contexts.OUTCOME_FAILED]
    outcomes = set()
    for e, r in zip((e for e in plain for _ in range(2)), out):
        assert (r.completion, r.answer) == (e.completion, e.answer)  # the target: the reference, never the attempt
        attempt, rest = r.prompt.split(contexts.INCORRECT, 1)
        feedback, prompt = rest[0], rest[1:]
        assert prompt == contexts.SEP + e.prompt and r.prompt == contexts.retrospection_prompt(e, attempt, feedback)
        # the outcome tells the truth about the attempt: right ones are `ok`, near misses `failed`
        assert (attempt == e.completion) == (feedback == contexts.OUTCOME_OK)
        if feedback == contexts.OUTCOME_FAILED:
            assert abs(int(attempt) - int(e.answer)) in {1, 2, 10}  # answers >= 50: no abs() fold
        outcomes.add(feedback)
    assert outcomes == {contexts.OUTCOME_OK, contexts.OUTCOME_FAILED}
    assert out == E.retrospection_examples(plain, seed=0) and out != E.retrospection_examples(plain, seed=1)



def test_retrospection_examples_take_a_models_own_wrong_attempt_where_it_has_one():
    """With `failures`, a failed row's attempt is one of that example's own wrong attempts; an example without any
    falls back to a near miss. The outcome still tells the truth and the target is still the reference."""
    plain = [example(a, b) for a in range(10, 30) for b in range(40, 45)]
    failures = [[str(a + b + 7), "x1"] if a % 2 else [] for a in range(10, 30) for b in range(40, 45)]
    out = E.retrospection_examples(plain, seed=0, failures=failures)
    used = {True: 0, False: 0}
    for e, r, own in zip((e for e in plain for _ in range(2)), out, (f for f in failures for _ in range(2))):
        assert (r.completion, r.answer) == (e.completion, e.answer)
        attempt, rest = r.prompt.split(contexts.INCORRECT, 1)
        if rest[0] == contexts.OUTCOME_FAILED:
            assert attempt in own if own else abs(int(attempt) - int(e.answer)) in {1, 2, 10}
            used[bool(own)] += 1
        else:
            assert attempt == e.completion
    assert used[True] > 0 and used[False] > 0
    assert out == E.retrospection_examples(plain, seed=0, failures=failures)

class CharTokenizer:
    """Digits as ids 1-10, 0 as padding: what retrospection_stats needs of a tokenizer."""

    pad_token_id = 0

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(str(int(i) - 1) for i in row if int(i) != 0) for row in ids]


def encode(text: str) -> list[int]:
    return [int(c) + 1 for c in text]


def test_retrospection_stats_scores_the_retrospection_tokens_against_the_attempts():
    """Two prompts, two attempts each: attempts right on rows 0 and 2; retrospections right on rows 0, 1 and 2, and
    row 1's retrospection (after a failed attempt) differs from its attempt. Prompt tokens (loss mask 0) are not read."""
    prompts = [example(12, 30), example(20, 21)]  # answers 42 and 41
    retro_texts, attempts = ["42", "42", "41", "40"], ["42", "43", "41", "40"]
    width = 5
    retro = torch.zeros(4, 3, width, dtype=torch.long)
    for i, text in enumerate(retro_texts):
        ids = encode("99" + text)  # two prompt tokens, then the retrospection
        retro[i, 0, : len(ids)] = torch.tensor(ids)
        retro[i, 1, : len(ids)] = 1
        retro[i, 2, 2 : len(ids)] = 1
    correct = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    batch = SimpleNamespace(extras={"retrospections": retro}, group=torch.tensor([0, 0, 1, 1]), rewards=correct, reward_names=("correctness",))
    task = SimpleNamespace(correctness_reward=lambda text, finished, e: float(text == e.answer))
    stats = E.retrospection_stats(CharTokenizer(), task, SimpleNamespace(batch=batch, prompts=prompts, texts=attempts))
    assert stats["attempt_acc"] == 0.5 and stats["retro_acc"] == 0.75
    assert stats["retro_acc_after_fail"] == 0.5 and stats["failed_attempts"] == 2
    assert stats["retro_repeats_attempt"] == 0.75


def test_mean_leaves_out_steps_without_a_failed_attempt():
    assert E.mean([0.5, math.nan, 0.25]) == 0.375 and math.isnan(E.mean([math.nan]))
