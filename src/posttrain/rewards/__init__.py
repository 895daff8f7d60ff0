"""Reward functions, registered by name; `rl.rewards` lists the ones that form the reward matrix.

    RewardFn(task, examples, completions, finished) -> Tensor [N]

A reward may also be the user's own function, named `module:attr` (rewards/user.py adapts its simpler,
TRL-like signature); rewards/verifiers.py compares completions with the examples' reference answers.

A reward scores completions and nothing else: weighting and normalisation across rewards belong to the
advantage estimator. A reward that needs more than the text declares it (`needs=("lengths", ...)`) and
receives those keyword arguments from the trainer's `reward_matrix(..., **context)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.registry import Registry
from posttrain.rewards.user import from_function
from posttrain.tasks import Example, Task

rewards: Registry = Registry("reward", importer=from_function)  # `module:attr` names import the user's function
# trainable reward models (`reward_model.kind`): name -> train(cfg, policy_dir, train, heldout, out_dir, seed, on_log,
# loop=None) -> metrics, `loop` being the stage's TrainLoop (trainers/loop.py: the guard, checkpoints). The trainers
# register themselves (trainers/reward_model.py, trainers/trm.py; importing `posttrain.stages` imports them); each
# kind has a reward of the same name here that scores completions with the trained model.
reward_models: Registry = Registry("reward model")


@rewards.register("correctness")
def correctness(task: Task, examples: Sequence[Example], completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """1 when the task's verifier accepts the answer."""
    return torch.tensor([task.correctness_reward(c, f, e) for c, f, e in zip(completions, finished, examples)])


@rewards.register("format")
def format_reward(task: Task, examples: Sequence[Example], completions: Sequence[str], finished: Sequence[bool]) -> Tensor:
    """1 when the completion is exactly one well-formed answer ended by EOS."""
    return torch.tensor([task.format_reward(c, f) for c, f in zip(completions, finished)])


@rewards.register("overlong", needs=("lengths", "max_len", "overlong_buffer"))
def overlong(task: Task, examples, completions, finished, *, lengths: Tensor, max_len: int, overlong_buffer: int) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), on token lengths |y|:
    0 if |y| <= L_max - L_buf;  (L_max - L_buf - |y|) / L_buf inside the buffer;  -1 beyond L_max."""
    lengths = torch.as_tensor(lengths, dtype=torch.float32)
    start = max_len - overlong_buffer
    penalty = -(lengths - start).clamp(min=0.0) / overlong_buffer
    return torch.where(lengths > max_len, torch.full_like(penalty, -1.0), penalty)


def reward_matrix(specs, task: Task, examples, completions, finished, **context) -> tuple[Tensor, tuple[str, ...], Tensor]:
    """Score with every configured reward: ([N, K] matrix, names, weights [K]). `context` holds what some
    rewards declare they need (e.g. token `lengths`); each reward receives only its own needs."""
    columns = []
    for s in specs:
        entry = rewards.entry(s.name)
        extra = {key: context[key] for key in entry.meta.get("needs", ())}
        columns.append(entry.obj(task, examples, completions, finished, **extra).float())
    names = tuple(s.name for s in specs)
    weights = torch.tensor([s.weight for s in specs], dtype=torch.float32)
    return torch.stack(columns, dim=1), names, weights


from posttrain.rewards import audit_correction, bradley_terry, kgpo, sdrl, trm  # noqa: E402,F401  (registers)
from posttrain.rewards import verifiers  # noqa: E402,F401  (registers exact_match, math_verify, ...)
from posttrain.rewards import reasoning_gym  # noqa: E402,F401  (registers reasoning_gym: the library's score_answer)
