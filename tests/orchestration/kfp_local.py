"""Run a compiled Kubeflow pipeline YAML on this machine, task by task, as its containers would run.

Every task's container command and args are taken from the compiled YAML and its placeholders mapped:
parameters to their values, input/output artifacts to directories under a work folder, output parameters to
files, the pipeline job id to a fixed string, the exit task's final status to the status of its group. The
image is ignored: the commands run in this environment (`posttrain` on PATH). Only what our pipelines use
is supported (DAG groups, exit handlers, artifacts, parameters, Concat, ParallelFor over a list parameter with
its parallelism limit), not conditions.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PLACEHOLDER = re.compile(r"\{\{\$\.(inputs|outputs)\.(parameters|artifacts)\['([^']+)'\](?:\.(path|output_file|uri))?\}\}")


@dataclass
class TaskRun:
    name: str
    argv: list[str]
    returncode: int
    stdout: str = ""
    stderr: str = ""


@dataclass
class LocalPipeline:
    spec: dict[str, Any]
    platform: dict[str, Any]
    work: Path
    env: dict[str, str]
    job_id: str = "local-job"
    # task name -> called with the started process; may kill it (to simulate an evicted pod)
    faults: dict[str, Callable[[subprocess.Popen], None]] = field(default_factory=dict)
    runs: list[TaskRun] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path, work: Path, env: dict[str, str], **kw) -> "LocalPipeline":
        docs = list(yaml.safe_load_all(Path(path).read_text()))
        return cls(docs[0], docs[1] if len(docs) > 1 else {}, work, env, **kw)

    def run(self, arguments: dict[str, Any]) -> dict[str, str]:
        """Run the root DAG with `arguments` (defaults from the YAML); returns task name -> state."""
        root = self.spec["root"]
        values = {k: v.get("defaultValue") for k, v in root.get("inputDefinitions", {}).get("parameters", {}).items()}
        values.update(arguments)
        states: dict[str, str] = {}
        self._run_dag(root["dag"], values, {}, states, prefix="")
        return states

    # -- DAG -------------------------------------------------------------------------------------------
    def _run_dag(self, dag, params, artifacts, states, prefix) -> str:
        tasks = dag["tasks"]
        outputs: dict[str, dict[str, Any]] = {}
        local: dict[str, str] = {}
        for name in _topological(tasks):
            task = tasks[name]
            upstream = [local[d] for d in task.get("dependentTasks", [])]
            finalizer = task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED"
            if any(s != "SUCCEEDED" for s in upstream) and not finalizer:
                local[name] = states[prefix + name] = "SKIPPED"
                continue
            in_params, in_artifacts = self._resolve_inputs(task, params, artifacts, outputs, local)
            component = self.spec["components"][task["componentRef"]["name"]]
            if "parameterIterator" in task:
                state = self._run_loop(task, component, in_params, in_artifacts, states, prefix + name + "/")
            elif "dag" in component:
                state = self._run_dag(component["dag"], in_params, in_artifacts, states, prefix + name + "/")
            else:
                state, outputs[name] = self._run_container(prefix + name, component, in_params, in_artifacts)
            local[name] = states[prefix + name] = state
        failed = [n for n, s in local.items() if s == "FAILED" and not tasks[n].get("triggerPolicy")]
        return "FAILED" if failed else "SUCCEEDED"

    def _run_loop(self, task, component, params, artifacts, states, prefix) -> str:
        """A ParallelFor: the loop's DAG once per item of its list parameter, at most `parallelismLimit` at a time
        (0: no limit); iteration i's tasks are named `<loop>/<i>/<task>`. It fails if any iteration fails."""
        iterator = task["parameterIterator"]
        items = params[iterator["items"]["inputParameter"]]
        items = json.loads(items) if isinstance(items, str) else items
        limit = task.get("iteratorPolicy", {}).get("parallelismLimit", 0) or len(items)

        def iteration(i: int) -> str:
            return self._run_dag(component["dag"], {**params, iterator["itemInput"]: items[i]}, artifacts, states, f"{prefix}{i}/")

        with ThreadPoolExecutor(max_workers=max(1, min(limit, len(items)))) as pool:
            results = list(pool.map(iteration, range(len(items))))
        return "FAILED" if "FAILED" in results else "SUCCEEDED"

    def _resolve_inputs(self, task, params, artifacts, outputs, local):
        resolved_params: dict[str, Any] = {}
        constants = {}
        for key, source in task.get("inputs", {}).get("parameters", {}).items():
            if "componentInputParameter" in source:
                resolved_params[key] = params[source["componentInputParameter"]]
            elif "taskOutputParameter" in source:
                ref = source["taskOutputParameter"]
                resolved_params[key] = outputs[ref["producerTask"]][ref["outputParameterKey"]]
            elif "runtimeValue" in source:  # may refer to the task's other inputs: resolved after them
                constants[key] = source["runtimeValue"]["constant"]
            elif "taskFinalStatus" in source:
                producer = source["taskFinalStatus"]["producerTask"]
                resolved_params[key] = {
                    "state": local[producer],
                    "pipelineJobResourceName": self.job_id,
                    "pipelineTaskName": producer,
                    "error": {} if local[producer] == "SUCCEEDED" else {"code": 2, "message": f"{producer} failed"},
                }
            else:
                raise NotImplementedError(f"parameter source {source}")
        for key, constant in constants.items():
            resolved_params[key] = self._substitute(constant, resolved_params, {}, {}, {}) if isinstance(constant, str) else constant
        resolved_artifacts: dict[str, Path] = {}
        for key, source in task.get("inputs", {}).get("artifacts", {}).items():
            if "componentInputArtifact" in source:
                resolved_artifacts[key] = artifacts[source["componentInputArtifact"]]
            elif "taskOutputArtifact" in source:
                ref = source["taskOutputArtifact"]
                resolved_artifacts[key] = outputs[ref["producerTask"]][ref["outputArtifactKey"]]
            else:
                raise NotImplementedError(f"artifact source {source}")
        return resolved_params, resolved_artifacts

    # -- containers ------------------------------------------------------------------------------------
    def executor(self, component) -> dict[str, Any]:
        return self.spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]

    def task_dir(self, name: str) -> Path:
        """Where task `name` ("group/task") keeps its output artifacts and parameters."""
        return self.work / re.sub(r"[^\w.-]", "_", name)

    def _run_container(self, name, component, params, artifacts):
        container = self.executor(component)
        task_dir = self.task_dir(name)
        out_artifacts = {k: task_dir / "artifacts" / k for k in component.get("outputDefinitions", {}).get("artifacts", {})}
        out_params = {k: task_dir / "parameters" / k for k in component.get("outputDefinitions", {}).get("parameters", {})}
        for path in [*out_artifacts.values(), *out_params.values()]:
            path.parent.mkdir(parents=True, exist_ok=True)
        argv = [self._render(a, params, artifacts, out_artifacts, out_params) for a in [*container.get("command", []), *container.get("args", [])]]
        env = {**self.env, **{e["name"]: e["value"] for e in container.get("env", [])}}
        process = subprocess.Popen(argv, env=env, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        if name.split("/")[-1] in self.faults:
            self.faults[name.split("/")[-1]](process)
        stdout, stderr = process.communicate(timeout=900)
        self.runs.append(TaskRun(name, argv, process.returncode, stdout, stderr))
        if process.returncode != 0:
            return "FAILED", {}
        produced: dict[str, Any] = dict(out_artifacts)
        produced.update({k: p.read_text() for k, p in out_params.items()})
        return "SUCCEEDED", produced

    def _render(self, arg, params, artifacts, out_artifacts, out_params) -> str:
        if isinstance(arg, str) and arg.startswith('{"Concat"'):
            parts = json.loads(arg)["Concat"]
            return "".join(self._render(p, params, artifacts, out_artifacts, out_params) for p in parts)
        return self._substitute(arg, params, artifacts, out_artifacts, out_params)

    def _substitute(self, text, params, artifacts, out_artifacts, out_params) -> str:
        def one(match: re.Match) -> str:
            direction, kind, key, attr = match.groups()
            if direction == "inputs" and kind == "parameters":
                value = params[key]
                return value if isinstance(value, str) else json.dumps(value)
            if direction == "inputs":
                return str(artifacts[key])
            if kind == "artifacts":
                return str(out_artifacts[key])
            return str(out_params[key])

        return PLACEHOLDER.sub(one, text).replace("{{$.pipeline_job_uuid}}", self.job_id)


def _topological(tasks: dict[str, Any]) -> list[str]:
    order: list[str] = []
    while len(order) < len(tasks):
        ready = sorted(n for n, t in tasks.items() if n not in order and set(t.get("dependentTasks", [])) <= set(order))
        order.append(ready[0])
    return order


def kill_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
