"""What a policy loss reads of the settings: `LossSettings`, a small frozen value instead of a whole section.

    PolicyLoss(logp, old_logp, advantages, mask, settings: LossSettings) -> (loss, metrics)

A loss reads the ratio clip bounds, the aggregation (`loss_agg`, with the completion budget L_max that
`token_sum_norm` divides by) and its own options block (`settings.options_for(<its registered name>)`), nothing
more. The online RL trainer builds it from the rl section (`LossSettings.of(cfg.rl)`), a recipe from its own section
(viskg.rl, motion.rl, ...) or from its own fields (the search recipes' single `clip_eps`), so no caller has to dress
up a fake config to call a shared loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LossSettings:
    clip_eps_low: float = 0.2  # rho is clipped to [1 - clip_eps_low, 1 + clip_eps_high]
    clip_eps_high: float = 0.2
    loss_agg: str = "token_mean"  # the registered aggregation (objectives/aggregation.py)
    max_new_tokens: int | None = None  # L_max of `token_sum_norm`; None: the padded width
    options: Mapping[str, Any] = field(default_factory=dict)  # parsed options blocks by registered name

    def options_for(self, name: str) -> Any:
        """The parsed options of the component registered as `name` (None when it takes none)."""
        return self.options.get(name)

    @classmethod
    def of(cls, section: Any) -> LossSettings:
        """The loss settings of a section with the rl section's loss fields (rl, viskg.rl, motion.rl, image.rl):
        its clip bounds and aggregation, its `max_new_tokens` when it has one, and its parsed options blocks when it
        has an `options` mapping (a section's `options_for` refuses an unresolved block)."""
        return cls(
            clip_eps_low=section.clip_eps_low, clip_eps_high=section.clip_eps_high, loss_agg=section.loss_agg,
            max_new_tokens=getattr(section, "max_new_tokens", None),
            options={name: section.options_for(name) for name in getattr(section, "options", {})},
        )
