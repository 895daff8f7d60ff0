"""Lifelong knowledge editing's settings section `edit` (stages knowledge + edit; recipes/rlhf/params.yaml's `edit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from posttrain.config import Options, OptionsOf, Registered, Section, SFTConfig
from posttrain.stages import sections


class FactsConfig(Section):  # edit.facts: the synthetic fact set (recipes/editing/facts.py)
    n_subjects: int = Field(24, gt=0, le=1000)
    relations: int = Field(4, ge=1, le=5)  # the first `relations` relations of recipes/editing/facts.py RELATIONS
    objects_per_relation: int = Field(8, ge=2, le=8)  # the first k objects of each relation's vocabulary
    seed: int = 0  # draws the subjects' names and their objects

    @model_validator(mode="after")
    def _enough_facts(self) -> "FactsConfig":
        if self.n_subjects * self.relations < 2:
            raise ValueError("needs at least 2 facts (one to edit, one to keep)")
        return self


@sections.register("edit", help="stages knowledge + edit (recipes/rlhf/dvc.yaml): lifelong knowledge editing on a synthetic fact set")
class EditConfig(Section):
    """Stages `knowledge` (a base model that knows the fact set) and `edit` (a stream of knowledge edits, as in GLIME)."""

    facts: FactsConfig = FactsConfig()  # subjects x relations -> objects, 5 paraphrase templates per relation (recipes/editing/facts.py)
    pretrain: SFTConfig = SFTConfig(steps=3000, lr=0.006, n_examples=0, log_every=50, checkpoint_every=500)  # the `knowledge` stage's SFT on every fact under every template
    method: Annotated[str, Registered("edit_methods")] = "glime"  # naive | naive_paraphrase | glime
    edits: str | None = None  # a JSON-lines edit stream {subject, relation, new}; null: `n_edits` seeded edits
    n_edits: int = Field(20, gt=0)
    steps_per_edit: int = Field(10, gt=0)
    lr: float = Field(0.1, gt=0)  # SGD, fresh for each edit
    max_grad_norm: float = Field(1.0, gt=0)
    params: tuple[str, ...] = ("mlp",)  # edited parameters: names containing one of these (e.g. "mlp": every FFN)
    log_every: int = Field(5, gt=0)  # edits between running-retention probes
    checkpoint_every: int = Field(5, ge=0)  # edits between checkpoints of the `edit` stage; 0: none
    options: Annotated[Options, OptionsOf("edit_methods")] = {}  # edit.options.<method>.<key>

    @field_validator("edits")
    @classmethod
    def _edits_exist(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"edit file not found: {v}")
        return v

    @field_validator("params")
    @classmethod
    def _some_params(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("needs at least one parameter-name pattern")
        return v
