"""Airflow as a person runs it: the api-server, scheduler and dag-processor on loopback, DAG runs triggered through
the REST API the UI's Trigger button uses, with a micro `conf` of Params. (These replace `airflow dags test`.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_servers import airflow_servers
from orch_helpers import TINY

pytestmark = pytest.mark.slow
RUN_TIMEOUT = 900  # seconds: a micro text run takes about 90 s alone on 2 cores


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    with airflow_servers(home, ("posttrain_text", "posttrain_sweep")) as api:
        yield api


@pytest.fixture(scope="module")
def triggered(airflow, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """The runs of the tests below, triggered together (two tasks at a time run): name -> (its folder, its run id)."""
    settings = {"unknown_key": {"rl.stepz": 5}, "failing_stage": {"task.digits": 1}, "text": {}}  # digits 1: too few sums
    found = {}
    for name, extra in settings.items():
        work = tmp_path_factory.mktemp(name)
        status, run = airflow.trigger("posttrain_text", _conf(work, **extra))
        assert status == 200, (name, run)
        found[name] = (work, run["dag_run_id"])
    return found


def _conf(work: Path, **extra) -> dict:
    conf = {f"{section}.{key}": value for section, values in TINY.items() for key, value in values.items()}
    conf.update({"tracking.uri": f"sqlite:///{work / 'mlflow.db'}", "tracking.artifact_root": str(work / "mlartifacts")})
    conf.update({"model.hidden_size": 32, "model.intermediate_size": 64, "model.layers": 1}, **extra)
    return conf


def _runs(work: Path, pipeline_run: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("posttrain")
    return client.search_runs([experiment.experiment_id], f"tags.pipeline_run = '{pipeline_run}'") if experiment else []


def test_an_invalid_param_is_refused_at_trigger_time_with_its_name(airflow, tmp_path):
    status, answer = airflow.trigger("posttrain_text", _conf(tmp_path, **{"rl.steps": "many"}))
    assert status == 400 and "rl.steps" in json.dumps(answer), (status, answer)
    status, answer = airflow.trigger("posttrain_sweep", {"objectives": ["rloo", "rloo"]})  # an arm twice
    assert status == 400 and "objectives" in json.dumps(answer), (status, answer)


def test_an_unknown_conf_key_fails_preflight_by_name_before_any_stage(airflow, triggered):
    work, run_id = triggered["unknown_key"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "failed"
    states = airflow.task_states("posttrain_text", run_id)
    assert states["preflight"] == "failed" and states["data"] == "upstream_failed", states
    assert "unknown key 'rl.stepz' (did you mean 'rl.steps'?)" in airflow.task_log("posttrain_text", run_id, "preflight")
    assert _runs(work, run_id) == []  # nothing started


def test_a_failing_stage_ends_the_run_failed_with_its_mlflow_run_failed(airflow, triggered):
    work, run_id = triggered["failing_stage"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "failed"
    states = airflow.task_states("posttrain_text", run_id)
    # finalize ran (it marks the runs) and failed on purpose: the DAG run does not take the teardown's success
    assert states["data"] == "failed" and states["sft"] == "upstream_failed" and states["finalize"] == "failed", states
    (data,) = _runs(work, run_id)
    assert data.data.tags["stage"] == "data" and data.info.status == "FAILED"


def test_a_text_run_triggered_like_the_ui_runs_every_task_and_logs_to_mlflow(airflow, triggered):
    tmp_path, run_id = triggered["text"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "success", airflow.task_states("posttrain_text", run_id)
    assert set(airflow.task_states("posttrain_text", run_id).values()) == {"success"}
    runs = _runs(tmp_path, run_id)  # every stage's run carries the Airflow run id
    assert sorted(r.data.tags["stage"] for r in runs) == ["data", "distill", "eval", "eval", "rl", "sft"]
    assert {r.info.status for r in runs} == {"FINISHED"} and {r.data.tags["launcher"] for r in runs} == {"airflow"}
    names = sorted(r.data.tags["mlflow.runName"] for r in runs)
    assert names == ["data", "distill grpo+clip seed 0", "eval rl grpo", "eval sft", "rl grpo+clip seed 0", "sft"], names
    assert {r.data.tags["stage"] for r in runs if "objective" in r.data.tags} == {"rl", "distill", "eval"}  # eval of rl: inherited
    metrics = json.loads((airflow.home / "runs" / run_id / "outputs/eval/rl/metrics.json").read_text())
    assert 0.0 <= metrics["greedy_accuracy"] <= 1.0 and metrics["n_prompts"] == TINY["eval"]["n_prompts"]
    # the final models are MLflow models in the Model Registry, tagged with the pipeline run, and load by name
    import mlflow.pyfunc
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    (version,) = client.search_model_versions("name = 'posttrain-rl'")
    rl_run = next(r for r in runs if r.data.tags["stage"] == "rl")
    assert version.run_id == rl_run.info.run_id and version.tags["pipeline_run"] == run_id and version.tags["arm"] == "grpo"
    mlflow.set_tracking_uri(uri)
    (completion,) = mlflow.pyfunc.load_model("models:/posttrain-rl/latest").predict(["12+7="], params={"max_new_tokens": 4})
    assert isinstance(completion, str)
    sft_run = next(r for r in runs if r.data.tags["stage"] == "sft")
    logged = [a.path for a in client.list_artifacts(sft_run.info.run_id, "model")]
    assert "model/MLmodel" in logged and len(logged) == len(set(logged))
