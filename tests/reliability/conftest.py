"""Shared pieces of the reliability tests: a stand-in stage (`execute` runs it in this process, in milliseconds), one
MLflow store and one loopback S3 server per session (a new SQLite store spends seconds creating its tables; each
test has its own experiment), a tiny dataset, the process environment restored after each test (`connect` moves
credentials into it, and bounds boto3's default session), and the upstream outputs of the stages the resume and
divergence tests train, built once per session in this process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers import MICRO_EDIT, MICRO_IMAGE, built_once, fork_safe_params, micro_params, moto_server, posttrain_here


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


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A stage run here sets torch's thread count (pipeline.threads); the tests after it get theirs back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def knowledge_outputs(tmp_path_factory) -> Path:
    """outputs/knowledge on MICRO_EDIT (the edit stage's base model)."""
    def build(root: Path) -> None:
        fork_safe_params(root, edit=MICRO_EDIT)
        posttrain_here("knowledge", cwd=root)

    return built_once(tmp_path_factory, "reliability_knowledge", build) / "outputs"


@pytest.fixture(scope="session")
def image_outputs(tmp_path_factory) -> Path:
    """outputs/city, curate and flow_sft on MICRO_IMAGE (flow_sft's data, flow_rl's data and policy)."""
    def build(root: Path) -> None:
        fork_safe_params(root, **MICRO_IMAGE)
        posttrain_here("city", cwd=root)
        posttrain_here("curate", "--in", "source=outputs/city", cwd=root)
        posttrain_here("flow_sft", "--in", "data=outputs/curate", cwd=root)

    return built_once(tmp_path_factory, "reliability_images", build) / "outputs"


@pytest.fixture(scope="session")
def gold_pairs(pipeline_outputs, tmp_path_factory) -> Path:
    """A pair file with human labels on two thirds of the pairs (ABC-Align's labelled subset), from the task data."""
    rows = [json.loads(line) for line in (pipeline_outputs / "outputs" / "data" / "train.jsonl").read_text().splitlines()][:40]
    path = tmp_path_factory.mktemp("gold_pairs") / "pairs.jsonl"
    labels = [True, False, None]
    off_by_one = [r["completion"][:-1] + str((int(r["completion"][-1]) + 1) % 10) for r in rows]
    path.write_text("".join(
        json.dumps({"prompt": r["prompt"], "chosen": r["completion"], "rejected": wrong, "severity": 0.5, "gold": labels[i % 3]}) + "\n"
        for i, (r, wrong) in enumerate(zip(rows, off_by_one))))
    return path
