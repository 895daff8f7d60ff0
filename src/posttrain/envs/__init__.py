"""Multi-turn environments: `reset() -> observation`, `step(action) -> (observation, reward, done)` on text,
and the multi-turn sampler that turns episodes into `RolloutBatch` rows whose observation tokens are masked
out of the loss (envs/rollout.py). An environment is offered to the RL loop as a task (tasks registry) whose
`sampler(tokenizer)` replaces single-turn sampling."""

from posttrain.envs.base import Env, Step

__all__ = ["Env", "Step"]
