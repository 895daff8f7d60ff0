"""Distribution matching: the prompt states a categorical distribution q, the answer is one sample from it.

    prompt  "1=5,2=3,3=2>"   outcome 1 w.p. .5, 2 w.p. .3, 3 w.p. .2 (weights in tenths, summing to 10)
    answer  "2"              one outcome token, ended by EOS

The outcome set is {1..K} with K = `task.digits` + 1 (TaskConfig has no outcome-count key; `digits` is
reused so the default digits=2 gives three outcomes). Every outcome is listed, weight 0 included, and no
weight is 10 (point masses are not sampling problems), so prompts have one fixed length. A completion is
correct when its outcome lies in q's support; how well a policy matches q is a property of many samples,
measured by `total_variation` (TV(p, q) = 0.5 sum_k |p_k - q_k|) and trained for by the `witness` advantage estimator.
Train and held-out prompts are drawn without replacement from every such distribution: disjoint splits.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

_ANSWER = re.compile(r"[1-9]")


def compositions(total: int, parts: int, most: int) -> list[tuple[int, ...]]:
    """Every tuple of `parts` integers in [0, most] summing to `total`, in lexicographic order."""
    if parts == 1:
        return [(total,)] if total <= most else []
    return [(w, *rest) for w in range(min(total, most) + 1) for rest in compositions(total - w, parts - 1, most)]


def total_variation(outcomes: Sequence[int | None], target: Sequence[float]) -> float:
    """TV(p_hat, q) = 0.5 sum_k |p_hat_k - q_k| between the empirical distribution of `outcomes` (indices
    into `target`; None = unparseable, an outcome q gives probability 0) and `target`."""
    if not outcomes:
        raise ValueError("total_variation needs at least one outcome")
    counts = [0] * (len(target) + 1)  # last slot: invalid outcomes
    for k in outcomes:
        counts[len(target) if k is None else k] += 1
    q = [*target, 0.0]
    return 0.5 * sum(abs(c / len(outcomes) - qk) for c, qk in zip(counts, q))


@tasks.register("distribution")
class Distribution(Task):
    @property
    def n_outcomes(self) -> int:
        return self.cfg.digits + 1

    def splits(self, seed: int) -> dict[str, list[Example]]:
        grid = compositions(10, self.n_outcomes, 9)
        wanted = self.cfg.n_train + self.cfg.n_heldout
        if wanted > len(grid):
            raise UserError(
                f"task.n_train + task.n_heldout = {wanted} exceeds the {len(grid)} distinct distributions over "
                f"{self.n_outcomes} outcomes (task.digits + 1)"
            )
        rng = random.Random(seed)
        examples = [self._example(grid[i], rng) for i in rng.sample(range(len(grid)), wanted)]
        return {"train": examples[: self.cfg.n_train], "heldout": examples[self.cfg.n_train :]}

    def _example(self, weights: tuple[int, ...], rng: random.Random) -> Example:
        prompt = ",".join(f"{k}={w}" for k, w in enumerate(weights, start=1)) + ">"
        support = "".join(str(k) for k, w in enumerate(weights, start=1) if w > 0)
        sampled = rng.choices(range(1, len(weights) + 1), weights=weights)[0]  # an SFT target drawn from q
        return Example(prompt=prompt, completion=str(sampled), answer=support)

    def parse(self, completion: str) -> str | None:
        ok = _ANSWER.fullmatch(completion) and int(completion) <= self.n_outcomes
        return completion if ok else None

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """1.0 when the sampled outcome lies in the support of the prompt's distribution."""
        answer = self.parse(completion)
        return float(answer is not None and answer in example.answer)

    def outcome(self, completion: str) -> int | None:
        """The 0-based index of the completion's outcome in {1..K}, or None when it is unparseable."""
        answer = self.parse(completion)
        return None if answer is None else int(answer) - 1

    def target(self, example: Example) -> list[float]:
        """q over {1..K}, read from the prompt."""
        weights = [int(item.split("=")[1]) for item in example.prompt.rstrip(">").split(",")]
        return [w / 10 for w in weights]

    def alphabet(self) -> str:
        return "0123456789=,>"
