"""Environments whose states can be recovered: a state is a value, so one prefix can be continued many times.

ASCT's tree (rollout/tree.py, recipes/search/asct_trainer.py) evaluates the alternatives to an actor's action from the very
prefix the actor was in; that needs an environment that can step a stored state again, without replaying or
mutating an episode. The actor chooses among the state's legal actions (each described by a feature vector, or,
for a language-model actor, by its text after the state's text: `text`, `action_text`), the
episode ends in a terminal state with a utility (e.g. answer F1 minus a cost per tool call), and every transition
reports the tokens it writes (what an auxiliary simulation spends).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from torch import Tensor

State = TypeVar("State")


class RecoverableEnv(ABC, Generic[State]):
    n_features: int  # the width of `features`

    @abstractmethod
    def start(self, example: Any) -> State:
        """The initial state of an episode on `example` (e.g. a question)."""

    @abstractmethod
    def legal_actions(self, state: State) -> list[Any]:
        """The actions open at a non-terminal state (at least one)."""

    @abstractmethod
    def step(self, state: State, action: Any) -> State:
        """The state after `action`; `state` itself is left unchanged (it can be stepped again)."""

    @abstractmethod
    def done(self, state: State) -> bool: ...

    @abstractmethod
    def utility(self, state: State) -> float:
        """The utility of an episode ending in `state` (one cut off before it finished scores as unanswered)."""

    @abstractmethod
    def features(self, state: State, actions: list[Any]) -> Tensor:
        """[len(actions), n_features] what the actor sees of each legal action at `state`."""

    @abstractmethod
    def tokens(self, state: State, action: Any) -> int:
        """Tokens the transition writes (the action and the observation it returns)."""

    @abstractmethod
    def calls(self, state: State) -> int:
        """Tool calls made so far in the episode."""

    def alphabet(self) -> str | None:
        """The characters of the text view (a char-level LM actor's vocabulary); None: the environment has none."""
        return None

    def text(self, state: State) -> str:
        """What a language-model actor has read at `state` (the prompt and every earlier action and observation)."""
        raise NotImplementedError(f"{type(self).__name__} has no text view (needed by asct.actor lm)")

    def action_text(self, action: Any) -> str:
        """The text a language-model actor writes for `action`."""
        raise NotImplementedError(f"{type(self).__name__} has no text view (needed by asct.actor lm)")

    def demonstration(self, example: Any) -> tuple[str, str]:
        """(prompt, reference completion) of `example`: a language-model actor's warm start."""
        raise NotImplementedError(f"{type(self).__name__} has no reference transcripts (needed by asct.lm.sft_steps)")
