"""The rollout contract between sampling, rewards, advantage estimators and policy losses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from torch import Tensor


@dataclass(frozen=True)
class RolloutBatch:
    prompt_ids: Tensor  # [B, P] left-padded; row i is the prompt of sample i (G rows share a prompt)
    prompt_mask: Tensor  # [B, P] 1 on real prompt tokens
    completion_ids: Tensor  # [B, T] padded after EOS
    completion_mask: Tensor  # [B, T] 1 on tokens the policy produced (EOS included), 0 on padding
    group: Tensor  # [B] prompt index; the G samples of one prompt share it
    old_logp: Tensor  # [B, T] sampled-token log-probs recorded at rollout time
    rewards: Tensor  # [B, K] one column per reward function
    reward_names: tuple[str, ...]
    reward_weights: Tensor  # [K]
    extras: Mapping[str, Tensor] = field(default_factory=dict)  # what the objective asked for: ref_logp, ...

    def with_extras(self, **extras: Tensor) -> "RolloutBatch":
        return replace(self, extras={**self.extras, **extras})

    @property
    def size(self) -> int:
        return self.completion_ids.shape[0]
