"""The pipeline graph, read from `dvc.yaml`: the one place the stages are wired together.

Every launcher runs the same tasks: a task is one expanded `dvc.yaml` stage (`eval@rl` for a matrix item),
its command is `posttrain <stage> --in name=outputs/X --out outputs/Y`, and its upstream tasks are the ones
whose outputs it depends on. Kubeflow and Airflow map those paths onto artifacts or a run directory.
Which pipeline a stage belongs to (`text`, `image`, ...) and whether it wants a GPU come from its registry
entry (`pipeline=`, `gpu=`), so a newly registered stage joins the right pipeline without edits here.
"""

from __future__ import annotations

import itertools
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from posttrain.errors import UserError

OUTPUTS = "outputs/"


@dataclass(frozen=True)
class Task:
    id: str  # dvc stage name, e.g. "eval@rl"
    stage: str  # registered stage, e.g. "eval"
    inputs: dict[str, str]  # input name -> upstream task id
    out: str  # the output directory under outputs/, e.g. "outputs/eval/rl"
    after: tuple[str, ...]  # every upstream task id (inputs and other output deps)
    resume: bool
    gpu: bool
    pipeline: str
    deterministic: bool
    extra_args: tuple[str, ...] = field(default=())  # --set overrides written in dvc.yaml


def _expand(name: str, stage: dict) -> dict[str, dict]:
    matrix = stage.get("matrix")
    if not matrix:
        return {name: stage}
    keys = list(matrix)
    expanded = {}
    for values in itertools.product(*(matrix[k] for k in keys)):
        text = yaml.safe_dump({k: v for k, v in stage.items() if k != "matrix"})
        for key, value in zip(keys, values):
            text = text.replace(f"${{item.{key}}}", str(value))
        suffix = "-".join(str(v) for v in values)
        expanded[f"{name}@{suffix}"] = yaml.safe_load(text)
    return expanded


def _owner(path: str, outs: dict[str, str]) -> str | None:
    """The task whose output directory contains `path`."""
    best = None
    for out, task_id in outs.items():
        if path == out or path.startswith(out + "/"):
            if best is None or len(out) > len(best[0]):
                best = (out, task_id)
    return best[1] if best else None


def load_tasks(dvc_yaml: Path) -> list[Task]:
    """Every `posttrain` stage in `dvc_yaml`, in a topological order (dvc.yaml order among ready tasks)."""
    from posttrain.stages import stages

    spec = yaml.safe_load(Path(dvc_yaml).read_text()) or {}
    raw = {tid: s for name, stage in (spec.get("stages") or {}).items() for tid, s in _expand(name, stage).items()}
    parsed: dict[str, tuple[list[str], dict]] = {}
    outs: dict[str, str] = {}
    for tid, stage in raw.items():
        argv = shlex.split(stage["cmd"])
        if argv[:1] != ["posttrain"] or len(argv) < 2 or argv[1] not in stages:
            raise UserError(f"dvc.yaml stage {tid!r}: command must be `posttrain <registered stage> ...`, got {stage['cmd']!r}")
        parsed[tid] = (argv, stage)
        outs[_value(argv, "--out") or f"{OUTPUTS}{argv[1]}"] = tid
    tasks = {}
    for tid, (argv, stage) in parsed.items():
        entry = stages.entry(argv[1])
        inputs = {}
        for item in _values(argv, "--in"):
            key, _, path = item.partition("=")
            owner = _owner(path.rstrip("/"), outs)
            if owner is None:
                raise UserError(f"dvc.yaml stage {tid!r}: input {key}={path} is no stage's --out")
            inputs[key] = owner
        deps = [d for d in stage.get("deps", []) if isinstance(d, str) and d.startswith(OUTPUTS)]
        after = {*inputs.values(), *(o for o in (_owner(d, outs) for d in deps) if o and o != tid)}
        tasks[tid] = Task(
            id=tid,
            stage=argv[1],
            inputs=inputs,
            out=_value(argv, "--out") or f"{OUTPUTS}{argv[1]}",
            after=tuple(sorted(after)),
            resume="--resume" in argv,
            gpu=entry.meta.get("gpu", True),
            pipeline=entry.meta.get("pipeline", "text"),
            deterministic=entry.meta.get("deterministic", True),
            extra_args=tuple(f"--set={v}" for v in _values(argv, "--set")),
        )
    return _topological(tasks)


def _values(argv: list[str], flag: str) -> list[str]:
    found = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    found += [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
    return found


def _value(argv: list[str], flag: str) -> str | None:
    found = _values(argv, flag)
    return found[0] if found else None


def _topological(tasks: dict[str, Task]) -> list[Task]:
    order: list[Task] = []
    done: set[str] = set()
    while len(order) < len(tasks):
        ready = [t for t in tasks.values() if t.id not in done and set(t.after) <= done]
        if not ready:
            raise UserError(f"dvc.yaml has a cycle among {sorted(set(tasks) - done)}")
        order.append(ready[0])
        done.add(ready[0].id)
    return order


def pipelines(tasks: list[Task]) -> dict[str, list[Task]]:
    """Tasks grouped by the pipeline their stage belongs to, each group in topological order."""
    grouped: dict[str, list[Task]] = {}
    for task in tasks:
        grouped.setdefault(task.pipeline, []).append(task)
    return grouped
