"""Multi-node training through Kubeflow Trainer: render a `TrainJob`, submit it, wait for it to end.

The launcher task of a pipeline (components/stages.py `trainjob_component`) runs `posttrain trainjob`. That
copies the task's input artifacts onto a shared volume, renders a TrainJob (trainer.kubeflow.org/v1alpha1:
the `torch-distributed` runtime starts torchrun on `num_nodes` nodes with `gpu.count` processes each, every
node running `posttrain <stage>`; trainers/distributed.py does the rest), saves the rendered spec as an
output artifact, creates it through the Kubernetes API and polls its conditions until `Complete` or `Failed`.
Past the deadline it deletes the TrainJob and fails. Rank 0 writes the stage output on the shared volume; the
launcher then copies it into its own output artifact, so downstream tasks see a normal stage output.
Credentials reach the nodes as environment variables from Kubernetes secrets (`secretKeyRef`), never values.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from posttrain.config import OrchestrationConfig
from posttrain.errors import UserError

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"


def job_name(pipeline_run: str, task: str) -> str:
    """A DNS-1035 name from the pipeline run id and the task: unique per run, stable across the task's retries."""
    raw = re.sub(r"[^a-z0-9-]+", "-", f"pt-{task}-{pipeline_run}".lower()).strip("-")
    return raw[:63].rstrip("-")


def render(name: str, image: str, command: list[str], orch: OrchestrationConfig, env: dict[str, str]) -> dict[str, Any]:
    """The TrainJob: `command` on every node of the runtime, GPUs per node, secrets as env refs, the shared volume."""
    trainer = orch.trainer
    secret_env = [
        {"name": env_name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for secret, keys in orch.secrets.items()
        for env_name, key in keys.items()
    ]
    plain_env = [{"name": k, "value": v} for k, v in {**orch.env, **env}.items()]
    pod_spec = {
        "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": trainer.volume}}],
        "containers": [{"name": "node", "volumeMounts": [{"name": "shared", "mountPath": trainer.mount_path}]}],
    }
    if orch.gpu.node_selector:
        pod_spec["nodeSelector"] = dict(orch.gpu.node_selector)
    if orch.gpu.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in orch.gpu.tolerations]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": trainer.namespace, "labels": {"app.kubernetes.io/managed-by": "posttrain"}},
        "spec": {
            "runtimeRef": {"name": trainer.runtime, "kind": "ClusterTrainingRuntime", "apiGroup": GROUP},
            "trainer": {
                "image": image,
                "command": command,
                "numNodes": trainer.num_nodes,
                "numProcPerNode": orch.gpu.count,
                "resourcesPerNode": {"limits": {orch.gpu.accelerator: str(orch.gpu.count)}},
                "env": plain_env + secret_env,
            },
            "podSpecOverrides": [{"targetJobs": [{"name": "node"}], **pod_spec}],
        },
    }


def _conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (job.get("status") or {}).get("conditions", []) if c.get("status") == "True"}


def submit_and_wait(spec: dict[str, Any], kube_client, deadline_seconds: float, poll_seconds: float) -> str:
    """Create the TrainJob (or adopt it, when a retried launcher finds it already there) and wait for its end.
    Returns the final condition's message; raises UserError when it failed or ran past the deadline."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi(kube_client)
    name, namespace = spec["metadata"]["name"], spec["metadata"]["namespace"]
    where = dict(group=GROUP, version=VERSION, namespace=namespace, plural=PLURAL)
    try:
        api.create_namespaced_custom_object(body=spec, **where)
    except ApiException as e:
        if e.status != 409:  # 409: this run's job exists already (the launcher was retried): wait for it
            raise UserError(f"the Kubernetes API refused TrainJob {name}: {e.status} {e.reason}") from None
    start = time.monotonic()
    while True:
        job = api.get_namespaced_custom_object(name=name, **where)
        ended = _conditions(job)
        if "Failed" in ended:
            raise UserError(f"TrainJob {name} failed: {ended['Failed'].get('message', '')}")
        if "Complete" in ended:
            return ended["Complete"].get("message", "")
        if time.monotonic() - start > deadline_seconds:
            api.delete_namespaced_custom_object(name=name, **where)
            raise UserError(f"TrainJob {name} ran past its deadline of {deadline_seconds:.0f} s: deleted")
        time.sleep(poll_seconds)


def api_client(host: str | None = None):
    """In a pod: the service account; elsewhere: the kubeconfig (KUBECONFIG)."""
    from kubernetes import client, config

    if host:
        configuration = client.Configuration()
        configuration.host = host
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def launch(
    stage: str, params: Path, inputs: dict[str, Path], out: Path, spec_out: Path, image: str, pipeline_run: str, task: str, resume: bool,
    host: str | None = None,
) -> str:
    """What the launcher task does: inputs onto the shared volume, render + save + submit the TrainJob, wait,
    then the output back into the task's artifact."""
    from posttrain import resolve
    from posttrain.resolve import all_registries

    stages = all_registries()["stages"]  # the recipes' and plugins' stages too

    cfg = resolve.load(params)
    orch = cfg.orchestration
    if stage not in orch.trainer.stages:
        raise UserError(f"stage {stage!r} is not in orchestration.trainer.stages {list(orch.trainer.stages)}")
    if resume and not stages.entry(stage).meta.get("resumable"):
        resume = False
    name = job_name(pipeline_run, task)
    shared = Path(orch.trainer.mount_path) / name
    (shared / "inputs").mkdir(parents=True, exist_ok=True)
    for key, path in inputs.items():  # a retried launcher finds them there already
        if not (shared / "inputs" / key).exists():
            shutil.copytree(path, shared / "inputs" / key)
    shutil.copy(params, shared / "params.yaml")
    command = ["torchrun", "--no-python", "posttrain", stage, "--params", str(shared / "params.yaml"), "--out", str(shared / "out")]
    command += [arg for key in inputs for arg in ("--in", f"{key}={shared / 'inputs' / key}")]
    command += ["--launcher", "kubeflow-trainer", *(["--resume"] if resume else [])]
    spec = render(name, image, command, orch, {"POSTTRAIN_PIPELINE_RUN": pipeline_run})
    spec_out.parent.mkdir(parents=True, exist_ok=True)
    spec_out.write_text(yaml.safe_dump(spec, sort_keys=False))
    message = submit_and_wait(spec, api_client(host), orch.trainer.deadline_seconds, orch.trainer.poll_seconds)
    if not (shared / "out" / "metrics.json").is_file():
        raise UserError(f"TrainJob {name} completed but wrote no output at {shared / 'out'}")
    shutil.copytree(shared / "out", out, dirs_exist_ok=True)
    return f"TrainJob {name} complete{': ' + message if message else ''}"
