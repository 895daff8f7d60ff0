"""Name -> implementation registries.

Every interchangeable part (advantage estimators, policy losses, rewards, tasks, stages) is registered
under a name; `params.yaml` selects parts by these names and nothing else dispatches on them. The list of
every registry, and the check of a config against them, live in `posttrain.resolve`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from posttrain.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    meta: dict[str, Any] = field(default_factory=dict)


class UnknownName(UserError):
    pass


class Registry(Generic[T]):
    """A named collection of implementations of one kind (e.g. "advantage estimator")."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = Entry(name, obj, dict(meta))
            return obj

        return add

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(self.unknown_message(name)) from None

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else f"choose from {', '.join(self.names())}"
        return f"unknown {self.kind} {name!r}; {hint}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries[n] for n in self.names())

