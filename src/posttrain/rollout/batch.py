"""The rollout contract between sampling, rewards, advantage estimators and policy losses.

A batch carries two masks over the completion: `attention_mask` (every real token, environment observations
included: what every forward pass reads) and `completion_mask` (the tokens the policy produced: what every
loss, advantage and log-prob comparison reads). They are equal for single-turn completions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from torch import Tensor


@dataclass(frozen=True)
class RolloutBatch:
    prompt_ids: Tensor  # [B, P] left-padded; row i is the prompt of sample i (G rows share a prompt)
    prompt_mask: Tensor  # [B, P] 1 on real prompt tokens
    completion_ids: Tensor  # [B, T] padded after the end
    completion_mask: Tensor  # [B, T] the loss mask: 1 on tokens the policy produced (EOS included)
    group: Tensor  # [B] prompt index; the G samples of one prompt share it
    old_logp: Tensor  # [B, T] sampled-token log-probs recorded at rollout time (0 off the loss mask)
    rewards: Tensor  # [B, K] one column per reward function
    reward_names: tuple[str, ...]
    reward_weights: Tensor  # [K]
    extras: Mapping[str, Tensor] = field(default_factory=dict)  # what the objective asked for: ref_logp, teacher_logp, ...
    attention_mask: Tensor | None = None  # [B, T] 1 on every real token, observations included; None: = completion_mask

    def __post_init__(self) -> None:
        if self.attention_mask is None:
            object.__setattr__(self, "attention_mask", self.completion_mask)

    def with_extras(self, **extras: Tensor) -> "RolloutBatch":
        return replace(self, extras={**self.extras, **extras})

    @property
    def size(self) -> int:
        return self.completion_ids.shape[0]

    def rows(self, start: int, stop: int) -> "RolloutBatch":
        """Samples `start` .. `stop - 1`: every per-sample tensor (and extra) cut along its first dimension; the
        reward names and weights are the batch's. A micro-batch of the update (trainers/online_rl.py)."""
        size = self.size

        def cut(value):
            return value[start:stop] if isinstance(value, Tensor) and value.dim() and value.shape[0] == size else value

        per_sample = {f.name: cut(getattr(self, f.name)) for f in fields(self) if f.name not in ("reward_weights", "extras", "reward_names")}
        return replace(self, **per_sample, extras={name: cut(value) for name, value in self.extras.items()})


@dataclass(frozen=True)
class PolicyOutputs:
    """What the trainer's one policy forward of an update gives the loss and the auxiliary terms. A part
    declares what beyond `logp` it reads (registry meta `policy=("logprobs", "hidden")`, `scores=(extra, ...)`)."""

    logp: Tensor | None  # [B, T] sampled-token log-probs with gradient (None when nothing reads them)
    entropy: Tensor | None = None  # [B, T] detached
    logprobs: Tensor | None = None  # [B, T, V] full next-token log-distributions
    hidden: Tensor | None = None  # [L, B, T, d] every decoder layer's output at the positions predicting the completion
    scored: Mapping[str, Tensor] = field(default_factory=dict)  # extra name -> [B, W-1] log-probs of the token sequence it holds
