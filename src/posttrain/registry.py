"""Name -> implementation registries.

Every interchangeable part (advantage estimators, policy losses, rewards, tasks, stages) is registered
under a name; `params.yaml` selects parts by these names and nothing else dispatches on them.
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


def all_registries() -> dict[str, Registry]:
    """Every registry, with its implementations imported so that all names are present."""
    from posttrain import objectives, rewards, stages, tasks
    from posttrain.data.preferences import preference_data
    from posttrain.objectives.preference import preference_objectives
    from posttrain.objectives.editing import edit_methods
    from posttrain.data.vigor.steps import change_classifiers, embedders, geometric_checks, instruction_writers
    from posttrain.objectives.presets import presets
    from posttrain.rewards.care_reward import care_weight_sources
    from posttrain.rewards.image import image_rewards
    from posttrain.models.flow import flow_backends
    import posttrain.models.flux  # noqa: F401  (registers the flux kind)

    return {
        "advantages": objectives.advantages,
        "losses": objectives.losses,
        "loss_aggregations": objectives.aggregations,
        "auxiliaries": objectives.auxiliaries,
        "presets": presets,
        "rewards": rewards.rewards,
        "reward_models": rewards.reward_models,
        "care_weight_sources": care_weight_sources,
        "preference_objectives": preference_objectives,
        "preference_data": preference_data,
        "edit_methods": edit_methods,
        "tasks": tasks.tasks,
        "stages": stages.stages,
        "image_rewards": image_rewards,
        "embedders": embedders,
        "geometric_checks": geometric_checks,
        "change_classifiers": change_classifiers,
        "instruction_writers": instruction_writers,
        "flow_backends": flow_backends,
    }
