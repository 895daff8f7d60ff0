"""Build the kfp v2 pipelines: one per `dvc.yaml` pipeline (text and each recipe's), plus the objective sweep.

Every pipeline takes the config sections as parameters (defaults: params.yaml) and `image`, runs a CPU
preflight that validates them and resolves the settings, then the stages in the order of the graph, all
inside an exit handler whose task marks the run's unfinished MLflow runs FAILED. A pipeline's own `--set`
overrides (dvc.yaml) are validated here and applied by its preflight and exit task. Launcher settings
(GPU type and count, node selector, tolerations, secrets, retries, caching) come from the `orchestration`
section of params.yaml at compile time.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from kfp import dsl, kubernetes

from components.stages import finalize_component, preflight_component, stage_component, trainjob_component
from posttrain import config
from posttrain.config import Config, OrchestrationConfig
from posttrain.errors import UserError
from posttrain.orchestration.graph import PARAMS, Pipeline, Task, check_overrides, load_pipelines, params_of
from posttrain.orchestration.preflight import without_nulls
from posttrain.orchestration.sweep import check_arms
from posttrain.resolve import settings_model

CORE_SECTIONS = list(Config.model_fields)


def pipeline_sections(tasks: list[Task]) -> list[str]:
    """A pipeline's parameters: the core sections, and a section a recipe or plugin adds only when one of its tasks
    reads it (its dvc.yaml `params:`), so adding a recipe changes no other pipeline's compiled file."""
    read = {s for task in tasks for s in task.sections}
    return CORE_SECTIONS + sorted(s for s in settings_model().model_fields if s not in CORE_SECTIONS and s in read)


def pipeline_stages(tasks: list[Task]) -> tuple[str, ...]:
    """The stages a pipeline runs: its preflight and exit task check the settings sections these read, and no other,
    so a bad value in another recipe's section stops no run of this pipeline."""
    return tuple(sorted({task.stage for task in tasks}))


def _configure(task: dsl.PipelineTask, image, orch: OrchestrationConfig, gpu: bool, cache: bool) -> None:
    task.set_container_image(image)
    for secret, keys in orch.secrets.items():  # values stay in the cluster; the YAML names the secret only
        kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env={key: env for env, key in keys.items()})
    for name, value in orch.env.items():
        task.set_env_variable(name, value)
    if orch.retries:  # every step talks to MLflow / S3; training resumes from its checkpoint on retry
        task.set_retry(orch.retries, backoff_duration=orch.retry_backoff, backoff_factor=orch.retry_backoff_factor)
    # the default cache key covers the component (command), every input (the resolved config) and the image
    task.set_caching_options(cache and orch.caching)
    if gpu:
        task.set_accelerator_type(orch.gpu.accelerator).set_accelerator_limit(orch.gpu.count)
        for key, value in orch.gpu.node_selector.items():
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        for toleration in orch.gpu.tolerations:
            kubernetes.add_toleration(task, **toleration)


def _signature(cfg: Config, sections: list[str]) -> inspect.Signature:
    defaults = {s: without_nulls(v) for s, v in cfg.model_dump(mode="json").items()}
    params = [inspect.Parameter(s, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dict, default=defaults[s]) for s in sections]
    params.append(inspect.Parameter("image", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str, default=cfg.orchestration.image))
    return inspect.Signature(params)


def _run_stages(tasks: list[Task], config_channel, image, orch: OrchestrationConfig, done: dict) -> dict:
    for task in tasks:
        if task.id in orch.imports:  # an existing dataset or model stands in for the task's output
            done[task.id] = dsl.importer(artifact_uri=orch.imports[task.id], artifact_class=dsl.Artifact, reimport=False)
            done[task.id].set_display_name(f"{task.id} (imported)")
            continue
        multi_node = orch.trainer.enabled and task.stage in orch.trainer.stages
        by_uri = frozenset(key for key, upstream in task.inputs.items() if upstream in orch.imports and not multi_node)
        artifacts = {key: done[upstream].output if upstream in orch.imports else done[upstream].outputs["out"] for key, upstream in task.inputs.items()}
        if multi_node:  # a CPU launcher task; the GPUs are requested by the TrainJob's nodes
            step = trainjob_component(task.stage, task.id, task.extra_args)(
                config=config_channel, pipeline_run=dsl.PIPELINE_JOB_ID_PLACEHOLDER, image=image, **artifacts
            )
            kubernetes.mount_pvc(step, pvc_name=orch.trainer.volume, mount_path=orch.trainer.mount_path)
        else:
            step = stage_component(task.stage, task.extra_args, by_uri)(config=config_channel, pipeline_run=dsl.PIPELINE_JOB_ID_PLACEHOLDER, **artifacts)
        step.set_display_name(task.id)
        step.after(*[done[u] for u in task.after if u not in task.inputs.values()])
        _configure(step, image, orch, task.gpu and not multi_node, task.deterministic)
        done[task.id] = step
    return done


def build_pipeline(pipeline: Pipeline, cfg: Config):
    """The kfp pipeline running `pipeline.tasks` (topologically ordered) with `cfg` as the parameter defaults."""
    orch, name, tasks = cfg.orchestration, pipeline.name, pipeline.tasks
    names, stages = pipeline_sections(tasks), pipeline_stages(tasks)
    preflight = preflight_component(names, stages, overrides=pipeline.overrides)
    finalize = finalize_component(names, stages, overrides=pipeline.overrides)

    def body(*args):
        values = dict(zip(names + ["image"], args))
        sections = {s: values[s] for s in names}
        exit_task = finalize(**sections, pipeline_run=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        _configure(exit_task, values["image"], orch, gpu=False, cache=False)
        with dsl.ExitHandler(exit_task, name="stages"):
            check = preflight(**sections)
            _configure(check, values["image"], orch, gpu=False, cache=False)
            _run_stages(tasks, check.outputs["config"], values["image"], orch, {})

    body.__signature__ = _signature(cfg, names)
    body.__name__ = f"posttrain_{name}"
    return dsl.pipeline(name=f"posttrain-{name}", description=f"posttrain {name} pipeline: {' -> '.join(t.id for t in tasks)}")(body)


def build_sweep(tasks: list[Task], cfg: Config):
    """Shared stages once, then the stages downstream of `rl` once per objective (ParallelFor), then compare."""
    orch = cfg.orchestration
    per_objective = _downstream_of("rl", tasks)
    shared = [t for t in tasks if t.id not in {p.id for p in per_objective}]
    names, stages = pipeline_sections(tasks), tuple(sorted({*pipeline_stages(tasks), "compare"}))
    preflight, finalize = preflight_component(names, stages, with_arms=True), finalize_component(names, stages)
    objective_preflight = preflight_component(names, stages, with_objective=True)

    def body(*args):
        values = dict(zip(names + ["image", "objectives"], args))
        sections = {s: values[s] for s in names}
        exit_task = finalize(**sections, pipeline_run=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        _configure(exit_task, values["image"], orch, gpu=False, cache=False)
        with dsl.ExitHandler(exit_task, name="sweep"):
            check = preflight(**sections, objectives=values["objectives"])
            _configure(check, values["image"], orch, gpu=False, cache=False)
            done = _run_stages(shared, check.outputs["config"], values["image"], orch, {})
            with dsl.ParallelFor(values["objectives"], parallelism=orch.sweep.parallelism) as objective:
                item_check = objective_preflight(**sections, objective=objective)
                _configure(item_check, values["image"], orch, gpu=False, cache=False)
                _run_stages(per_objective, item_check.outputs["config"], values["image"], orch, dict(done))
            compare = stage_component("compare")(config=check.outputs["config"], pipeline_run=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
            compare.set_display_name("compare")
            _configure(compare, values["image"], orch, gpu=False, cache=False)
            compare.after(item_check)

    signature = _signature(cfg, names)
    objectives = inspect.Parameter("objectives", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=list, default=list(orch.sweep.objectives))
    body.__signature__ = signature.replace(parameters=[*signature.parameters.values(), objectives])
    body.__name__ = "posttrain_sweep"
    return dsl.pipeline(name="posttrain-sweep", description="posttrain objective sweep: rl + eval per objective, then compare")(body)


def _downstream_of(task_id: str, tasks: list[Task]) -> list[Task]:
    below = {task_id}
    for task in tasks:  # topological order: one pass suffices
        if set(task.after) & below:
            below.add(task.id)
    return [t for t in tasks if t.id in below]


def _defaults(params: Path) -> Config:
    """The parameter defaults of a pipeline reading `params`: the file over the models' defaults, with `rl.preset`
    left for the preflight to expand (as the Airflow forms show it: recipes/aura/params.yaml names `rl.preset: ppo`)."""
    return config.load(params, model=settings_model(), expand_preset=lambda name, rl: {})


def build_all(params: Path, repo: Path) -> dict[str, object]:
    cfg = _defaults(params)
    found = load_pipelines(repo)
    for pipeline in found.values():
        check_overrides(pipeline, params_of(pipeline, params, repo))
    known = {t.id for p in found.values() for t in p.tasks}
    unknown = sorted(set(cfg.orchestration.imports) - known)
    if unknown:
        raise UserError(f"orchestration.imports names no task: {unknown} (tasks: {', '.join(sorted(known))})")
    check_arms(cfg.orchestration.sweep.objectives, "orchestration.sweep.objectives")
    # a recipe's pipeline takes its defaults from its own params file (which extends params.yaml)
    built = {name: build_pipeline(pipeline, cfg if pipeline.params == PARAMS else _defaults(params_of(pipeline, params, repo)))
             for name, pipeline in found.items()}
    text = found.get("text")
    if text is not None and any(t.id == "rl" for t in text.tasks):
        if text.overrides:  # the sweep's preflight resolves the plain params.yaml settings
            raise UserError(f"the sweep runs the text pipeline without its overrides {text.overrides}: move them to params.yaml")
        built["sweep"] = build_sweep(text.tasks, cfg)
    return built

