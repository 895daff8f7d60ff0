"""The Kubeflow Trainer launcher: the rendered TrainJob, and submit / wait / deadline against a loopback stand-in
for the Kubernetes API (what `posttrain trainjob` does inside the pipeline's launcher task)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from orch_helpers import loopback_server
import yaml

from helpers import REPO, micro_params
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.orchestration.trainjob import job_name, launch, render

JOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/kubeflow/trainjobs"


class FakeKubernetes(BaseHTTPRequestHandler):
    """The TrainJob calls of the custom-objects API. `outcome` decides how the job ends; on completion the
    fake controller writes what rank 0 would write on the shared volume."""

    requests: list[tuple[str, str, dict]] = []
    outcome = "Complete"
    polls_before_end = 2
    shared: Path | None = None

    def _reply(self, code: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(("POST", self.path, body))
        self._reply(201, body)

    def do_GET(self):
        self.requests.append(("GET", self.path, {}))
        name = self.path.rsplit("/", 1)[-1]
        polls = sum(1 for method, path, _ in self.requests if method == "GET" and path == self.path)
        conditions = [{"type": "Created", "status": "True"}]
        if self.outcome and polls > self.polls_before_end:
            conditions.append({"type": self.outcome, "status": "True", "message": f"job {self.outcome.lower()}"})
            if self.outcome == "Complete":
                out = self.shared / name / "out"
                out.mkdir(parents=True, exist_ok=True)
                (out / "metrics.json").write_text('{"sft_loss": 1.0}\n')
        self._reply(200, {"metadata": {"name": name}, "status": {"conditions": conditions}})

    def do_DELETE(self):
        self.requests.append(("DELETE", self.path, {}))
        self._reply(200, {})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def kubernetes_api():
    FakeKubernetes.requests, FakeKubernetes.outcome = [], "Complete"
    with loopback_server(FakeKubernetes) as url:
        yield url


def _settings(tmp_path: Path, **trainer) -> Path:
    params = micro_params(tmp_path)
    raw = yaml.safe_load(params.read_text())
    raw["orchestration"]["trainer"].update(enabled=True, mount_path=str(tmp_path / "shared"), poll_seconds=0.01, **trainer)
    params.write_text(yaml.safe_dump(raw))
    FakeKubernetes.shared = tmp_path / "shared"
    return params


def test_rendered_trainjob_runs_torchrun_on_every_node_with_gpus_and_secret_refs(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak-5e1")
    orch = resolve.load(REPO / "params.yaml").orchestration
    name = job_name("8f14e45f-ceea-467e-a8b6-0c7e2c1a9e61", "rl")
    spec = render(name, "registry.local/posttrain:1", ["torchrun", "--no-python", "posttrain", "rl"], orch, {"POSTTRAIN_PIPELINE_RUN": "run-1"})
    assert name == "pt-rl-8f14e45f-ceea-467e-a8b6-0c7e2c1a9e61" and len(job_name("x" * 80, "eval@rl")) <= 63
    assert spec["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and spec["kind"] == "TrainJob"
    assert spec["spec"]["runtimeRef"] == {"name": "torch-distributed", "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"}
    trainer = spec["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 1 and trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert trainer["command"][:3] == ["torchrun", "--no-python", "posttrain"] and trainer["image"] == "registry.local/posttrain:1"
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in trainer["env"] if "valueFrom" in e}
    assert secrets["AWS_SECRET_ACCESS_KEY"] == {"name": "posttrain-credentials", "key": "AWS_SECRET_ACCESS_KEY"}
    assert "do-not-leak-5e1" not in json.dumps(spec)
    (override,) = spec["spec"]["podSpecOverrides"]
    assert override["volumes"][0]["persistentVolumeClaim"]["claimName"] == "posttrain-shared"
    assert override["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _launch(tmp_path: Path, params: Path, host: str):
    data = tmp_path / "artifacts" / "data"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text("{}\n")
    out, spec_out = tmp_path / "artifacts" / "out", tmp_path / "artifacts" / "spec" / "trainjob.yaml"
    message = launch("sft", params, {"data": data}, out, spec_out, "img:1", "run-42", "sft", resume=False, host=host)
    return message, out, spec_out


def test_launcher_submits_waits_for_completion_and_returns_the_output(kubernetes_api, tmp_path):
    params = _settings(tmp_path)
    message, out, spec_out = _launch(tmp_path, params, kubernetes_api)
    assert message == "TrainJob pt-sft-run-42 complete: job complete"
    assert json.loads((out / "metrics.json").read_text()) == {"sft_loss": 1.0}
    (method, path, body), *polls = FakeKubernetes.requests
    assert (method, path) == ("POST", JOBS) and body == yaml.safe_load(spec_out.read_text())  # the saved spec is what was sent
    assert [p[:2] for p in polls] == [("GET", f"{JOBS}/pt-sft-run-42")] * 3
    command = body["spec"]["trainer"]["command"]
    shared = tmp_path / "shared" / "pt-sft-run-42"
    assert command[3:5] == ["sft", "--params"] and f"data={shared / 'inputs' / 'data'}" in command
    assert (shared / "inputs" / "data" / "train.jsonl").is_file() and (shared / "params.yaml").is_file()


def test_a_failed_trainjob_fails_the_launcher_and_a_late_one_is_deleted(kubernetes_api, tmp_path):
    params = _settings(tmp_path)
    FakeKubernetes.outcome = "Failed"
    with pytest.raises(UserError, match="TrainJob pt-sft-run-42 failed: job failed"):
        _launch(tmp_path, params, kubernetes_api)
    FakeKubernetes.requests, FakeKubernetes.outcome = [], ""
    (tmp_path / "late").mkdir()
    params = _settings(tmp_path / "late", deadline_seconds=1)
    with pytest.raises(UserError, match="past its deadline of 1 s: deleted"):
        _launch(tmp_path / "late", params, kubernetes_api)
    assert FakeKubernetes.requests[-1][:2] == ("DELETE", f"{JOBS}/pt-sft-run-42")


def test_the_trainer_option_turns_training_tasks_into_launchers_in_the_compiled_pipeline(tmp_path):
    from kfp import compiler
    from test_kfp_pipeline import command_name, compiled, container_tasks

    from pipelines.build import build_pipeline
    from posttrain.orchestration.graph import load_pipelines

    cfg = resolve.load(REPO / "params.yaml")
    trainer = cfg.orchestration.trainer.model_copy(update={"enabled": True})
    cfg = cfg.model_copy(update={"orchestration": cfg.orchestration.model_copy(update={"trainer": trainer})})
    compiler.Compiler().compile(build_pipeline(load_pipelines(REPO)["text"], cfg), str(tmp_path / "text.yaml"))
    spec, platform = compiled(tmp_path / "text.yaml")
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    launchers = {}
    for _name, (task, container) in container_tasks(spec).items():
        label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        if command_name(container) == "trainjob":
            stage = container["args"][container["args"].index("--stage") + 1]
            launchers[stage] = container
            assert "accelerator" not in container.get("resources", {})  # the GPUs belong to the TrainJob's nodes
            assert executors[label]["pvcMount"][0]["constant"] == "posttrain-shared" and executors[label]["pvcMount"][0]["mountPath"] == "/mnt/posttrain"
            assert "trainjob" in spec["components"][task["componentRef"]["name"]]["outputDefinitions"]["artifacts"]
            assert "{{$.inputs.parameters['image']}}" in container["args"]  # the nodes run the pipeline's image
        elif command_name(container) == "eval":
            assert container["resources"]["accelerator"]["type"] == "nvidia.com/gpu"
    assert set(launchers) == {"sft", "rl", "distill"}
