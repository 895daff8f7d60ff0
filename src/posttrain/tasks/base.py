"""The task interface: prompts with known answers, and a verifier that scores completions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    prompt: str  # the user turn (a chat template, when the tokenizer has one, renders it with `system`)
    completion: str  # a reference solution in the task's answer format (used by SFT)
    answer: str  # the value the verifier compares against
    system: str | None = None  # a system prompt for the chat template; None: the template's default
    messages: tuple[Mapping[str, str], ...] | None = None  # a whole conversation ({role, content}) for SFT on assistant turns
    metadata: Mapping[str, Any] = field(default_factory=dict)  # a dataset's extra columns, handed to rewards


class Task(ABC):
    """A verifiable task. `splits()` must be deterministic in the seed and its splits disjoint."""

    def __init__(self, cfg):
        self.cfg = cfg

    @abstractmethod
    def splits(self, seed: int) -> dict[str, list[Example]]:
        """{"train": [...], "heldout": [...]}, no prompt in both."""

    @abstractmethod
    def parse(self, completion: str) -> str | None:
        """The answer in `completion` if it follows the answer format, else None."""

    def format_reward(self, completion: str, finished: bool) -> float:
        """1.0 when the completion is exactly one well-formed answer ended by EOS."""
        return float(finished and self.parse(completion) is not None)

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """1.0 when the parsed answer equals the reference answer."""
        return float(self.parse(completion) == example.answer)

    def sample_metrics(self, completion: str, example: Example) -> dict[str, float]:
        """Task-specific per-completion metrics, averaged by the evaluation (e.g. Hit@k); none by default."""
        return {}

    @abstractmethod
    def alphabet(self) -> str:
        """Every character a prompt or completion of this task can contain (for the tokenizer)."""
