"""Rollouts: batched generation with a KV cache (`engine.sample`) into a `RolloutBatch`.

Only the contract is imported here, so objectives can use it without loading transformers."""

from posttrain.rollout.batch import RolloutBatch

__all__ = ["RolloutBatch"]
