"""The verifier rewards (rewards/verifiers.py): each accepts the reference and equivalent forms, and rejects a
perturbed answer; math_verify through the math-verify library."""

from __future__ import annotations

import math

import pytest

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.rewards import reward_matrix, rewards
from posttrain.rewards.verifiers import choice_letter, final_answer, normalize
from posttrain.tasks import Example


def score(name: str, answer: str, completions: list[str], rl=None) -> list[float]:
    examples = [Example("q", answer, answer)] * len(completions)
    extra = {"rl": rl} if "rl" in rewards.entry(name).meta.get("needs", ()) else {}
    return rewards.get(name)(None, examples, completions, [True] * len(completions), **extra).tolist()


# (reward, reference, accepted completions, rejected completions)
CASES = [
    ("exact_match", "Paris", ["Paris", "  Paris\n", "The answer is Paris.", "#### Paris", "so \\boxed{Paris}"],
     ["paris", "Pariss", "Paris, France", ""]),
    ("normalized_match", "1000", ["1,000", "1000.0", "$1,000", "The answer is 1000.", "\\boxed{1 000}".replace(" ", "")],
     ["1001", "100", "10,00 0", "one thousand"]),
    ("normalized_match", "The Eiffel Tower", ["eiffel tower", "  EIFFEL   tower!", "Answer: the Eiffel tower."],
     ["Eiffel", "Eiffel Towers", "tower eiffel"]),
    ("normalized_match", "0.5", ["0.50", ".5", "answer: +0.5"], ["5", "0.05", "05", "-0.5"]),
    ("normalized_match", "-3", ["-3.0", "answer: -3."], ["3", "- 3", "-30"]),
    ("multiple_choice", "B", ["(B)", "Answer: B", "b.", "B", "The answer is (b) because", "\\boxed{B}", "I pick (B)", "B) Paris"],
     ["(C)", "Answer: A", "a.", "A cat sat on the mat", ""]),
    ("multiple_choice", "(C)", ["C", "answer is c."], ["(B)", "D"]),
    ("math_verify", "\\frac{1}{2}", ["0.5", "$\\frac{1}{2}$", "The answer is $\\boxed{\\frac{2}{4}}$", "1/2", "$0.5$"],
     ["0.51", "$\\frac{1}{3}$", "\\boxed{2}", "no idea"]),
    ("math_verify", "0.5", ["\\boxed{\\frac{1}{2}}", "$\\dfrac{1}{2}$"], ["\\boxed{\\frac{1}{2}+1}"]),
    ("math_verify", "$x^2 + 2x + 1$", ["$(x+1)^2$", "\\boxed{x^2+2x+1}"], ["$(x+1)^3$", "$x^2+2x$"]),
    ("math_verify", "\\sqrt{2}", ["$\\sqrt{2}$", "$\\frac{2}{\\sqrt{2}}$"], ["$\\sqrt{3}$", "1.5"]),
    ("math_verify", "1000", ["\\boxed{1000}", "1,000"], ["\\boxed{1001}"]),
]


@pytest.mark.parametrize("name, answer, accepted, rejected", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_verifier_accepts_the_reference_and_equivalent_forms_and_rejects_perturbations(name, answer, accepted, rejected):
    assert score(name, answer, [answer]) == [1.0], f"{name} rejects its own reference {answer!r}"
    got = dict(zip(accepted, score(name, answer, accepted)))
    assert all(v == 1.0 for v in got.values()), f"{name} should accept: {got}"
    got = dict(zip(rejected, score(name, answer, rejected)))
    assert all(v == 0.0 for v in got.values()), f"{name} should reject: {got}"


def test_math_verify_reads_a_bare_reference_as_latex():
    assert score("math_verify", "(0, 1]", ["the interval $(0,1]$", "\\boxed{(0, 1]}", "$(0, 1)$", "$[0, 1]$"]) == [1, 1, 0, 0]


def test_a_reference_the_verifier_cannot_read_is_unscored_not_wrong():
    assert math.isnan(score("multiple_choice", "Paris", ["B"])[0])
    assert math.isnan(score("math_verify", "", ["1"])[0])


def test_regex_match_takes_its_pattern_from_the_options(params_path):
    cfg = resolve.load(params_path)  # default: the last number, normalised
    assert score("regex_match", "1000", ["12 steps, so 1,000", "1000 then 7", "none"], cfg.rl) == [1.0, 0.0, 0.0]
    rl = resolve.updated(cfg.rl, "rl", options={"regex_match": {"pattern": r"ANSWER=(\w+)", "normalize": False}})
    assert score("regex_match", "Yes", ["ANSWER=No ... ANSWER=Yes", "ANSWER=yes", "Yes"], rl) == [1.0, 0.0, 0.0]
    with pytest.raises(UserError, match=r"rl.options.regex_match.pattern: not a valid regular expression"):
        resolve.updated(cfg.rl, "rl", options={"regex_match": {"pattern": "(unclosed"}})


def test_every_verifier_is_an_rl_reward_in_one_reward_matrix(params_path):
    names = ["exact_match", "normalized_match", "multiple_choice", "regex_match", "math_verify"]
    overrides = ["rl.rewards=[" + ", ".join(f"{{name: {n}}}" for n in names) + "]"]
    cfg = resolve.load(params_path, overrides)
    examples = [Example("12+30=", "42", "42")] * 2
    matrix, got, _ = reward_matrix(cfg.rl.rewards, None, examples, ["42", "43"], [True, True], rl=cfg.rl)
    assert got == tuple(names)
    assert matrix[0].tolist()[:2] + matrix[0].tolist()[3:] == [1.0] * 4 and math.isnan(matrix[0, 2])  # "42" names no letter
    assert matrix[1].tolist()[:2] + matrix[1].tolist()[3:] == [0.0] * 4


def test_the_helpers():
    assert final_answer("so \\boxed{\\frac{a}{b}} and more") == "\\frac{a}{b}"
    assert final_answer("\\boxed{1} then \\boxed{2}") == "2"
    assert final_answer("Answer: 7.\nThe answer is 8.") == "8"
    assert normalize("The  Answer: 1,000.0!") == "answer 1000"
    assert choice_letter("nothing here") is None
