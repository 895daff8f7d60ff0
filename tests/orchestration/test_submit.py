"""`posttrain submit` against a loopback stand-in for the Kubeflow Pipelines v2beta1 API: what reaches the cluster."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest
from orch_helpers import loopback_server

from helpers import REPO, posttrain


class FakeKubeflow(BaseHTTPRequestHandler):
    """Answers the four calls kfp.Client makes to start a run, and records the request bodies."""

    posted: list[tuple[str, dict]] = []

    def _reply(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.endswith("/healthz"):
            return self._reply({"commit_sha": "test", "tag_name": "2.5.0", "multi_user": False})
        return self._reply({"experiments": [], "total_size": 0})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.posted.append((self.path, body))
        if self.path.endswith("/experiments"):
            return self._reply({"experiment_id": "exp-1", "display_name": body.get("display_name")})
        return self._reply({"run_id": "run-1", "experiment_id": "exp-1", "display_name": body.get("display_name")})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def kubeflow_host():
    FakeKubeflow.posted = []
    with loopback_server(FakeKubeflow) as url:
        yield url


def test_submit_sends_the_compiled_pipeline_with_validated_parameters(kubeflow_host, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak-31b7")
    result = posttrain("submit", "--host", kubeflow_host, "--set", "rl.advantage=gdpo", "--image", "registry.local/posttrain:1", cwd=REPO)
    assert "submitted run run-1" in result.stdout
    (path, run), = [(p, b) for p, b in FakeKubeflow.posted if p.endswith("/runs")]
    parameters = run["runtime_config"]["parameters"]
    assert parameters["rl"]["advantage"] == "gdpo" and parameters["image"] == "registry.local/posttrain:1"
    spec, platform = run["pipeline_spec"]["pipeline_spec"], run["pipeline_spec"]["platform_spec"]
    assert spec["pipelineInfo"]["name"] == "posttrain-text" and run["experiment_id"] == "exp-1"
    assert "secretAsEnv" in json.dumps(platform)  # the Kubernetes settings travel with the run
    assert "do-not-leak-31b7" not in json.dumps(FakeKubeflow.posted)


def test_submit_refuses_a_bad_value_before_contacting_the_cluster(kubeflow_host):
    result = posttrain("submit", "--host", kubeflow_host, "--set", "rl.advantage=gdpx", cwd=REPO, check=False)
    assert result.returncode == 2 and "rl.advantage" in result.stderr and FakeKubeflow.posted == []


def test_the_sweep_pipeline_gets_its_arms_from_orchestration_sweep():
    from posttrain.orchestration.submit import run_arguments

    package = REPO / "pipelines" / "compiled" / "sweep.yaml"
    arguments = run_arguments(REPO / "params.yaml", ["orchestration.sweep.objectives=[rloo, grpo]"], package, image="")
    assert arguments["objectives"] == ["rloo", "grpo"] and "rl" in arguments
