"""Kubeflow container components generated from the stage registry: one per stage, plus preflight and finalize.

A stage component runs `posttrain <stage> --in name=<input artifact> --out <output artifact>` with the
resolved settings (the preflight task's `config` output, JSON) written to a temporary params file, and
the pipeline run id exported so that its MLflow run carries the `pipeline_run` tag the exit task looks for.
Inputs and outputs are `Input[Artifact]` / `Output[Artifact]` directories (a model directory or an `s3://`
URI behind the artifact), so a new stage gets its component from its registry entry without edits here.
The image is set per task from the pipeline's `image` parameter.
"""

from __future__ import annotations

import inspect

from kfp import dsl

from posttrain.errors import UserError

PLACEHOLDER_IMAGE = "posttrain"  # replaced per task by the `image` pipeline parameter (set_container_image)

# $1: the resolved settings (JSON is YAML); $2: pipeline run id; the rest: `<stage> --in ... --out ...`
STAGE_SCRIPT = """set -eu
params=$(mktemp)
printf '%s' "$1" > "$params"
export POSTTRAIN_PIPELINE_RUN="$2"
shift 2
exec posttrain "$@" --params "$params" --launcher kubeflow
"""


# the same, for `posttrain trainjob` (it takes no --launcher)
LAUNCHER_SCRIPT = STAGE_SCRIPT.replace(" --launcher kubeflow", "")


def _container_component(name: str, parameters: list[inspect.Parameter], build) -> dsl.ContainerComponent:
    """`dsl.container_component` over a function with a generated signature (kfp reads it with inspect)."""
    names = [p.name for p in parameters]

    def body(*args):
        return build(dict(zip(names, args)))

    body.__signature__ = inspect.Signature(parameters)
    body.__name__ = name.replace("-", "_")
    body.__doc__ = f"posttrain {name}"
    return dsl.container_component(body)


def _param(name: str, annotation) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)


def stage_component(stage: str, extra_args: tuple[str, ...] = (), by_uri: frozenset[str] = frozenset()) -> dsl.ContainerComponent:
    """`posttrain <stage>` with one input artifact per input the stage's registry entry declares;
    `extra_args` are this task's own `--set` overrides from dvc.yaml (validated when the pipeline is built);
    the inputs in `by_uri` (imported datasets and models) are passed as their URI, which the stage reads itself."""
    from posttrain.resolve import all_registries

    stages = all_registries()["stages"]  # the recipes' and plugins' stages too
    entry = stages.entry(stage)
    inputs = list(entry.meta.get("inputs", {}))
    parameters = [_param("config", str), _param("pipeline_run", str)]
    parameters += [_param(key, dsl.Input[dsl.Artifact]) for key in inputs]
    parameters.append(_param("out", dsl.Output[dsl.Artifact]))

    def build(args):
        argv = [stage]
        for key in inputs:
            argv += ["--in", dsl.ConcatPlaceholder([f"{key}=", args[key].uri if key in by_uri else args[key].path])]
        argv += ["--out", args["out"].path]
        if entry.meta.get("resumable"):
            argv.append("--resume")  # a retry continues from the last checkpoint if the output path outlives the pod
        argv += list(extra_args)
        return dsl.ContainerSpec(
            image=PLACEHOLDER_IMAGE, command=["sh", "-c", STAGE_SCRIPT, "posttrain-stage"], args=[args["config"], args["pipeline_run"], *argv]
        )

    return _container_component(f"posttrain-{stage}" + "".join(f"-{key}-by-uri" for key in sorted(by_uri)), parameters, build)


def trainjob_component(stage: str, task_id: str, extra_args: tuple[str, ...] = ()) -> dsl.ContainerComponent:
    """The launcher of a multi-node training task: `posttrain trainjob` submits a Kubeflow Trainer TrainJob that runs
    `posttrain <stage>` under torchrun on every node, waits for it, and saves the rendered spec as `trainjob`."""
    from posttrain.resolve import all_registries

    stages = all_registries()["stages"]  # the recipes' and plugins' stages too

    if extra_args:  # the TrainJob's nodes read the resolved settings file alone
        raise UserError(f"task {task_id!r}: per-task --set overrides cannot reach a TrainJob; set them for the pipeline")
    inputs = list(stages.entry(stage).meta.get("inputs", {}))
    parameters = [_param("config", str), _param("pipeline_run", str), _param("image", str)]
    parameters += [_param(key, dsl.Input[dsl.Artifact]) for key in inputs]
    parameters += [_param("out", dsl.Output[dsl.Artifact]), _param("trainjob", dsl.Output[dsl.Artifact])]

    def build(args):
        argv = ["trainjob", "--stage", stage, "--task", task_id, "--image", args["image"], "--pipeline-run", args["pipeline_run"]]
        for key in inputs:
            argv += ["--in", dsl.ConcatPlaceholder([f"{key}=", args[key].path])]
        argv += ["--out", args["out"].path, "--spec-out", dsl.ConcatPlaceholder([args["trainjob"].path, "/trainjob.yaml"])]
        if stages.entry(stage).meta.get("resumable"):
            argv.append("--resume")
        return dsl.ContainerSpec(image=PLACEHOLDER_IMAGE, command=["sh", "-c", LAUNCHER_SCRIPT, "posttrain-trainjob"], args=[args["config"], args["pipeline_run"], *argv])

    return _container_component(f"posttrain-trainjob-{stage}", parameters, build)


def _values_json(sections: list[str], args) -> list:
    return [arg for s in sections for arg in ("--values-json", dsl.ConcatPlaceholder([f'{{"{s}": ', args[s], "}"]))]


def _overrides(overrides: tuple[str, ...]) -> list[str]:
    return [arg for value in overrides for arg in ("--set", value)]


def _stages(stages: tuple[str, ...]) -> list[str]:
    return [arg for stage in stages for arg in ("--stage", stage)]


def preflight_component(sections: list[str], stages: tuple[str, ...], with_objective: bool = False, overrides: tuple[str, ...] = (),
                        with_arms: bool = False) -> dsl.ContainerComponent:
    """CPU check of the run (config, MLflow, S3, credentials); outputs the resolved settings as `config`.
    `stages`: the pipeline's, whose settings sections alone are checked and resolved (a bad value in a section none
    of them reads stops no run of it); `overrides`: the pipeline's own settings (its dvc.yaml `--set`), applied over
    the parameters.
    `with_objective`: one sweep arm's settings (`--sweep-arm`: a preset's every rl key, or an advantage);
    `with_arms`: the sweep's list of arms is checked (known names, none twice) before any arm starts."""
    parameters = [_param(s, dict) for s in sections]
    if with_objective:
        parameters.append(_param("objective", str))
    if with_arms:
        parameters.append(_param("objectives", list))
    parameters.append(_param("config", dsl.OutputPath(str)))

    def build(args):
        argv = ["preflight", *_values_json(sections, args)]
        if with_objective:
            argv += ["--sweep-arm", args["objective"]]
        if with_arms:
            argv += ["--sweep-arms", args["objectives"]]  # a list parameter renders as its JSON text
        argv += [*_overrides(overrides), *_stages(stages), "--write-config", args["config"]]
        return dsl.ContainerSpec(image=PLACEHOLDER_IMAGE, command=["posttrain"], args=argv)

    return _container_component("posttrain-preflight" + ("-objective" if with_objective else "-sweep" if with_arms else ""), parameters, build)


def finalize_component(sections: list[str], stages: tuple[str, ...], overrides: tuple[str, ...] = ()) -> dsl.ContainerComponent:
    """The exit task: reads the pipeline's final status and marks its unfinished MLflow runs FAILED
    (in the experiment the pipeline's overrides name); like the preflight, it checks the `stages`' sections only."""
    parameters = [_param(s, dict) for s in sections]
    parameters += [_param("pipeline_run", str), _param("status", dsl.PipelineTaskFinalStatus)]

    def build(args):
        argv = ["finalize", *_values_json(sections, args), *_overrides(overrides), *_stages(stages), "--pipeline-run", args["pipeline_run"], "--status-json", args["status"]]
        return dsl.ContainerSpec(image=PLACEHOLDER_IMAGE, command=["posttrain"], args=argv)

    return _container_component("posttrain-finalize", parameters, build)
