"""Airflow 3 DAGs for posttrain: one per pipeline (`posttrain_text`, ...) and an objective sweep, triggered from the UI.

Everything comes from `posttrain_pipelines.json` (written by `make pipelines` from params.yaml, the config
models and dvc.yaml), so this file imports neither posttrain nor torch. Each task runs `posttrain <stage>`:
as a Bash task in the environment Airflow runs in (the default: a laptop running Airflow really trains), or
as a Kubernetes pod on a GPU node pool when `orchestration.airflow.executor` is `kubernetes`.

Each DAG's trigger form holds the sections its stages read (their dvc.yaml `params:`) and the run-wide ones
(pipeline, tracking, training), each key described by the comment on its line in its settings model. Every key has a default, so none is
required: a field left empty is its params.yaml value. Params are validated against the generated JSON Schema when a run is triggered; the `preflight` task then
validates the sections the DAG's stages read with the config models (the trigger's `conf` too: a key that is no
setting, `rl.stepz`, is refused by name; a bad value in a section none of its stages reads stops no run) and
checks MLflow, S3 and credentials before any training starts. The `finalize` teardown and every
task's failure callback mark the run's unfinished MLflow runs FAILED; when any task failed or was skipped (a run
marked failed), `finalize` fails too, so the DAG run ends failed rather than taking the teardown's success.
The sweep's arms are presets or advantage estimators (`posttrain.orchestration.sweep`), each at most once.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, Param, task

SPEC = json.loads(Path(__file__).with_name("posttrain_pipelines.json").read_text())
REPO = Path(os.environ.get("POSTTRAIN_REPO", Path(__file__).resolve().parents[1]))  # the checkout with params.yaml
POSTTRAIN = os.environ.get("POSTTRAIN_BIN") or shutil.which("posttrain") or str(Path(sys.executable).with_name("posttrain"))
ORCH = SPEC["orchestration"]
RUNS = Path(os.environ.get("POSTTRAIN_RUNS_DIR", ORCH["airflow"]["runs_dir"]))
RUN_DIR = f"{RUNS if RUNS.is_absolute() else REPO / RUNS}/{{{{ run_id }}}}"  # shell-quoted wherever it is used
VALUES = "$POSTTRAIN_VALUES"  # the trigger form's values (validated by Airflow) as JSON, for preflight
CONF = "$POSTTRAIN_CONF"  # the trigger's own conf as given: its unknown keys reach preflight, which names them
RUN_ENV = {
    "POSTTRAIN_VALUES": "{{ params | config_values | tojson }}", "POSTTRAIN_CONF": "{{ dag_run.conf | conf_settings | tojson }}",
    "POSTTRAIN_PIPELINE_RUN": "{{ run_id }}", **ORCH["env"],
}
PARAMS_FILES = SPEC.get("params_files", {})  # a recipe's pipeline reads its own params file (which extends params.yaml)


def params_file(dag_id: str) -> str:
    """The params file under a DAG's run: params.yaml, or the recipe's own (recipes/<name>/params.yaml)."""
    return str(REPO / PARAMS_FILES.get(dag_id.removeprefix("posttrain_"), "params.yaml"))
FAILED_STATES = {"failed", "upstream_failed", "skipped", "removed"}  # no task of these DAGs skips unless the run was stopped


# keys whose own schema does not admit null: in the form they are optional, and null (an emptied field) is their default
NULL_IS_DEFAULT = {name for name, p in SPEC["params"].items() if p["schema"].get("type") not in (None, "null")}
DEFAULT_LABEL = "default: {}"  # a drop-down's null choice


def optional(name: str) -> dict:
    """The trigger form's schema of setting `name`: its type admits null too, since the form marks every field
    required whose type does not, and an emptied field (null) reads as the default (`emptied`). A drop-down gains
    that choice, labelled with the default. A key whose schema admits null already is left alone (null is one of
    its values)."""
    spec = SPEC["params"][name]
    schema = spec["schema"]
    if name not in NULL_IS_DEFAULT:
        return schema
    made = {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        made["enum"] = [*schema["enum"], None]
        made["values_display"] = {"null": DEFAULT_LABEL.format(json.dumps(spec["default"]))}
    return made


def emptied(name: str, value) -> bool:
    """An emptied field (or a null in the conf) of a key for which null is no value: left out, so the run takes
    params.yaml's value."""
    return value is None and name in NULL_IS_DEFAULT


def config_values(params) -> dict:
    """The run's settings among its Params (a sweep DAG also has `objectives`, which is no config key), less the
    emptied ones."""
    return {name: value for name, value in dict(params).items() if name in SPEC["params"] and not emptied(name, value)}


def conf_settings(conf) -> dict:
    """The trigger's conf without the sweep's `objectives` (no config key) and the emptied keys: every other key must
    be a setting."""
    return {name: value for name, value in dict(conf or {}).items() if name != "objectives" and not emptied(name, value)}


def objectives_of(params) -> list:
    """The sweep's arms: the form's choice, or orchestration.sweep.objectives when the field was emptied."""
    return dict(params).get("objectives") or list(ORCH["sweep"]["objectives"])


def pipeline_state(ti) -> str:
    """`failed` if any other task of this DAG run failed or was skipped (the run was marked failed), else `ended`."""
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
    return "failed" if any(state in FAILED_STATES for task_id, state in states.items() if task_id != ti.task_id) else "ended"


def form_sections(tasks: list[dict]) -> set[str]:
    """The sections a DAG's form shows: those its tasks' dvc.yaml entries read, and the ones every stage reads."""
    return {*SPEC["form_sections"], *(section for t in tasks for section in t["sections"])}


def run_params(sections: set[str], sweep: bool, defaults: dict | None = None) -> dict[str, Param]:
    """The trigger form: a Param per setting of `sections` (a key of another section can still be set through the
    run's conf: preflight validates every key), with `defaults` (a recipe's own params file) over params.yaml's."""
    defaults = defaults or {}
    made = {name: Param(defaults.get(name, p["default"]), description=p["description"], section=p["section"], **optional(name))
            for name, p in SPEC["params"].items() if p["section"] in sections}
    if sweep:
        arms = SPEC["sweep_arms"]
        made["objectives"] = Param(
            list(ORCH["sweep"]["objectives"]), section="sweep", type=["array", "null"], minItems=1, uniqueItems=True, items={"type": "string", "enum": arms},
            examples=arms,  # an array Param with examples is a multi-select in the trigger form
            description="The arms: a preset (all its rl keys, e.g. dr_grpo's aggregation) or an advantage estimator; each once (empty: orchestration.sweep.objectives).",
        )
    return made


def out_of(task_id: str) -> str:
    return next(t["out"] for tasks in SPEC["pipelines"].values() for t in tasks if t["id"] == task_id)


def stage_argv(spec: dict, run_dir: str, input_dirs: dict[str, str] | None = None) -> list[str]:
    argv = [spec["stage"], "--params", f"{run_dir}/params.yaml", "--out", f"{run_dir}/{spec['out']}", "--launcher", "airflow"]
    for key, upstream in spec["inputs"].items():
        if upstream in ORCH["imports"]:  # an existing dataset or model: the stage reads its URI itself
            argv += ["--in", f"{key}={ORCH['imports'][upstream]}"]
        else:
            argv += ["--in", f"{key}={(input_dirs or {}).get(upstream, run_dir)}/{out_of(upstream)}"]
    return argv + (["--resume"] if spec["resume"] else []) + spec["extra_args"]


def shell(argv: list[str]) -> str:
    return " ".join(f'"{a}"' if a in (VALUES, CONF) else shlex.quote(a) for a in [POSTTRAIN, *argv])


def overrides_of(dag_id: str) -> list[str]:
    """`--set` arguments of the pipeline's own settings (its dvc.yaml overrides, e.g. the image pipeline's experiment)."""
    values = SPEC["overrides"].get(dag_id.removeprefix("posttrain_"), [])
    return [arg for value in values for arg in ("--set", value)]


def stages_of(dag_id: str) -> list[str]:
    """`--stage` arguments of the stages a DAG runs (the sweep: the text pipeline's and compare): its preflight and
    finalize check the settings sections these read and no other, so a bad value in another recipe's section stops
    no run of this DAG."""
    name = dag_id.removeprefix("posttrain_")
    tasks = SPEC["pipelines"]["text" if name == "sweep" else name]
    stages = {t["stage"] for t in tasks} | ({"compare"} if name == "sweep" else set())
    return [arg for stage in sorted(stages) for arg in ("--stage", stage)]


def mark_failed(context) -> None:
    """Failure callback: a killed stage cannot close its own MLflow run."""
    dag_id = context["dag"].dag_id
    argv = ["finalize", "--params", params_file(dag_id), "--values-json", json.dumps(config_values(context["params"])), *overrides_of(dag_id), *stages_of(dag_id)]
    argv += ["--pipeline-run", context["run_id"], "--state", "failed"]
    subprocess.run([POSTTRAIN, *argv], cwd=REPO, timeout=300, check=False)


def bash_task(task_id: str, argv: list[str], gpu: bool, **kwargs):
    from airflow.providers.standard.operators.bash import BashOperator

    return BashOperator(task_id=task_id, bash_command=shell(argv), cwd=str(REPO), env=RUN_ENV, append_env=True, **kwargs)


def pod_command(command: str) -> str:
    """A shell command of this Airflow's environment as the image runs it (its posttrain, its paths)."""
    return command.replace(POSTTRAIN, "posttrain").replace(RUN_ROOT, POD_RUN_ROOT).replace(str(REPO), IMAGE_WORKDIR)


def pod_settings(task_id: str, gpu: bool) -> dict:
    """The KubernetesPodOperator settings of a task: credentials as Kubernetes secrets (the operator's `secrets`: env
    from secretKeyRef), never in the arguments. The run directory lies on the PersistentVolumeClaim
    `orchestration.airflow.volume`, mounted by every pod at the same path, so each task reads its upstream outputs."""
    from airflow.providers.cncf.kubernetes.secret import Secret
    from kubernetes.client import models as k8s

    secrets = [Secret("env", env, name, key) for name, keys in ORCH["secrets"].items() for env, key in keys.items()]
    runs = k8s.V1Volume(name="runs", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=ORCH["airflow"]["volume"]))
    settings = {
        "task_id": task_id, "name": task_id.replace("_", "-"), "namespace": ORCH["airflow"]["namespace"], "image": ORCH["image"],
        "cmds": ["sh", "-c"], "env_vars": RUN_ENV, "secrets": secrets,
        "volumes": [runs], "volume_mounts": [k8s.V1VolumeMount(name="runs", mount_path=POD_RUN_ROOT)],
    }
    if gpu:
        settings.update(
            container_resources=k8s.V1ResourceRequirements(limits={ORCH["gpu"]["accelerator"]: str(ORCH["gpu"]["count"])}),
            node_selector=ORCH["gpu"]["node_selector"],
            tolerations=[k8s.V1Toleration(**t) for t in ORCH["gpu"]["tolerations"]],
        )
    return settings


def pod_task(task_id: str, argv: list[str], gpu: bool, **kwargs):
    """The same command in the posttrain image, in its own pod (see `pod_settings`)."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return KubernetesPodOperator(arguments=[pod_command(shell(argv))], **pod_settings(task_id, gpu), **kwargs)


def bash_mapped(task_id: str, commands, gpu: bool):
    from airflow.providers.standard.operators.bash import BashOperator

    return BashOperator.partial(task_id=task_id, cwd=str(REPO), env=RUN_ENV, append_env=True).expand(bash_command=commands)


def pod_mapped(task_id: str, commands, gpu: bool):
    """One pod per item of `commands` (the upstream task's `[shell command]` lists, already in the image's paths)."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return KubernetesPodOperator.partial(**pod_settings(task_id, gpu)).expand(arguments=commands)


IMAGE_WORKDIR = "/opt/posttrain"  # docker/Dockerfile: the package, params.yaml and dvc.yaml
RUN_ROOT = str(RUNS if RUNS.is_absolute() else REPO / RUNS)
POD_RUN_ROOT = str(RUNS) if RUNS.is_absolute() else f"{IMAGE_WORKDIR}/{RUNS}"  # where the pods mount the runs volume
IN_PODS = os.environ.get("POSTTRAIN_AIRFLOW_EXECUTOR", ORCH["airflow"]["executor"]) == "kubernetes"
launch, launch_mapped = (pod_task, pod_mapped) if IN_PODS else (bash_task, bash_mapped)


def build(dag_id: str, tasks: list[dict], sweep: bool = False) -> DAG:
    sections = form_sections(SPEC["pipelines"]["text"] if sweep else tasks)  # a sweep runs every text task (per arm)
    with DAG(
        dag_id, schedule=None, catchup=False, params=run_params(sections, sweep, SPEC.get("defaults", {}).get(dag_id.removeprefix("posttrain_"))),
        tags=["posttrain"], doc_md=__doc__,
        user_defined_filters={"config_values": config_values, "conf_settings": conf_settings, "objectives_of": objectives_of, "pipeline_state": pipeline_state},
        default_args={
            "retries": int(os.environ.get("POSTTRAIN_AIRFLOW_RETRIES", ORCH["retries"])),
            "retry_delay": timedelta(seconds=float(os.environ.get("POSTTRAIN_AIRFLOW_RETRY_DELAY", ORCH["retry_backoff"]).rstrip("s"))),
            "retry_exponential_backoff": ORCH["retry_backoff_factor"],
            "on_failure_callback": mark_failed,
        },
        description=" -> ".join(t["id"] for t in tasks) + (" -> objectives -> compare" if sweep else ""),
    ) as dag:
        check = ["--params", params_file(dag_id), "--values-json", VALUES, *overrides_of(dag_id), *stages_of(dag_id)]  # preflight writes them into the run's params.yaml
        arms = ["--sweep-arms", "{{ params | objectives_of | tojson }}"] if sweep else []
        preflight = launch("preflight", ["preflight", *check, "--values-json", CONF, *arms, "--write-config", f"{RUN_DIR}/params.yaml"], gpu=False, retries=0)
        # no retries: a failed run makes it fail on purpose (its MLflow call has its own retries)
        finalize = launch(
            "finalize", ["finalize", *check, "--pipeline-run", "{{ run_id }}", "--state", "{{ ti | pipeline_state }}", "--fail-if-failed", "--cleanup", RUN_DIR],
            gpu=False, retries=0,
        )
        made = {}
        for spec in tasks:
            if spec["id"] in ORCH["imports"]:  # orchestration.imports: not run; its consumers read the URI
                continue
            step = launch(spec["id"].replace("@", "_"), stage_argv(spec, RUN_DIR), gpu=spec["gpu"])
            for upstream in spec["after"]:
                if upstream in made:
                    made[upstream] >> step
            preflight >> step
            step >> finalize
            made[spec["id"]] = step
        if sweep:
            leaves = [made[t["id"]] for t in tasks if t["id"] in made]
            compare = launch("compare", ["compare", "--params", f"{RUN_DIR}/params.yaml", "--out", f"{RUN_DIR}/compare", "--launcher", "airflow"], gpu=False)
            commands, objectives = objective_runs(SPEC["pipelines"]["text"], {t["id"] for t in tasks})
            leaves >> commands
            objectives >> compare >> finalize
        finalize.as_teardown(setups=preflight, on_failure_fail_dagrun=True)
    return dag


def objective_runs(text_tasks: list[dict], shared: set[str]):
    """One mapped task per arm (`.expand`, a Bash task or a pod as the executor says): its own preflight, which
    applies the arm (`--sweep-arm`: a preset's every rl key, or an advantage), then the stages that depend on `rl`."""
    per_objective = [t for t in text_tasks if t["id"] not in shared]

    @task
    def objective_commands(run_dir: str, params: dict | None = None) -> list:  # params: from the run context
        commands = []
        for objective in objectives_of(params):
            own = f"{run_dir}/objectives/{objective}"
            steps = [["preflight", "--params", f"{run_dir}/params.yaml", "--sweep-arm", objective, *stages_of("posttrain_sweep"), "--write-config", f"{own}/params.yaml"]]
            steps += [stage_argv(t, own, {s: run_dir for s in shared}) for t in per_objective]
            command = " && ".join(shell(s) for s in steps)
            commands.append([pod_command(command)] if IN_PODS else command)  # a pod's `arguments` is a list
        return commands

    commands = objective_commands(run_dir=RUN_DIR)
    return commands, launch_mapped("objective", commands, gpu=any(t["gpu"] for t in per_objective))


for _name, _tasks in SPEC["pipelines"].items():
    globals()[f"posttrain_{_name}"] = build(f"posttrain_{_name}", _tasks)
if "text" in SPEC["pipelines"]:
    _below_rl = {"rl"}
    for _t in SPEC["pipelines"]["text"]:
        if set(_t["after"]) & _below_rl:
            _below_rl.add(_t["id"])
    posttrain_sweep = build("posttrain_sweep", [t for t in SPEC["pipelines"]["text"] if t["id"] not in _below_rl], sweep=True)
