"""Verifiable tasks: seeded prompt generators with a verifier, registered by name."""

from posttrain.registry import Registry
from posttrain.tasks.base import Example, Task

tasks: Registry[type[Task]] = Registry("task")

from posttrain.tasks import arithmetic, dataset, diagnosis, distribution, optimisation, search, text_world  # noqa: E402,F401  (registers)
from posttrain.tasks import reasoning_gym  # noqa: E402,F401  (registers: reasoning-gym's generators and verifiers)

__all__ = ["Example", "Task", "tasks", "build_task"]


def build_task(cfg) -> Task:
    return tasks.get(cfg.name)(cfg)
