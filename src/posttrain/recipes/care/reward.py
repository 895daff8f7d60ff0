"""`care`: CARE's context-adaptive rubric reward for online RL on the `dialogue` task ("Context-Adaptive Rubric
Evolution", 2026).

    R_t = sum_d w_d(h_t) s_d(a_t)        w on the simplex, s_d in [0, 1] from the task's per-dimension judges

The rubric format, R_t and the rubric task live in recipes/care/rubric.py. The fixed criteria are the task's judges: the
generator adapts the weights, not the criteria.

The weights come from `rl.options.care.source` (registry `care_weight_sources` below):
  generator  the rubric generator trained by the `care` stage (at `rl.options.care.path`), greedy, once per
             context; a rubric that does not parse falls back to uniform weights (counted, warned once)
  uniform    1/3 each: the static-rubric baseline (CARE with uniform weights is exactly this)
  oracle     the task's true context-dependent w*, an upper bound no deployed system has
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import field_validator
from torch import Tensor

from posttrain.config import Section
from posttrain.registry import Registry
from posttrain.rewards import rewards
from posttrain.rewards.trained import load_trained
from posttrain.recipes.care import dialogue, rubric
from posttrain.recipes.care.rubric import parse_rubric, turn_reward

log = logging.getLogger(__name__)
care_weight_sources: Registry = Registry("care weight source")


class CareOptions(Section):  # rl.options.care
    source: str = "generator"  # care_weight_sources: generator | uniform | oracle
    path: str = "outputs/care"  # the care stage's output directory (holding model/), read when source is generator

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        if v not in care_weight_sources:
            raise ValueError(care_weight_sources.unknown_message(v))
        return v


class RubricGenerator:
    """A trained rubric generator with its per-context weights cached (contexts repeat across RL steps)."""

    def __init__(self, path: Path):
        from posttrain.models import load_pretrained, select_device

        self.model, self.tokenizer = load_pretrained(path)
        self.model = self.model.to(select_device("auto")).eval().requires_grad_(False)
        self.cache: dict[str, tuple[Tensor, bool]] = {}
        self.generated = self.fallbacks = 0

    def weights(self, prompts: Sequence[str]) -> Tensor:
        new = list(dict.fromkeys(p for p in prompts if p not in self.cache))
        if new:
            for prompt, text in zip(new, rubric.generate_rubrics(self.model, self.tokenizer, new)):
                self.cache[prompt] = parse_rubric(text)
            failed = sum(not self.cache[p][1] for p in new)
            if failed and not self.fallbacks:
                log.warning("care: %d of %d generated rubrics did not parse; uniform weights are used for them", failed, len(new))
            self.generated, self.fallbacks = self.generated + len(new), self.fallbacks + failed
        return torch.stack([self.cache[p][0] for p in prompts])


def _build(path: str) -> RubricGenerator:
    return RubricGenerator(Path(path))


def load_generator(directory: str) -> RubricGenerator:
    """The rubric generator under `directory/model` (cached while unchanged); UserError if absent."""
    return load_trained(directory, _build, missing="rl.options.care.path: no trained rubric generator at {path} "
                        "(run the care stage, or set rl.options.care.source)")


@care_weight_sources.register("generator")
def generator_weights(prompts: Sequence[str], opts: CareOptions) -> Tensor:
    return load_generator(opts.path).weights(prompts)


@care_weight_sources.register("uniform")
def uniform_weights(prompts: Sequence[str], opts: CareOptions) -> Tensor:
    return torch.full((len(prompts), 3), 1.0 / 3)


@care_weight_sources.register("oracle")
def oracle_weights(prompts: Sequence[str], opts: CareOptions) -> Tensor:
    return torch.tensor([dialogue.ideal_weights(p) for p in prompts])


@rewards.register("care", needs=("rl",), options=CareOptions, tasks=("dialogue",))
def care(task, examples, completions, finished, *, rl) -> Tensor:
    """R_t = sum_d w_d s_d with w from `rl.options.care.source` and s_d from the dialogue task's judges."""
    opts = rl.options_for("care")
    weights = care_weight_sources.get(opts.source)([e.prompt for e in examples], opts)
    scores = torch.tensor([dialogue.judge_scores(c, f) for c, f in zip(completions, finished)])
    return turn_reward(weights, scores)
