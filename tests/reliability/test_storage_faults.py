"""Storage faults: a dead or frozen tracking server stops a stage before training, in seconds; an artifact store that
freezes after training keeps the trained output (one line, exit 3, `posttrain relog` sends the rest); an S3 input
that breaks mid-download is one line and leaves no partial cache."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from helpers import POSTTRAIN, free_port


@pytest.fixture
def frozen_endpoint():
    """A port that accepts connections (the kernel completes them) but never answers: a frozen server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("server", ["dead", "frozen"])
def test_an_unreachable_tracking_server_stops_the_stage_before_training_in_seconds(sft_workdir, monkeypatch, server, request):
    from posttrain import resolve, stages
    from posttrain.errors import UserError

    uri = f"http://127.0.0.1:{free_port()}" if server == "dead" else request.getfixturevalue("frozen_endpoint")
    monkeypatch.setenv("POSTTRAIN_STORAGE_TIMEOUT", "2")
    cfg = resolve.load(sft_workdir / "params.yaml", [f"tracking.uri={uri}"])
    out = sft_workdir / "outputs" / "sft"
    start = time.monotonic()
    with pytest.raises(UserError) as stopped:
        stages.execute("sft", cfg, {"data": sft_workdir / "outputs" / "data"}, out)
    assert time.monotonic() - start < 10
    message = str(stopped.value)
    assert "\n" not in message and "nothing was run" in message and f"MLflow at {uri} is not reachable" in message
    assert sorted(p.name for p in out.parent.iterdir()) == ["data"]  # no output, no staging, no lock


@pytest.mark.slow
def test_a_frozen_artifact_store_keeps_the_trained_output_and_relog_sends_it(sft_workdir, s3, mlflow_store, monkeypatch):
    """The S3 server is frozen (SIGSTOP) once the run has started: training finishes, uploading the model times out."""
    from mlflow.tracking import MlflowClient

    from posttrain import resolve, stages
    from posttrain.models import load_pretrained
    from posttrain.tracking import connect, relog

    endpoint, server, bucket = s3
    for name, value in {"MLFLOW_S3_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL": endpoint, "POSTTRAIN_STORAGE_TIMEOUT": "1",
                        "AWS_MAX_ATTEMPTS": "2"}.items():
        monkeypatch.setenv(name, value)
    # the session's store (its tables exist already) and an S3 artifact root
    settings = ["--set", f"tracking.uri=sqlite:///{mlflow_store / 'mlflow.db'}", "--set", f"tracking.artifact_root=s3://{bucket}/frozen"]
    out, staging = sft_workdir / "outputs" / "sft", sft_workdir / "outputs" / ".sft.partial"
    proc = subprocess.Popen([POSTTRAIN, "sft", *settings], cwd=sft_workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (staging / "mlflow_run_id").is_file() and proc.poll() is None:
            time.sleep(0.02)
        os.killpg(server.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
        assert time.monotonic() - frozen_at < 60
    finally:
        os.killpg(server.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr
    (line,) = stderr.strip().splitlines()
    assert "Traceback" not in stderr and "log_artifacts model failed" in line and "posttrain relog --out outputs/sft" in line
    assert "stays RUNNING until" in line and "finishes the run" in line  # issue 38 item 6: the line says relog ends it
    assert stdout == ""

    # the trained model is in place and is what the next stage reads
    assert not staging.exists() and (out / "metrics.json").is_file() and (out / "mlflow_pending" / "pending.json").is_file()
    stages.check_inputs("rl", {"data": sft_workdir / "outputs" / "data", "policy": out})
    load_pretrained(out / "model")

    cfg = resolve.load(sft_workdir / "params.yaml", settings[1::2])
    monkeypatch.chdir(sft_workdir)
    run_id = relog(cfg, out)
    assert not (out / "mlflow_pending").exists()
    client = MlflowClient(connect(cfg)[0])
    assert client.get_run(run_id).info.status == "FINISHED" and json.loads((out / "mlflow_run.json").read_text())["run_id"] == run_id
    assert {a.path for a in client.list_artifacts(run_id, "model")} >= {"model/config.json", "model/model.safetensors"}


def test_an_s3_input_that_breaks_mid_download_is_one_line_and_leaves_no_partial_cache(tmp_path, s3, monkeypatch):
    import boto3

    from posttrain import storage
    from posttrain.errors import UserError

    endpoint, server, bucket = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("POSTTRAIN_STORAGE_TIMEOUT", "1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    client = boto3.client("s3", endpoint_url=endpoint)
    for name in ("a.json", "b.json", "c.json"):
        client.put_object(Bucket=bucket, Key=f"inputs/model/{name}", Body=name.encode())
    uri, cache = f"s3://{bucket}/inputs/model", tmp_path / "cache"

    class FreezesAfterOneFile:
        """The real client; the server freezes once the first object has been written."""

        def __init__(self, client):
            self.client, self.downloads = client, 0

        def __getattr__(self, name):
            return getattr(self.client, name)

        def download_file(self, *args, **kwargs):
            self.downloads += 1
            if self.downloads == 2:
                os.killpg(server.pid, signal.SIGSTOP)
            return self.client.download_file(*args, **kwargs)

    real_client = storage.s3_client
    monkeypatch.setattr(storage, "s3_client", lambda: FreezesAfterOneFile(real_client()))
    try:
        with pytest.raises(UserError) as broken:
            storage.fetch_s3(uri, cache)
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    assert "\n" not in str(broken.value) and str(broken.value).startswith(f"cannot fetch {uri}")
    assert list(cache.iterdir()) == []
    monkeypatch.setattr(storage, "s3_client", real_client)
    assert (storage.fetch_s3(uri, cache) / "c.json").read_text() == "c.json"

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # a dead endpoint: one line too
    with pytest.raises(UserError, match=f"^cannot list {uri}/other: "):
        storage.fetch_s3(f"{uri}/other", cache)


class FakeMlflow:
    """The slice of the `mlflow` module the Tracker calls; each call fails while `down`, else is recorded."""

    def __init__(self, down: bool):
        self.down, self.calls = down, []
        self.entities = type("entities", (), {"Metric": staticmethod(lambda key, value, timestamp, step: (key, value, step))})

    def _call(self, name, *args):
        if self.down:
            raise ConnectionError("http://user:pw@store:5000 is down\n(details)")
        self.calls.append((name, *args))

    def MlflowClient(self):  # noqa: N802  (mlflow's name)
        return type("client", (), {"log_batch": lambda _, run_id, metrics: self._call("log_batch", metrics)})()

    def log_artifacts(self, local_dir, artifact_path):
        self._call("log_artifacts", artifact_path)

    def log_artifact(self, local_path, artifact_path):
        self._call("log_artifact", Path(local_path).read_bytes(), artifact_path)

    def log_table(self, columns, artifact_file):
        self._call("log_table", columns, artifact_file)

    def log_figure(self, figure, artifact_file):
        self._call("log_figure", artifact_file)

    def set_tags(self, tags):
        self._call("set_tags", tags)

    def end_run(self, status):
        self.calls.append(("end_run", status))


def test_every_call_after_a_failure_is_kept_and_replayed_in_order(tmp_path):
    """The first failing call stops sending (one line, no credential); tables, figures, artifacts, tags and metric
    points are kept in the output and `relog`'s replay sends them all."""
    from posttrain.tracking import Tracker

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"w")
    figure = type("figure", (), {"savefig": lambda self, path: Path(path).write_bytes(b"png")})()
    broken = FakeMlflow(down=True)
    tracker = Tracker(broken, "run-1", {"loss": 2}, root=tmp_path)
    tracker.log_metrics({"loss": 1.0}, step=2)  # at or below the last logged step: dropped
    tracker.log_metrics({"loss": 0.5}, step=3)
    tracker.log_artifacts(tmp_path / "model", "model")
    tracker.log_table([{"prompt": "1+1=", "reward": 1.0}], "samples.json")
    tracker.log_figure(figure, "plots/curve.png")
    tracker.set_tags(objective="grpo")
    tracker.close("FINISHED")
    assert tracker.failure == "log_artifacts model failed (http://store:5000 is down)"
    assert broken.calls == [("end_run", "FAILED")]

    record = json.loads((tmp_path / "mlflow_pending" / "pending.json").read_text())
    assert record["run_id"] == "run-1" and record["failure"] == tracker.failure
    working = FakeMlflow(down=False)
    replay = Tracker(working, "run-1", {}, root=tmp_path)
    for item in record["items"]:
        replay.replay(item)
    replay.close("FINISHED")
    assert replay.failure is None and working.calls == [
        ("log_artifact", b"w", "model"),
        ("log_table", {"prompt": ["1+1="], "reward": [1.0]}, "samples.json"),
        ("log_artifact", b"png", "plots"),
        ("set_tags", {"objective": "grpo"}),
        ("log_batch", [("loss", 0.5, 3)]),
        ("end_run", "FINISHED"),
    ]
