"""State that a part of a run keeps between updates (a schedule's EMA, a pool, a critic's statistics).

A stateful part declares a state object with `state_dict()` / `load_state_dict(d)`; the trainer creates
it, hands it to the part, and checkpoints every declared state by its registered name, so resume is exact
without method names in checkpoint code. `DataclassState` gives both methods to a dataclass of plain values.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class DataclassState:
    """Mixin for a `@dataclass` whose fields are plain values (what `torch.load(weights_only=True)` reads back)."""

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = set(state) - names
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        for key, value in state.items():
            setattr(self, key, value)
