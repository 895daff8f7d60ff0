"""Multi-digit arithmetic: "37+48=" -> "85".

Operands have exactly `digits` digits written zero-padded, so every prompt has the same length; the
answer format is an optionally signed integer with no leading zeros, ended by EOS. Train and held-out
prompts are drawn without replacement from the full operand grid, so the splits are disjoint.
"""

from __future__ import annotations

import operator
import random
import re

from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_ANSWER = re.compile(r"-?(0|[1-9][0-9]*)")


@tasks.register("arithmetic")
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
        return {"train": examples[: self.cfg.n_train], "heldout": examples[self.cfg.n_train :]}

    def _example(self, op_index: int, a: int, b: int) -> Example:
        op = self.cfg.operations[op_index]
        answer = str(_OPS[op](a, b))
        return Example(prompt=f"{a:0{self.cfg.digits}d}{op}{b:0{self.cfg.digits}d}=", completion=answer, answer=answer)

    def parse(self, completion: str) -> str | None:
        return completion if _ANSWER.fullmatch(completion) else None

    def alphabet(self) -> str:
        return "0123456789-=" + "".join(self.cfg.operations)
