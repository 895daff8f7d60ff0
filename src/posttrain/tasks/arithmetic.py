"""Multi-digit arithmetic: "37+48=" -> "85".

Operands have exactly `digits` digits written zero-padded, so every prompt has the same length; the
answer format is an optionally signed integer with no leading zeros, ended by EOS. Train and held-out
prompts are drawn without replacement from the full operand grid, so the splits are disjoint.

Quality tags (`task.options.arithmetic.quality_tags`), so that test-time self-distillation's counterfactual
contexts (rollout/beam.py) mean something to a model trained here: a `careless_fraction` of the train
solutions carry a planted error (one digit of the answer changed), the others are correct; a `tagged_fraction`
of the train examples have their prompt prefixed by their quality, `expert_tag` before a correct solution and
`careless_tag` before a planted error, and the rest stay untagged, so the plain context sees the same mixture.
Held-out prompts are untagged with correct answers.

Worked steps (`task.options.arithmetic.worked_steps`, for `+` and `*`), so that a think trace is real intermediate
reasoning (ThinkOPD, objectives/distill/think_opd.py): a completion is `<steps>:<answer>`, the steps following one
of two routes, drawn per example among `routes`:

    column  addition column by column from the units, with carries        37+48=  ->  7+8=15,3+4+1=8:85
            multiplication by each digit of b from the units              37*48=  ->  37*8=296,37*4=148:1776
    split   b's place-value parts added (multiplied) one at a time,       37+48=  ->  37+40=77,77+8=85:85
            highest first, then the partial products summed               37*48=  ->  37*40=1480,37*8=296,1480+296=1776:1776

The verifier reads the answer after the last `:`; `think_trace` is the steps before it.
"""

from __future__ import annotations

import operator
import random
import re
from typing import Literal

from pydantic import Field

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_ANSWER = re.compile(r"-?(0|[1-9][0-9]*)")
_WORKED = re.compile(r"(?P<steps>[0-9+*=,]+):(?P<answer>-?(0|[1-9][0-9]*))")
ROUTES = ("column", "split")


class ArithmeticOptions(Section):
    quality_tags: bool = False  # false: every train solution is correct and untagged
    careless_fraction: float = Field(0.3, ge=0.0, le=1.0)  # train solutions with a planted error
    tagged_fraction: float = Field(0.5, ge=0.0, le=1.0)  # train examples whose prompt starts with their quality tag
    expert_tag: str = Field("expert, verified: ", min_length=1)  # before a correct solution (eval.options.ttsd.positive)
    careless_tag: str = Field("careless: ", min_length=1)  # before a planted error (eval.options.ttsd.negative)
    worked_steps: bool = False  # true: completions are "<steps>:<answer>" (operations + and * only)
    routes: tuple[Literal["column", "split"], ...] = Field(("column", "split"), min_length=1)  # worked_steps: the routes references follow


@tasks.register("arithmetic", options=ArithmeticOptions)
class Arithmetic(Task):
    def splits(self, seed: int) -> dict[str, list[Example]]:
        d, ops = self.cfg.digits, self.cfg.operations
        grid = 10**d
        total = grid * grid * len(ops)
        wanted = self.cfg.n_train + self.cfg.n_heldout
        if wanted > total:
            raise UserError(f"task.n_train + task.n_heldout = {wanted} exceeds the {total} distinct {d}-digit problems")
        rng = random.Random(seed)
        picks = rng.sample(range(total), wanted)
        examples = [self._example(i // (grid * grid), (i // grid) % grid, i % grid) for i in picks]
        if self.worked:
            if self.options.quality_tags or "-" in ops:
                raise UserError("task.options.arithmetic.worked_steps works with operations + and * and without quality_tags")
            examples = [self._worked(e, rng) for e in examples]
        train = examples[: self.cfg.n_train]
        if self.options is not None and self.options.quality_tags:
            train = [self._tagged(e, rng) for e in train]
        return {"train": train, "heldout": examples[self.cfg.n_train :]}

    @property
    def worked(self) -> bool:
        return self.options is not None and self.options.worked_steps

    def _worked(self, example: Example, rng: random.Random) -> Example:
        route = rng.choice(self.options.routes)
        a, op, b = int(example.prompt[: self.cfg.digits]), example.prompt[self.cfg.digits], int(example.prompt[self.cfg.digits + 1 : -1])
        return Example(prompt=example.prompt, completion=f"{worked_steps(a, op, b, route, self.cfg.digits)}:{example.answer}", answer=example.answer,
                       metadata={"route": route})

    def think_trace(self, completion: str) -> str:
        """The reasoning before the answer: the worked steps (without `:answer`) when the completion has them."""
        if self.worked and ":" in completion:
            return completion.rsplit(":", 1)[0]
        return completion

    @property
    def options(self) -> ArithmeticOptions | None:
        return self.cfg.options_for("arithmetic")

    def _tagged(self, example: Example, rng: random.Random) -> Example:
        careless = rng.random() < self.options.careless_fraction
        tagged = rng.random() < self.options.tagged_fraction
        completion = planted_error(example.answer, rng) if careless else example.answer
        tag = (self.options.careless_tag if careless else self.options.expert_tag) if tagged else ""
        return Example(prompt=tag + example.prompt, completion=completion, answer=example.answer)

    def _example(self, op_index: int, a: int, b: int) -> Example:
        op = self.cfg.operations[op_index]
        answer = str(_OPS[op](a, b))
        return Example(prompt=f"{a:0{self.cfg.digits}d}{op}{b:0{self.cfg.digits}d}=", completion=answer, answer=answer)

    def parse(self, completion: str) -> str | None:
        if self.worked:
            m = _WORKED.fullmatch(completion)
            return m.group("answer") if m else None
        return completion if _ANSWER.fullmatch(completion) else None

    def alphabet(self) -> str:
        tags = self.options.expert_tag + self.options.careless_tag if self.options is not None and self.options.quality_tags else ""
        worked = ",:+" if self.worked else ""  # `+` also sums a multiplication's partial products
        return "".join(dict.fromkeys("0123456789-=" + "".join(self.cfg.operations) + tags + worked))


def planted_error(answer: str, rng: random.Random) -> str:
    """`answer` with one digit changed (never a leading zero), so it is wrong but still well formed."""
    digits = [i for i, ch in enumerate(answer) if ch.isdigit()]
    i = rng.choice(digits)
    leading = i == digits[0] and len(digits) > 1
    choices = [d for d in "0123456789" if d != answer[i] and not (leading and d == "0")]
    return answer[:i] + rng.choice(choices) + answer[i + 1 :]


def worked_steps(a: int, op: str, b: int, route: str, digits: int) -> str:
    """The steps of `a op b` (`digits`-digit operands) along `route` (module docstring), without the answer. The
    split route writes a zero-padded, so that its first step differs from a column step whatever the operands."""
    columns = [(k, int(d)) for k, d in enumerate(reversed(f"{b:0{digits}d}"))]  # b's digits from the units
    if route == "column" and op == "+":
        steps, carry = [], 0
        for k, y in columns:
            x = a // 10**k % 10
            total = x + y + carry
            steps.append(f"{x}+{y}" + (f"+{carry}" if carry else "") + f"={total}")
            carry = total // 10
        return ",".join(steps)
    if route == "column":  # op "*": one partial product per digit of b, units first
        return ",".join(f"{a}*{y}={a * y}" for _, y in columns)
    parts = [y * 10**k for k, y in reversed(columns)]  # b's place-value parts, highest first
    first = f"{a:0{digits}d}"
    if op == "+":
        steps, total = [], a
        for n, part in enumerate(parts):
            steps.append(f"{first if n == 0 else total}+{part}={total + part}")
            total += part
        return ",".join(steps)
    steps = [f"{first if n == 0 else a}*{part}={a * part}" for n, part in enumerate(parts)]
    total = a * parts[0]
    for part in parts[1:]:
        steps.append(f"{total}+{a * part}={total + a * part}")
        total += a * part
    return ",".join(steps)


def step_route(completion: str) -> str | None:
    """The route a worked-steps completion follows (None without steps): for +, a column step starts from one digit,
    a split route from the whole zero-padded first operand; for *, only split sums its partial products. For 1-digit
    operands the two routes write the same steps (reported as column)."""
    steps, sep, _ = completion.rpartition(":")
    if not sep or not steps:
        return None
    if "*" in steps:  # column: one product per digit of b; split: the products, then their running sum
        return "split" if "+" in steps else "column"
    return "column" if len(steps.split("+", 1)[0]) == 1 else "split"
