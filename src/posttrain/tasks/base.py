"""The task interface: prompts with known answers, and a verifier that scores completions."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def answer_regex(pattern: str) -> re.Pattern:
    """`pattern` compiled as an answer extractor; a ValueError (a settings error) when it is not a valid regex or has
    no group 1, the answer."""
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"not a valid regex ({e})") from None
    if regex.groups < 1:
        raise ValueError("a regex answer pattern needs a group: group 1 is the answer")
    return regex


@dataclass(frozen=True)
class Example:
    prompt: str  # the user turn (a chat template, when the tokenizer has one, renders it with `system`)
    completion: str  # a reference solution in the task's answer format (used by SFT)
    answer: str  # the value the verifier compares against
    system: str | None = None  # a system prompt for the chat template; None: the template's default
    messages: tuple[Mapping[str, str], ...] | None = None  # a whole conversation ({role, content}) for SFT on assistant turns
    metadata: Mapping[str, Any] = field(default_factory=dict)  # a dataset's extra columns, handed to rewards


def prompt_key(example: Example) -> str:
    """What makes two examples the same prompt: the prompt itself, or, with a system prompt or a conversation,
    the system prompt and the conversation up to its last user turn (the prompt)."""
    if example.system is None and example.messages is None:
        return example.prompt
    context = list(example.messages or ())
    if context:
        last_user = max(i for i, m in enumerate(context) if m["role"] == "user")
        context = [dict(m) for m in context[: last_user + 1]]
    return json.dumps([example.system, context or example.prompt], ensure_ascii=False)


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

    def think_trace(self, completion: str) -> str:
        """The reasoning part of a completion, for a teacher's think trace (ThinkOPD): a task whose completions
        write worked steps before the answer returns the steps; by default the whole completion."""
        return completion

    def reference_verified(self, example: Example) -> bool:
        """The data stage's check of a reference completion: well formed and accepted by the verifier. A task whose
        references are demonstrations, right only as often as their author is, checks them its own way."""
        return self.format_reward(example.completion, True) == 1.0 and self.correctness_reward(example.completion, True, example) == 1.0

    def sample_metrics(self, completion: str, example: Example) -> dict[str, float]:
        """Task-specific per-completion metrics, averaged by the evaluation (e.g. Hit@k); none by default."""
        return {}

    def source_rows(self) -> list:
        """The rows of user files this task reads (tasks/tables.py `SourceRows`), which the data stage checks with
        its row suite before `splits()`; none for a generated task."""
        return []

    def expected_sizes(self) -> dict[str, int]:
        """The split sizes the data stage's suite expects from `splits()`: the settings' for a generated task."""
        return {"train": self.cfg.n_train, "heldout": self.cfg.n_heldout}

    def data_metrics(self) -> dict[str, float]:
        """Counts the data stage reports after `splits()` (rows read, dropped); none for a generated task."""
        return {}

    @abstractmethod
    def alphabet(self) -> str:
        """Every character a prompt or completion of this task can contain (for the tokenizer)."""
