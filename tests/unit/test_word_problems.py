"""The example dataset (examples/word_problems): seeded, disjoint, and its references agree with `math_verify`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from posttrain.rewards.verifiers import math_verify
from posttrain.tasks import Example

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "word_problems" / "generate.py"


def load_generator():
    spec = importlib.util.spec_from_file_location("word_problems", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generation_is_seeded_distinct_and_covers_every_template():
    gen = load_generator()
    train, heldout = gen.generate(600, 300, seed=3)
    assert (train, heldout) == gen.generate(600, 300, seed=3)
    assert gen.generate(600, 300, seed=4) != (train, heldout)
    questions = [row["question"] for row in train + heldout]
    assert len(set(questions)) == len(questions) == 900
    assert {row["kind"] for row in heldout} == set(gen.TEMPLATES)


def test_math_verify_accepts_every_held_out_reference_and_rejects_perturbed_answers():
    _, heldout = load_generator().generate(600, 300, seed=0)
    examples = [Example(row["question"], row["solution"], row["answer"]) for row in heldout]
    finished = [True] * len(examples)
    solutions = [row["solution"] for row in heldout]
    assert math_verify(None, examples, solutions, finished).tolist() == [1.0] * len(examples)
    off_by_one = [f"so the answer is {int(row['answer']) + 1}." for row in heldout]
    assert math_verify(None, examples, off_by_one, finished).sum() == 0
    restated = [s.replace("so the answer is", "which gives") for s in solutions]  # the final number is still the answer
    assert math_verify(None, examples, restated, finished).tolist() == [1.0] * len(examples)
