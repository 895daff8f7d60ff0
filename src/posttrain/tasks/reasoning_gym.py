"""reasoning-gym's procedural tasks (Stojanovski et al. 2025, arXiv 2505.24760): about 100 seeded generators, each with
its own verifier, as one task (`task.name: reasoning_gym`).

    task.options.reasoning_gym.datasets: [{name: basic_arithmetic, weight: 1, config: {min_terms: 2, max_terms: 3}}, ...]

`task.n_train` / `task.n_heldout` examples are drawn from the weighted list (each dataset's share by weight) with
`reasoning_gym.create_dataset(name, size=, seed=, **config)`, the train and held-out draws from different seeds
(`heldout_seed`, default: derived from pipeline.seed) and made disjoint: a held-out question leaves train. Each
example keeps the library's entry (question, answer, metadata) in its metadata, so the library's own
`score_answer(answer, entry)` judges it: the answer is the last match of `answer_pattern` in the completion, and
`correctness_reward` is 1 when the library scores it 1.0 (the `reasoning_gym` reward, rewards/reasoning_gym.py,
is the library's score itself, partial credit included). Prompts go through the model's chat template with
`system_prompt` as the system turn; the SFT reference is the bare answer written in `completion_format`.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from typing import Any

from pydantic import Field, field_validator

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task, answer_regex

WHERE = "task.options.reasoning_gym"
ENTRY = "reasoning_gym"  # the Example.metadata key holding the library's entry and the index of its dataset spec


class DatasetSpec(Section):
    name: str  # a reasoning-gym dataset (reasoning_gym.factory.DATASETS)
    weight: float = Field(default=1.0, gt=0)
    config: dict[str, Any] = {}  # the dataset's own settings (its *Config dataclass)


class ReasoningGymOptions(Section):
    datasets: tuple[DatasetSpec, ...] = (DatasetSpec(name="basic_arithmetic", config={"min_terms": 2, "max_terms": 2, "max_digits": 2}),)
    system_prompt: str | None = "Solve the problem. End your answer with a line: #### <answer>"
    answer_pattern: str = r"####\s*([^\n]+)"  # a regex; group 1 of its last match is the answer handed to score_answer
    completion_format: str = "#### {answer}"  # the SFT reference (and the data stage's check that the format verifies)
    heldout_seed: int | None = None  # null: derived from pipeline.seed; a number: one held-out set for every pipeline seed

    @field_validator("datasets")
    @classmethod
    def _known(cls, v: tuple[DatasetSpec, ...]) -> tuple[DatasetSpec, ...]:
        from reasoning_gym.factory import DATASETS

        if not v:
            raise ValueError("needs at least one dataset")
        for spec in v:
            if spec.name not in DATASETS or spec.name == "composite":
                raise ValueError(f"unknown reasoning-gym dataset {spec.name!r} (see reasoning_gym.factory.DATASETS)")
        return v

    @field_validator("answer_pattern")
    @classmethod
    def _one_group(cls, v: str) -> str:
        answer_regex(v)
        return v


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps(parts).encode()).digest()[:4], "little")


@cache
def _dataset(name: str, config_json: str):
    """One instance per (dataset, config), only for its `score_answer` (entries are scored, not drawn, here)."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=1, seed=0, **json.loads(config_json))


def library_score(spec: DatasetSpec, answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's own score of `answer` (None: no answer found) on `entry`."""
    return float(_dataset(spec.name, json.dumps(spec.config, sort_keys=True)).score_answer(answer, entry))


@tasks.register("reasoning_gym", options=ReasoningGymOptions)
class ReasoningGymTask(Task):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.opts: ReasoningGymOptions = cfg.options_for("reasoning_gym") or ReasoningGymOptions()
        self.pattern = re.compile(self.opts.answer_pattern)
        self.sizes = {"train": cfg.n_train, "heldout": cfg.n_heldout}
        self.drawn: dict[int, dict[str, list[Example]]] = {}  # pipeline seed -> splits

    def _counts(self, n: int) -> list[int]:
        """`n` split over the datasets by weight (largest remainders), every dataset at least one when n allows."""
        weights = [s.weight for s in self.opts.datasets]
        exact = [n * w / sum(weights) for w in weights]
        counts = [int(x) for x in exact]
        for i in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[: n - sum(counts)]:
            counts[i] += 1
        return counts

    def _draw(self, n: int, seed: int) -> list[Example]:
        import reasoning_gym

        out = []
        for index, (spec, count) in enumerate(zip(self.opts.datasets, self._counts(n))):
            if count == 0:
                continue
            try:
                dataset = reasoning_gym.create_dataset(spec.name, size=count, seed=_seed(seed, index), **spec.config)
            except (TypeError, ValueError, AssertionError) as e:  # an unknown or out-of-range config key
                raise UserError(f"{WHERE}.datasets[{index}] ({spec.name}): {(str(e).splitlines() or [type(e).__name__])[0]}") from None
            for entry in dataset:
                entry = json.loads(json.dumps(entry, default=list))  # as it is written to and read from the data files
                out.append(Example(prompt=entry["question"], completion=self.opts.completion_format.format(answer=entry["answer"]),
                                   answer=str(entry["answer"]), system=self.opts.system_prompt, metadata={ENTRY: {"spec": index, "entry": entry}}))
        return out

    def splits(self, seed: int) -> dict[str, list[Example]]:
        if seed not in self.drawn:
            heldout_seed = self.opts.heldout_seed if self.opts.heldout_seed is not None else _seed(seed, "heldout")
            heldout = _unique(self._draw(self.cfg.n_heldout, heldout_seed))
            taken = {e.prompt for e in heldout}
            train = [e for e in _unique(self._draw(self.cfg.n_train, _seed(seed, "train"))) if e.prompt not in taken]
            self.sizes = {"train": len(train), "heldout": len(heldout)}
            self.drawn[seed] = {"train": train, "heldout": heldout}
        return self.drawn[seed]

    def expected_sizes(self) -> dict[str, int]:
        return dict(self.sizes)  # after de-duplication (a small generator space repeats questions)

    def parse(self, completion: str) -> str | None:
        matches = list(self.pattern.finditer(completion))
        return matches[-1].group(1).strip() or None if matches else None

    def score(self, completion: str, example: Example) -> float:
        """The library's score of the completion's answer (0 when the example carries no reasoning-gym entry)."""
        held = example.metadata.get(ENTRY)
        if held is None:
            raise UserError("reasoning_gym scores examples of task.name reasoning_gym (their metadata holds the library's entry)")
        return library_score(self.opts.datasets[held["spec"]], self.parse(completion), held["entry"])

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        return float(self.score(completion, example) >= 1.0)

    def alphabet(self) -> str:
        seen = set(self.opts.system_prompt or "") | set(self.opts.completion_format)
        for drawn in list(self.drawn.values()) or [self.splits(0)]:  # the data stage draws its seed's splits first
            for e in (e for rows in drawn.values() for e in rows):
                seen |= set(e.prompt) | set(e.completion)
        return "".join(sorted(seen))


def _unique(examples: list[Example]) -> list[Example]:
    seen: set[str] = set()
    out = []
    for e in examples:
        if e.prompt not in seen:
            seen.add(e.prompt)
            out.append(e)
    return out
