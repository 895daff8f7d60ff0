"""The environment interface: text in, text out, one episode at a time."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    observation: str  # what the agent reads next (appended to its context, masked out of the loss)
    reward: float
    done: bool


class Env(ABC):
    @abstractmethod
    def reset(self) -> str:
        """Start an episode; the first observation (the prompt)."""

    @abstractmethod
    def step(self, action: str) -> Step:
        """Apply one action (a string the policy produced)."""
