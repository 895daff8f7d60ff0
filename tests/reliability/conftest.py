"""Shared pieces of the reliability tests: a stand-in stage (`execute` runs it in this process, in milliseconds), one
MLflow store and one loopback S3 server per session (a new SQLite store spends seconds creating its tables; each
test has its own experiment), a tiny dataset, and the process environment restored after each test (`connect` moves
credentials into it, and bounds boto3's default session)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers import micro_params, moto_server


class S3(NamedTuple):
    endpoint: str
    server: subprocess.Popen  # frozen with SIGSTOP by the tests
    bucket: str


@pytest.fixture(autouse=True)
def _restore_process_state():
    import boto3

    environ, session = dict(os.environ), boto3.DEFAULT_SESSION
    yield
    os.environ.clear()
    os.environ.update(environ)
    boto3.DEFAULT_SESSION = session


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="session")
def s3() -> S3:
    """A moto server with one bucket."""
    with moto_server("posttrain-reliability") as (endpoint, server):
        yield S3(endpoint, server, "posttrain-reliability")


@pytest.fixture
def stand_in_stage(tmp_path: Path, monkeypatch, mlflow_store: Path, request):
    """`stand_in_stage(run, tracking=True, resumable=False, **sections)` registers `run` as stage "probe" for this test
    and returns a micro config tracking into the session's store, in an experiment named after the test."""
    from posttrain import resolve
    from posttrain.registry import Entry
    from posttrain.stages import stages

    def make(run, tracking: bool = True, resumable: bool = False, **sections):
        # the registry has no unregister: the entry is put in its table for this test only
        monkeypatch.setitem(stages._entries, "probe", Entry("probe", run, {"inputs": {}, "resumable": resumable}))
        params = micro_params(tmp_path, **sections)
        overrides = [f"tracking.enabled={str(tracking).lower()}", f"tracking.uri=sqlite:///{mlflow_store / 'mlflow.db'}",
                     f"tracking.artifact_root={mlflow_store / 'mlartifacts'}", f"pipeline.name={request.node.name}"]
        return resolve.load(params, overrides)

    return make


@pytest.fixture
def sft_workdir(tmp_path: Path) -> Path:
    """A working directory for `posttrain sft`: micro params (3 steps) and `outputs/data` with the train split,
    written directly (the data stage's validation suite costs seconds)."""
    from posttrain import resolve
    from posttrain.data import write_examples
    from posttrain.tasks import build_task

    cfg = resolve.load(micro_params(tmp_path, sft={"steps": 3, "batch_size": 8, "log_every": 1}))
    data = tmp_path / "outputs" / "data"
    data.mkdir(parents=True)
    write_examples(data / "train.jsonl", build_task(cfg.task).splits(cfg.pipeline.seed)["train"])
    return tmp_path
