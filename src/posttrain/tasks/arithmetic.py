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
"""

from __future__ import annotations

import operator
import random
import re

from pydantic import Field

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_ANSWER = re.compile(r"-?(0|[1-9][0-9]*)")


class ArithmeticOptions(Section):
    quality_tags: bool  # false: every train solution is correct and untagged
    careless_fraction: float = Field(ge=0.0, le=1.0)  # train solutions with a planted error
    tagged_fraction: float = Field(ge=0.0, le=1.0)  # train examples whose prompt starts with their quality tag
    expert_tag: str = Field(min_length=1)
    careless_tag: str = Field(min_length=1)


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
        train = examples[: self.cfg.n_train]
        if self.options is not None and self.options.quality_tags:
            train = [self._tagged(e, rng) for e in train]
        return {"train": train, "heldout": examples[self.cfg.n_train :]}

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
        return completion if _ANSWER.fullmatch(completion) else None

    def alphabet(self) -> str:
        tags = self.options.expert_tag + self.options.careless_tag if self.options is not None and self.options.quality_tags else ""
        return "".join(dict.fromkeys("0123456789-=" + "".join(self.cfg.operations) + tags))


def planted_error(answer: str, rng: random.Random) -> str:
    """`answer` with one digit changed (never a leading zero), so it is wrong but still well formed."""
    digits = [i for i, ch in enumerate(answer) if ch.isdigit()]
    i = rng.choice(digits)
    leading = i == digits[0] and len(digits) > 1
    choices = [d for d in "0123456789" if d != answer[i] and not (leading and d == "0")]
    return answer[:i] + rng.choice(choices) + answer[i + 1 :]
