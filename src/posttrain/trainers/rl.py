"""Online RL in either `rl.mode`: `train_online_rl` hands the run to the sync loop (trainers/online_rl.py) or to the
rollout workers and trajectory pool (trainers/async_rl.py). It lives above both so that neither imports the other:
async_rl builds on online_rl's `OnlineRL` step, and online_rl knows nothing of async."""

from __future__ import annotations

from collections.abc import Callable

from posttrain.trainers.async_rl import train_async
from posttrain.trainers.online_rl import RLRun, StepResult, train_sync


def train_online_rl(
    run: RLRun, resume: bool, on_log: Callable[[int, dict[str, float]], None],
    on_step: Callable[[int, StepResult], None] | None = None,
) -> tuple[list[dict[str, float]], list[dict[str, object]]]:
    """Run `cfg.steps` policy updates; return the per-step metric history (restored on resume) and a
    table of the last step's completions. `on_log` sees every `log_every`-th step's metrics; `on_step`, when
    given, every step's whole result (batch, texts, prompts, metrics), for experiments that inspect batches."""
    train = train_async if run.cfg.mode == "async" else train_sync
    return train(run, resume, on_log, on_step)
