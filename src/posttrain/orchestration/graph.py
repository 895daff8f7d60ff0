"""The pipeline graphs, read from the `dvc.yaml` files: the one place the stages are wired together.

Every launcher runs the same tasks: a task is one expanded `dvc.yaml` stage (`eval@rl` for a matrix item,
`${var}` filled from `vars`), its command is `posttrain <stage> --in name=outputs/X --out outputs/Y`, and its
upstream tasks are the ones whose outputs it depends on. Kubeflow and Airflow map those paths onto artifacts
or a run directory. A pipeline is one `dvc.yaml` file (`PIPELINE_FILES`, and each recipe's `recipes/<name>/dvc.yaml`,
which reads the recipe's own params file) plus the stages of the other files it reads from (`recipes/rlhf/dvc.yaml`
starts from the root file's data and sft, as `dvc repro recipes/rlhf/dvc.yaml` does); a file whose stages read several params files
is one pipeline per params file (`recipes/search/dvc.yaml`: `search` and `search_bridge`).
`--set` overrides that every task of a pipeline passes are the pipeline's (`Pipeline.overrides`, applied once
when the launcher resolves the settings); any others stay with their task. Whether a stage wants a GPU comes
from its registry entry (`gpu=`), so a newly registered stage needs no edits here.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from posttrain.errors import UserError

OUTPUTS = "outputs/"
# pipeline name -> its dvc.yaml, relative to the repository root (the root file is the embedded default)
PIPELINE_FILES = {"text": "dvc.yaml"}
RECIPES = "recipes"  # recipes/<name>/dvc.yaml: the pipeline of recipe <name>, found without an entry here
PARAMS = "params.yaml"  # the params file a task reads when its command names none (`--params`)


def pipeline_files(repo: Path) -> dict[str, str]:
    """Pipeline name -> its dvc.yaml relative to `repo`: `PIPELINE_FILES` and every recipe's `recipes/<name>/dvc.yaml`."""
    found = {name: path for name, path in PIPELINE_FILES.items() if (Path(repo) / path).is_file()}
    for path in sorted((Path(repo) / RECIPES).glob("*/dvc.yaml")):
        if path.parent.name in found:
            raise UserError(f"{RECIPES}/{path.parent.name}/dvc.yaml: pipeline {path.parent.name!r} exists already")
        found[path.parent.name] = f"{RECIPES}/{path.parent.name}/dvc.yaml"
    return found
_VARIABLE = re.compile(r"\$\{([^}]*)\}")


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
    extra_args: tuple[str, ...] = field(default=())  # --set overrides of this task alone (not the pipeline's)
    sections: tuple[str, ...] = field(default=())  # the settings sections its dvc.yaml `params:` lists (what it reads)
    params: str = PARAMS  # the params file its command reads (`--params`), relative to the repository root


@dataclass(frozen=True)
class Pipeline:
    name: str
    tasks: list[Task]  # topological order
    overrides: tuple[str, ...]  # section.key=value that every task passes in dvc.yaml: applied with the settings
    params: str = PARAMS  # the params file its own tasks read (a recipe's `recipes/<name>/params.yaml`): the defaults


def _variables(spec: dict, where: str) -> dict[str, str]:
    """`vars:` entries given inline ({name: value}); a file name there (params.yaml) only feeds `params:`."""
    found: dict[str, str] = {}
    for entry in spec.get("vars") or []:
        if isinstance(entry, dict):
            found.update({str(k): str(v) for k, v in entry.items()})
        elif not isinstance(entry, str):
            raise UserError(f"{where}: vars entries must be mappings or file names, got {entry!r}")
    return found


def _fill(node, values: dict[str, str], where: str):
    if isinstance(node, dict):
        return {k: _fill(v, values, where) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, values, where) for v in node]
    if not isinstance(node, str):
        return node

    def one(match: re.Match) -> str:
        if match.group(1) not in values:
            raise UserError(f"{where}: ${{{match.group(1)}}} is not defined in vars or the matrix")
        return values[match.group(1)]

    return _VARIABLE.sub(one, node)


def _expand(name: str, stage: dict, variables: dict[str, str], where: str) -> dict[str, dict]:
    body = {k: v for k, v in stage.items() if k not in ("matrix", "vars")}
    own = {**variables, **_variables(stage, f"{where} stage {name!r}")}
    matrix = stage.get("matrix")
    if not matrix:
        return {name: _fill(body, own, f"{where} stage {name!r}")}
    keys = list(matrix)
    expanded = {}
    for values in itertools.product(*(matrix[k] for k in keys)):
        item = {**own, **{f"item.{k}": str(v) for k, v in zip(keys, values)}}
        expanded[f"{name}@{'-'.join(str(v) for v in values)}"] = _fill(body, item, f"{where} stage {name!r}")
    return expanded


def _owner(path: str, outs: dict[str, str]) -> str | None:
    """The task whose output directory contains `path`."""
    best = None
    for out, task_id in outs.items():
        if path == out or path.startswith(out + "/"):
            if best is None or len(out) > len(best[0]):
                best = (out, task_id)
    return best[1] if best else None


def _read(dvc_yaml: Path, repo: Path, pipeline: str) -> dict[str, tuple[list[str], dict, str]]:
    """task id -> (argv, stage, pipeline), with `--in`/`--out`/deps paths relative to the repository root."""
    from posttrain.resolve import all_registries

    stages = all_registries()["stages"]  # the recipes' and plugins' stages too

    where = str(Path(os.path.relpath(dvc_yaml, repo)))
    spec = yaml.safe_load(Path(dvc_yaml).read_text()) or {}
    variables = _variables(spec, where)
    found = {}
    for name, stage in (spec.get("stages") or {}).items():
        for tid, expanded in _expand(name, stage, variables, where).items():
            argv = shlex.split(expanded["cmd"])
            if argv[:1] != ["posttrain"] or len(argv) < 2 or argv[1] not in stages:
                raise UserError(f"{where} stage {tid!r}: command must be `posttrain <registered stage> ...`, got {expanded['cmd']!r}")
            wdir = Path(dvc_yaml).parent / expanded.get("wdir", ".")

            def from_root(path: str, wdir: Path = wdir) -> str:
                return os.path.relpath(os.path.normpath(wdir / path), repo) if "://" not in path else path

            argv = [*argv[:2], *_rebased(argv[2:], from_root)]
            expanded["deps"] = [from_root(d) if isinstance(d, str) else d for d in expanded.get("deps", [])]
            found[tid] = (argv, expanded, pipeline)
    return found


def _rebased(args: list[str], from_root) -> list[str]:
    """`--out P`, `--in k=P`, `--params P` (either spelling) with P relative to the repository root."""
    rebased = []
    for i, arg in enumerate(args):
        flag = args[i - 1] if i else ""
        if flag in ("--out", "--params"):
            arg = from_root(arg)
        elif arg.startswith("--params="):
            arg = "--params=" + from_root(arg[9:])
        elif flag == "--in":
            key, _, path = arg.partition("=")
            arg = f"{key}={from_root(path)}"
        elif arg.startswith("--out="):
            arg = "--out=" + from_root(arg[6:])
        elif arg.startswith("--in="):
            key, _, path = arg[5:].partition("=")
            arg = f"--in={key}={from_root(path)}"
        rebased.append(arg)
    return rebased


def load_tasks(dvc_yaml: Path, repo: Path | None = None, upstream: tuple[Path, ...] = (), pipeline: str = "text") -> list[Task]:
    """The `posttrain` stages of `dvc_yaml` and those of the `upstream` files they read from, in a topological
    order (file order among ready tasks). Paths are relative to `repo` (default: the folder of `dvc_yaml`)."""
    from posttrain.resolve import all_registries

    stages = all_registries()["stages"]  # the recipes' and plugins' stages too

    repo = Path(repo or Path(dvc_yaml).parent)
    parsed = _read(Path(dvc_yaml), repo, pipeline)
    own = set(parsed)
    for other in upstream:
        for tid, found in _read(other, repo, _pipeline_of(other, repo)).items():
            if tid in parsed and parsed[tid][0] != found[0]:
                raise UserError(f"stage {tid!r} is defined differently in {dvc_yaml} and {other}")
            parsed.setdefault(tid, found)
    outs: dict[str, str] = {}
    for tid, (argv, _, _) in parsed.items():
        outs[_value(argv, "--out") or f"{OUTPUTS}{argv[1]}"] = tid
    tasks = {}
    for tid, (argv, stage, owner_pipeline) in parsed.items():
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
            pipeline=owner_pipeline,
            deterministic=entry.meta.get("deterministic", True),
            extra_args=tuple(f"--set={v}" for v in _values(argv, "--set")),
            sections=_param_sections(stage.get("params")),
            params=_value(argv, "--params") or PARAMS,
        )
    return [t for t in _topological(tasks) if t.id in _with_ancestors(own, tasks)]


def _param_sections(params) -> tuple[str, ...]:
    """The settings sections of a dvc stage's `params:` (`rl`, `rl.lr`, or a file's {path: [keys]}), sorted."""
    keys: list[str] = []
    for entry in params or []:
        if isinstance(entry, str):
            keys.append(entry)
        elif isinstance(entry, dict):
            keys += [k for values in entry.values() for k in (values or [])]
    return tuple(sorted({str(k).split(".", 1)[0] for k in keys}))


def _pipeline_of(dvc_yaml: Path, repo: Path) -> str:
    relative = Path(os.path.relpath(dvc_yaml, repo)).as_posix()
    return next((name for name, path in pipeline_files(repo).items() if path == relative), relative)


def _with_ancestors(ids: set[str], tasks: dict[str, Task]) -> set[str]:
    found, todo = set(), list(ids)
    while todo:
        tid = todo.pop()
        if tid not in found:
            found.add(tid)
            todo.extend(tasks[tid].after)
    return found


def load_pipelines(repo: Path) -> dict[str, Pipeline]:
    """Every pipeline present in `repo` (`pipeline_files`): its tasks (with the stages of the other files it reads
    from), the `--set` overrides all of them pass, which move from the tasks to the pipeline, and the params file
    its own tasks read. A dvc.yaml whose stages read several params files is one pipeline per file (`_per_params_file`):
    the launchers resolve one params file per run."""
    files = {name: Path(repo) / path for name, path in pipeline_files(repo).items()}
    found: dict[str, Pipeline] = {}
    for name, path in files.items():
        tasks = load_tasks(path, repo, tuple(f for n, f in files.items() if n != name), name)
        for pipeline_name, params, kept in _per_params_file(name, tasks):
            if pipeline_name != name and (pipeline_name in files or pipeline_name in found):
                raise UserError(f"{pipeline_files(repo)[name]}: its {params} stages would be pipeline {pipeline_name!r}, which exists already")
            shared = [a for a in kept[0].extra_args if all(a in t.extra_args for t in kept)] if kept else []
            kept = [replace(t, extra_args=tuple(a for a in t.extra_args if a not in shared)) for t in kept]
            found[pipeline_name] = Pipeline(pipeline_name, kept, tuple(a.removeprefix("--set=") for a in shared), params)
    return found


def _per_params_file(name: str, tasks: list[Task]) -> list[tuple[str, str, list[Task]]]:
    """(pipeline name, params file, tasks) for each params file the own tasks of pipeline `name` read, each with the
    tasks upstream of them. One file: the pipeline as it is. Several (recipes/search: ASCT reads params.yaml, BRIDGE
    bridge.yaml, which sets another `task` and `model`): one pipeline per file, named `name` for the recipe's
    params.yaml and `<name>_<file stem>` for another (search_bridge), so each runs on one resolved config as
    `dvc repro` runs each stage on its own file. A stage upstream of another that reads another file is refused."""
    by_id = {t.id: t for t in tasks}
    own: dict[str, set[str]] = {}
    for task in tasks:
        if task.pipeline == name:
            own.setdefault(task.params, set()).add(task.id)
    if len(own) <= 1:
        return [(name, next(iter(own), PARAMS), tasks)]
    made = []
    for params, ids in own.items():
        kept = _with_ancestors(ids, by_id)
        other = next((by_id[t] for t in sorted(kept) if by_id[t].pipeline == name and by_id[t].params != params), None)
        if other is not None:
            raise UserError(f"pipeline {name!r}: stage {other.id!r} reads {other.params} but a stage downstream of it reads {params}; "
                            "the launchers resolve one params file per run")
        made.append((name if Path(params).name == PARAMS else f"{name}_{Path(params).stem}", params, [t for t in tasks if t.id in kept]))
    return made


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


def params_of(pipeline: Pipeline, params: Path, repo: Path) -> Path:
    """The params file of `pipeline`'s settings: `params` (the launchers' params.yaml) unless the pipeline's tasks
    read their own (a recipe's `recipes/<name>/params.yaml`, relative to `repo`)."""
    return Path(params) if pipeline.params == PARAMS else Path(repo) / pipeline.params


def check_overrides(pipeline: Pipeline, params: Path) -> None:
    """The `--set` values of a pipeline and of each of its tasks must validate against the config models (the
    sections each task's stage reads, as that stage will)."""
    from posttrain import resolve

    for task in pipeline.tasks:
        overrides = [*pipeline.overrides, *(a.removeprefix("--set=") for a in task.extra_args)]
        try:
            resolve.load(params, overrides, stage=task.stage)
        except UserError as e:
            raise UserError(f"pipeline {pipeline.name!r}, stage {task.id!r}: {e}") from None
