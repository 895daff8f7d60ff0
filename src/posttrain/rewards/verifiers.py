"""Verifiers for real data: rewards that compare a completion's final answer with the example's reference
answer (`Example.answer`), 1.0 when they agree and 0.0 otherwise, on any task.

The final answer of a completion is the content of its last `\\boxed{...}`, else what follows its last `####`
(GSM8K's marker) or `answer:` / `answer is` (to the end of that line, a closing period dropped), else the whole
completion, stripped. A reference the verifier cannot read scores NaN (unscored, counted in `reward/nan_count`)
rather than 0: the data is at fault, not the policy. Whether the completion ended (EOS) is not looked at; add
the task's `format` reward for that.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

import torch
from pydantic import field_validator
from torch import Tensor

from posttrain.config import Section
from posttrain.rewards import rewards

_ANCHOR = re.compile(r"(?:####|\banswer\s*(?:is\b|:))[ \t]*(?P<rest>[^\n]*)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?!\w)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_PUNCTUATION = re.compile(r"(?!(?<=\d)\.(?=\d)|-(?=\d))[^\w\s]")  # every symbol but a decimal point and a minus sign
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None without one."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
    return None  # unbalanced: cut off mid-answer


def final_answer(completion: str) -> str:
    """The part of `completion` that states its answer (see the module docstring)."""
    inside = boxed(completion)
    if inside is not None:
        return inside
    anchored = list(_ANCHOR.finditer(completion))
    if anchored:
        return anchored[-1]["rest"].strip().removesuffix(".").strip()
    return completion.strip()


def canonical_number(number: str) -> str:
    """A decimal number written one way: "1000.0" -> "1000", "0.50" -> "0.5", "+.5" -> "0.5", "-0" -> "0"."""
    try:
        value = Decimal(number).normalize()
    except InvalidOperation:
        return number
    return format(value, "f") if value != 0 else "0"


def normalize(text: str) -> str:
    """Case, whitespace, punctuation, articles and number formatting removed: "The  Answer: 1,000.0!" -> "answer 1000"."""
    text = _THOUSANDS.sub("", text.casefold())
    text = _NUMBER.sub(lambda m: f" {canonical_number(m[0])} ", text)
    return " ".join(_ARTICLES.sub(" ", _PUNCTUATION.sub(" ", text)).split())


def _scored(matches: Sequence[float | None]) -> Tensor:
    return torch.tensor([float("nan") if m is None else float(m) for m in matches], dtype=torch.float32)


@rewards.register("exact_match")
def exact_match(task, examples, completions: Sequence[str], finished) -> Tensor:
    """1 when the completion's final answer is the reference answer exactly (surrounding whitespace aside)."""
    return _scored([final_answer(c) == e.answer.strip() for c, e in zip(completions, examples)])


@rewards.register("normalized_match")
def normalized_match(task, examples, completions: Sequence[str], finished) -> Tensor:
    """1 when the final answer equals the reference once both are normalised: case, whitespace, punctuation,
    articles and numbers ("1,000" = "1000.0" = "$1000")."""
    return _scored([normalize(final_answer(c)) == normalize(e.answer) for c, e in zip(completions, examples)])


# --- multiple choice --------------------------------------------------------------------------------------

_CHOICE_PATTERNS = (  # tried in order; the last match of the first pattern that matches is the choice
    re.compile(r"\\boxed\s*\{\s*\(?([A-Za-z])\)?\s*\}"),
    re.compile(r"answer\s*(?:is|:)?\s*(?:option\s*)?(?:\(([A-Za-z])\)|([A-Za-z])(?=\s*(?:$|[.)\],;:!])))", re.IGNORECASE),
    re.compile(r"^\s*\(?([A-Za-z])(?:[).:]|\s*$)"),  # "B", "b.", "(B)", "B) because ..." at the start
    re.compile(r"\(([A-Z])\)"),  # "(B)" anywhere
)


def choice_letter(text: str) -> str | None:
    """The option letter `text` chooses ("(B)", "Answer: B", "b.", "\\boxed{C}"), upper-case; None without one."""
    for pattern in _CHOICE_PATTERNS:
        found = list(pattern.finditer(text))
        if found:
            return next(g for g in found[-1].groups() if g).upper()
    return None


@rewards.register("multiple_choice")
def multiple_choice(task, examples, completions: Sequence[str], finished) -> Tensor:
    """1 when the completion chooses the reference option letter ("(B)", "Answer: B", "b."); the reference may be
    written the same ways. NaN when the reference names no letter."""
    scores = []
    for completion, example in zip(completions, examples):
        gold = choice_letter(example.answer)
        scores.append(None if gold is None else choice_letter(completion) == gold)
    return _scored(scores)


# --- a regular expression ---------------------------------------------------------------------------------

class RegexMatchOptions(Section):
    pattern: str = "-?[\\d,]*\\.?\\d+"  # the answer is its last match in the completion: group 1 if the pattern has a group, else the match
    normalize: bool = True  # compare normalised (as normalized_match does) instead of exactly

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression ({e})") from None
        return v


def regex_answer(completion: str, pattern: re.Pattern) -> str | None:
    found = list(pattern.finditer(completion))
    if not found:
        return None
    return (found[-1].group(1) if pattern.groups else found[-1].group(0)).strip()


@rewards.register("regex_match", needs=("rl",), options=RegexMatchOptions)
def regex_match(task, examples, completions: Sequence[str], finished, *, rl) -> Tensor:
    """1 when the last match of `rl.options.regex_match.pattern` in the completion is the reference answer
    (normalised first when `normalize`); 0 when the pattern does not match."""
    opts: RegexMatchOptions = rl.options_for("regex_match")
    pattern, same = re.compile(opts.pattern), (normalize if opts.normalize else str.strip)
    scores = []
    for completion, example in zip(completions, examples):
        answer = regex_answer(completion, pattern)
        scores.append(answer is not None and same(answer) == same(example.answer))
    return _scored(scores)


# --- math -------------------------------------------------------------------------------------------------

def math_reference(answer: str) -> str:
    """A reference answer as math-verify reads gold best: bare LaTeX ("\\sqrt{2}", "(0, 1]") inside `$...$`."""
    return answer if "$" in answer or "\\boxed" in answer else f"${answer}$"


@rewards.register("math_verify")
def math_verify(task, examples, completions: Sequence[str], finished) -> Tensor:
    """1 when the completion's answer is mathematically equal to the reference, by the math-verify library
    (`\\boxed{}`, LaTeX, fractions vs decimals, equivalent expressions, sets, intervals); NaN when the reference
    does not parse.

    A bare reference is read as LaTeX math, and so is the final answer of a completion in which math-verify
    finds nothing (no `$...$`, `\\boxed{}` or plain expression)."""
    from math_verify import parse, verify

    # math-verify bounds its sympy work with SIGALRM, which only the main thread may set
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    golds: dict[str, list] = {}
    scores = []
    for completion, example in zip(completions, examples):
        if example.answer not in golds:
            golds[example.answer] = parse(math_reference(example.answer), parsing_timeout=timeout)
        gold = golds[example.answer]
        if not gold:
            scores.append(None)
            continue
        target = parse(completion, parsing_timeout=timeout) or parse(f"${final_answer(completion)}$", parsing_timeout=timeout)
        scores.append(verify(gold, target, timeout_seconds=timeout))
    return _scored(scores)
