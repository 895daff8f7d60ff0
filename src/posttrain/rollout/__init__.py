"""Rollouts: batched generation with a KV cache into a `RolloutBatch`."""

from posttrain.rollout.batch import RolloutBatch
from posttrain.rollout.engine import Samples, sample

__all__ = ["RolloutBatch", "Samples", "sample"]
