"""Rollouts: the `RolloutBatch` contract that sampling fills and objectives read, and the `PolicyOutputs` of
the trainer's one policy forward. Sampling itself lives in `posttrain.rollout.decode` (the engine).

Only the contract is imported here, so objectives can use it without loading transformers."""

from posttrain.rollout.batch import PolicyOutputs, RolloutBatch

__all__ = ["PolicyOutputs", "RolloutBatch"]
