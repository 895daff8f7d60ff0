"""S3 round trips against a loopback moto server: MLflow artifacts, the DVC remote, and preflight's checks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from orch_helpers import BIN, dvc

from helpers import micro_params, posttrain


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    port = _free_port()
    server = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="posttrain-test")
        yield endpoint
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_mlflow_artifacts_go_to_s3_and_preflight_checks_the_bucket(s3_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    params = micro_params(tmp_path)
    params.write_text(params.read_text().replace(f"artifact_root: {tmp_path / 'mlartifacts'}", "artifact_root: s3://posttrain-test/mlartifacts"))
    assert "preflight ok" in posttrain("preflight", cwd=tmp_path).stdout
    posttrain("data", cwd=tmp_path)

    import boto3

    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket="posttrain-test")["Contents"]]
    assert any(k.startswith("mlartifacts/") and k.endswith("data/train.jsonl") for k in keys), keys

    missing = posttrain("preflight", "--set", "tracking.artifact_root=s3://no-such-bucket/x", cwd=tmp_path, check=False)
    assert missing.returncode == 2 and "s3://no-such-bucket" in missing.stderr
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    anonymous = posttrain("preflight", cwd=tmp_path, check=False)
    assert anonymous.returncode == 2 and "no AWS credentials" in anonymous.stderr


def test_dvc_remote_on_s3_pushes_and_pulls(s3_endpoint, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    dvc("init", "--no-scm", "-q", cwd=repo)
    dvc("remote", "add", "-d", "storage", "s3://posttrain-test/dvc", cwd=repo)
    dvc("remote", "modify", "storage", "endpointurl", s3_endpoint, cwd=repo)
    data = repo / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "completion": "2"}\n')
    dvc("add", "train.jsonl", cwd=repo)
    dvc("push", cwd=repo)
    data.unlink()
    subprocess.run(["rm", "-rf", str(repo / ".dvc" / "cache")], check=True)
    dvc("pull", cwd=repo)
    assert data.read_text() == '{"prompt": "1+1=", "completion": "2"}\n'
    assert "AWS_SECRET_ACCESS_KEY" not in (repo / ".dvc" / "config").read_text() and "testing" not in (repo / ".dvc" / "config").read_text()
