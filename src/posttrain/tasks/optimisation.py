"""Small combinatorial optimisation instances whose completions name a strategy and give a solution that a solver
verifies: the task `sdrl` (strategy-diverse RL) is for, where correct answers can differ in how they were found.

    knapsack    "k<w1..w4>,<v1..v4>,<C>>"  4 items (weights 1-5, values 1-9), capacity C; solution: 4 bits "0110"
    assignment  "a<c11c12c13>,<c21..>,<c31..>>"  3x3 costs 1-9; solution: the task of each worker, "201"
    completion  "<s>:<solution>"  s names the strategy: d exact (enumeration / DP), g greedy, r random search

Correct: the solution is feasible and optimal (the verifier enumerates every solution). The SFT references
(`Example.completion`) cycle through the three strategies, each with what that strategy computes on the
instance: `d` the optimum, `g` the greedy answer (knapsack: items by value/weight ratio while they fit;
assignment: each worker in turn takes its cheapest free task), `r` the best of three random feasible solutions
(seeded by the instance). So the strategies differ in how often they are right, and by family: greedy is optimal
on most assignment instances here and on fewer knapsack ones. The strategy is the completion's first character,
for `rl.options.sdrl.strategies` (e.g. `{exact: ['^d:'], greedy: ['^g:'], search: ['^r:']}`); `strategy()`
reads it for the evaluation. Train and held-out prompts are distinct instances.
"""

from __future__ import annotations

import itertools
import random
import re

from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

STRATEGIES = ("d", "g", "r")  # exact, greedy, random search
_COMPLETION = re.compile(r"([dgr]):([0-9]+)")
ITEMS, WORKERS = 4, 3


def knapsack_value(weights, values, capacity, bits: str) -> int | None:
    """The total value of the selection, None when it is not a selection of the right length or over capacity."""
    if len(bits) != len(weights) or set(bits) - {"0", "1"}:
        return None
    chosen = [i for i, b in enumerate(bits) if b == "1"]
    return sum(values[i] for i in chosen) if sum(weights[i] for i in chosen) <= capacity else None


def assignment_cost(costs, perm: str) -> int | None:
    """The total cost of giving worker i task perm[i], None when perm is not a permutation of the tasks."""
    if sorted(perm) != [str(j) for j in range(len(costs))]:
        return None
    return sum(costs[i][int(t)] for i, t in enumerate(perm))


def solutions(family: str, data) -> list[str]:
    if family == "k":
        return ["".join(bits) for bits in itertools.product("01", repeat=len(data[0]))]
    return ["".join(str(t) for t in p) for p in itertools.permutations(range(len(data)))]


def score(family: str, data, solution: str) -> int | None:
    """Higher is better (the negated cost for assignment); None: infeasible or malformed."""
    if family == "k":
        return knapsack_value(*data, solution)
    cost = assignment_cost(data, solution)
    return None if cost is None else -cost


def optimum(family: str, data) -> int:
    return max(s for s in (score(family, data, x) for x in solutions(family, data)) if s is not None)


def greedy(family: str, data) -> str:
    if family == "k":
        weights, values, capacity = data
        bits, load = ["0"] * len(weights), 0
        for i in sorted(range(len(weights)), key=lambda i: (-values[i] / weights[i], i)):
            if load + weights[i] <= capacity:
                bits[i], load = "1", load + weights[i]
        return "".join(bits)
    free, out = set(range(len(data))), []
    for row in data:
        task = min(free, key=lambda t: (row[t], t))
        free.remove(task)
        out.append(str(task))
    return "".join(out)


def random_search(family: str, data, rng: random.Random, tries: int = 3) -> str:
    feasible = [x for x in solutions(family, data) if score(family, data, x) is not None]
    picks = [rng.choice(feasible) for _ in range(tries)]
    return max(picks, key=lambda x: score(family, data, x))


def solve(strategy: str, family: str, data, rng: random.Random) -> str:
    if strategy == "d":
        best = optimum(family, data)
        return next(x for x in solutions(family, data) if score(family, data, x) == best)
    return greedy(family, data) if strategy == "g" else random_search(family, data, rng)


@tasks.register("optimisation")
class Optimisation(Task):
    def splits(self, seed: int) -> dict[str, list[Example]]:
        rng = random.Random(seed)
        wanted = self.cfg.n_train + self.cfg.n_heldout
        seen: dict[str, Example] = {}
        for _ in range(50 * wanted):
            if len(seen) == wanted:
                break
            family = "k" if len(seen) % 2 == 0 else "a"
            prompt, data = self._instance(family, rng)
            if prompt not in seen:
                strategy = STRATEGIES[len(seen) % 3 if family == "k" else (len(seen) // 2) % 3]
                solution = solve(strategy, family, data, random.Random(prompt))
                seen[prompt] = Example(prompt=prompt, completion=f"{strategy}:{solution}", answer=str(optimum(family, data)))
        if len(seen) < wanted:
            raise UserError(f"task.n_train + task.n_heldout = {wanted}: only {len(seen)} distinct optimisation instances were drawn")
        examples = list(seen.values())
        rng.shuffle(examples)
        return {"train": examples[: self.cfg.n_train], "heldout": examples[self.cfg.n_train :]}

    @staticmethod
    def _instance(family: str, rng: random.Random):
        if family == "k":
            weights = [rng.randint(1, 5) for _ in range(ITEMS)]
            values = [rng.randint(1, 9) for _ in range(ITEMS)]
            capacity = rng.randint(max(weights), sum(weights) - 1)
            prompt = f"k{''.join(map(str, weights))},{''.join(map(str, values))},{capacity}>"
            return prompt, (weights, values, capacity)
        costs = [[rng.randint(1, 9) for _ in range(WORKERS)] for _ in range(WORKERS)]
        return "a" + ",".join("".join(map(str, row)) for row in costs) + ">", costs

    @staticmethod
    def instance(prompt: str):
        """(family, data) read back from a prompt."""
        family, body = prompt[0], prompt[1:].rstrip(">").split(",")
        if family == "k":
            return family, ([int(c) for c in body[0]], [int(c) for c in body[1]], int(body[2]))
        return family, [[int(c) for c in row] for row in body]

    def parse(self, completion: str) -> str | None:
        match = _COMPLETION.fullmatch(completion)
        return match[2] if match else None

    def strategy(self, completion: str) -> str | None:
        """The strategy letter the completion names (d, g, r), None when it is malformed."""
        match = _COMPLETION.fullmatch(completion)
        return match[1] if match else None

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """1.0 when the solution is feasible and reaches the instance's optimum (checked by enumeration)."""
        solution = self.parse(completion)
        if solution is None:
            return 0.0
        family, data = self.instance(example.prompt)
        return float(score(family, data, solution) == int(example.answer))

    def sample_metrics(self, completion: str, example: Example) -> dict[str, float]:
        strategy = self.strategy(completion)
        return {f"strategy_{s}": float(strategy == s) for s in STRATEGIES}

    def alphabet(self) -> str:
        return "0123456789,>:kadgr"
