"""Airflow as a person runs it: the api-server, scheduler and dag-processor on loopback, DAG runs triggered through
the REST API the UI's Trigger button uses, with a micro `conf` of Params. (These replace `airflow dags test`.)

One server set runs the text, sweep and image DAGs' runs together, with one retry 1 s after a failure: a text run
whose rl task is kill -9'd after its first checkpoint (its retry resumes there), a sweep of two arms, the image
pipeline, a failing stage and an unknown conf key, all logging to the session's shared MLflow server (PostgreSQL, S3:
tracking_server.py); a browser fills the text DAG's trigger form meanwhile. The rlhf DAG (minutes) runs on its own servers, marked heavy.
Each DAG's wall time goes to outputs/test-artifacts/airflow_wall_times.json."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from pathlib import Path

import pytest
from airflow_servers import _password, airflow_servers, kill_at_checkpoint
from browser import airflow_login, chromium, mlflow_compare, trigger_from_form
from orch_helpers import TINY
from tracking_server import TrackingServer, compare_pipeline_run

from helpers import MICRO_IMAGE, deterministic

pytestmark = pytest.mark.slow
RUN_TIMEOUT = 900  # seconds: a micro text run takes about 90 s alone on 2 cores
RETRY = {"POSTTRAIN_AIRFLOW_RETRIES": "1", "POSTTRAIN_AIRFLOW_RETRY_DELAY": "1s"}  # a killed task's retry, at once
IMAGE = {f"{section}.{key}": value for section, values in MICRO_IMAGE.items() for key, value in values.items()}
# name -> (DAG, the conf's own keys); digits 1: too few sums. The rl task of `text` is killed once (a run more
# would cost the suite a minute): the sweep's grpo arm, the same rl on the same conf, is the uninterrupted run
RUNS = {
    "unknown_key": ("posttrain_text", {"rl.stepz": 5}), "failing_stage": ("posttrain_text", {"task.digits": 1}),
    "sweep": ("posttrain_sweep", {"objectives": ["grpo", "rloo"]}), "image": ("posttrain_image", IMAGE), "text": ("posttrain_text", {}),
}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, tracking_server_starting):
    home = tmp_path_factory.mktemp("airflow")
    with airflow_servers(home, ("posttrain_text", "posttrain_sweep", "posttrain_image"), **RETRY, **tracking_server_starting.env) as api:
        tracking_server_starting.wait()  # it started meanwhile
        yield api


@pytest.fixture(scope="module")
def triggered(airflow, tracking_server, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """The runs of the tests below, triggered together (two tasks at a time run): name -> (its folder, its run id).
    A thread watches the `text` run and kill -9s its rl task once it has written its first checkpoint."""
    found = {}
    for name, (dag_id, extra) in RUNS.items():
        work = tmp_path_factory.mktemp(name)
        status, run = airflow.trigger(dag_id, _conf(work, tracking_server, **extra))
        assert status == 200, (name, run)
        found[name] = (work, run["dag_run_id"])
    out = airflow.home / "runs" / found["text"][1] / "outputs" / "rl"
    watcher = threading.Thread(target=_kill_once, args=(out,), daemon=True)
    watcher.start()
    return found


KILLS: dict[str, object] = {}  # what the watcher killed, or how it failed


def _kill_once(out: Path) -> None:
    try:
        KILLS["pids"] = kill_at_checkpoint(out, step=1, timeout=RUN_TIMEOUT)
    except BaseException as e:  # noqa: BLE001  (reported by the test that waits for it)
        KILLS["error"] = e


def _conf(work: Path, server: TrackingServer | None = None, **extra) -> dict:
    """A micro run's conf, logging to the shared tracking `server` (else to a sqlite file in `work`)."""
    conf = {f"{section}.{key}": value for section, values in TINY.items() for key, value in values.items()}
    conf.update(dict(o.split("=", 1) for o in server.overrides) if server else
                {"tracking.uri": f"sqlite:///{work / 'mlflow.db'}", "tracking.artifact_root": str(work / "mlartifacts")})
    conf.update({"model.hidden_size": 32, "model.intermediate_size": 64, "model.layers": 1}, **extra)
    return conf


def _runs(work: Path, pipeline_run: str, server: TrackingServer | None = None, experiment: str = "posttrain"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.url if server else f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(experiment)
    return client.search_runs([experiment.experiment_id], f"tags.pipeline_run = '{pipeline_run}'") if experiment else []


def test_an_invalid_param_is_refused_at_trigger_time_with_its_name(airflow, tmp_path):
    status, answer = airflow.trigger("posttrain_text", _conf(tmp_path, **{"rl.steps": "many"}))
    assert status == 400 and "rl.steps" in json.dumps(answer), (status, answer)
    status, answer = airflow.trigger("posttrain_sweep", {"objectives": ["rloo", "rloo"]})  # an arm twice
    assert status == 400 and "objectives" in json.dumps(answer), (status, answer)


@pytest.fixture(scope="module")
def browser():
    with chromium() as context:
        yield context


@pytest.fixture(scope="module")
def text_params(airflow) -> dict[str, dict]:
    """posttrain_text's Params as Airflow holds them (asked before the runs are triggered: a busy api-server is slow)."""
    _, details = airflow.request("GET", "/api/v2/dags/posttrain_text/details")
    return details["params"]


def test_the_trigger_form_in_a_browser_starts_a_run_with_the_changed_value(airflow, text_params, triggered, browser):
    """Chromium, logged into the UI as admin, opens posttrain_text's trigger form (while the runs above run): the
    Params are grouped in one section per params.yaml section the DAG reads, rl.advantage is a drop-down of the
    advantage registry's names, and the run triggered with rloo picked there starts with it and the form's defaults
    for every other key. (It is a full-size run: stopped once it has started.)"""
    from posttrain.resolve import all_registries

    params = {name: p["value"] for name, p in text_params.items()}
    page = airflow_login(browser, airflow.url, _password(airflow.home), "/dags/posttrain_text")
    form = trigger_from_form(page, "rl.advantage", "rloo")
    assert sorted(form.sections) == sorted({*(p["schema"]["section"] for p in text_params.values()), "Advanced Options"})
    assert form.labels == sorted(name for name in params if name.startswith("rl.")), form.labels
    # the registry's names, and the choice that leaves the key at its default (the form requires no field)
    default = f"default: {json.dumps(params['rl.advantage'])}"
    assert sorted(form.options) == sorted([*all_registries()["advantages"].names(), default]) and params["rl.advantage"] != "rloo"
    assert form.required == [], form.required
    assert form.status == 200, form.run
    run_id = form.run["dag_run_id"]
    _, run = airflow.request("GET", f"/api/v2/dags/posttrain_text/dagRuns/{run_id}")
    assert run["conf"] == {**params, "rl.advantage": "rloo"} and run["triggered_by"] == "ui"
    deadline = time.time() + 120
    while run["state"] == "queued" and time.time() < deadline:
        time.sleep(1)
        _, run = airflow.request("GET", f"/api/v2/dags/posttrain_text/dagRuns/{run_id}")
    assert run["state"] != "queued", "the run did not start"
    stopped, _ = airflow.request("PATCH", f"/api/v2/dags/posttrain_text/dagRuns/{run_id}", {"state": "failed"})
    assert stopped == 200


def test_an_unknown_conf_key_fails_preflight_by_name_before_any_stage(airflow, triggered, tracking_server):
    work, run_id = triggered["unknown_key"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "failed"
    states = airflow.task_states("posttrain_text", run_id)
    assert states["preflight"] == "failed" and states["data"] == "upstream_failed", states
    assert "unknown key 'rl.stepz' (did you mean 'rl.steps'?)" in airflow.task_log("posttrain_text", run_id, "preflight")
    assert _runs(work, run_id, tracking_server) == []  # nothing started


def test_a_failing_stage_ends_the_run_failed_with_its_mlflow_run_failed(airflow, triggered, tracking_server):
    work, run_id = triggered["failing_stage"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "failed"
    tasks = airflow.task_instances("posttrain_text", run_id)
    states = {name: t["state"] for name, t in tasks.items()}
    # finalize ran (it marks the runs) and failed on purpose: the DAG run does not take the teardown's success
    assert states["data"] == "failed" and states["sft"] == "upstream_failed" and states["finalize"] == "failed", states
    assert tasks["data"]["try_number"] == 2 and tasks["finalize"]["try_number"] == 1  # data's one retry failed too
    runs = _runs(work, run_id, tracking_server)  # one per attempt (data does not resume)
    assert runs == []  # each attempt stopped on bad data before any work: it leaves no (empty) MLflow run


def test_a_text_run_triggered_like_the_ui_runs_every_task_and_logs_to_mlflow(airflow, triggered, tracking_server, monkeypatch):
    """...to the shared tracking server: its runs are rows of its PostgreSQL store, their artifacts objects of its S3
    bucket, and `posttrain compare` of this pipeline run reads them back from it."""
    tmp_path, run_id = triggered["text"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "success", airflow.task_states("posttrain_text", run_id)
    assert set(airflow.task_states("posttrain_text", run_id).values()) == {"success"}
    runs = _runs(tmp_path, run_id, tracking_server)  # every stage's run carries the Airflow run id
    assert sorted(r.data.tags["stage"] for r in runs) == ["data", "distill", "eval", "eval", "rl", "sft"]
    assert {r.info.status for r in runs} == {"FINISHED"} and {r.data.tags["launcher"] for r in runs} == {"airflow"}
    names = sorted(r.data.tags["mlflow.runName"] for r in runs)
    assert names == ["data", "distill grpo+clip seed 0", "eval rl grpo", "eval sft", "rl grpo+clip seed 0", "sft"], names
    assert {r.data.tags["stage"] for r in runs if "objective" in r.data.tags} == {"rl", "distill", "eval"}  # eval of rl: inherited
    airflow.record_wall_time("text", "posttrain_text", run_id, f"its rl kill -9'd once and retried; {len(RUNS)} runs triggered together, 2 task slots")
    metrics = json.loads((airflow.home / "runs" / run_id / "outputs/eval/rl/metrics.json").read_text())
    assert 0.0 <= metrics["greedy_accuracy"] <= 1.0 and metrics["n_prompts"] == TINY["eval"]["n_prompts"]
    # the final models are MLflow models in the Model Registry, tagged with the pipeline run, and load by name
    import mlflow.pyfunc
    from mlflow.tracking import MlflowClient

    uri = tracking_server.url
    client = MlflowClient(uri)
    (version,) = client.search_model_versions(f"name = 'posttrain-rl' and tags.pipeline_run = '{run_id}'")  # the server's other runs register too
    rl_run = next(r for r in runs if r.data.tags["stage"] == "rl")
    assert version.run_id == rl_run.info.run_id and version.tags["pipeline_run"] == run_id and version.tags["arm"] == "grpo"
    for key, value in {**tracking_server.env, "MLFLOW_TRACKING_URI": uri}.items():  # set_tracking_uri exports the URI: restored after
        monkeypatch.setenv(key, value)
    mlflow.set_tracking_uri(uri)
    (completion,) = mlflow.pyfunc.load_model("models:/posttrain-rl/latest").predict(["12+7="], params={"max_new_tokens": 4})
    assert isinstance(completion, str)
    sft_run = next(r for r in runs if r.data.tags["stage"] == "sft")
    logged = [a.path for a in client.list_artifacts(sft_run.info.run_id, "model")]
    assert "model/MLmodel" in logged and len(logged) == len(set(logged))
    # the shared server's stores: PostgreSQL holds the runs, the bucket the artifacts (the registered model's files too)
    import boto3
    import psycopg2

    with contextlib.closing(psycopg2.connect(tracking_server.database.replace("+psycopg2", ""))) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT run_uuid, status FROM runs WHERE run_uuid = ANY(%s)", ([r.info.run_id for r in runs],))
        assert sorted(cursor.fetchall()) == sorted((r.info.run_id, "FINISHED") for r in runs)
    bucket, prefix = rl_run.info.artifact_uri.removeprefix("s3://").split("/", 1)
    listed = boto3.client("s3", endpoint_url=tracking_server.s3_endpoint).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/model/")
    assert f"{prefix}/model/MLmodel" in {o["Key"] for o in listed.get("Contents", [])}
    (row,) = compare_pipeline_run(tracking_server, airflow.home / "runs" / run_id / "params.yaml", run_id, tmp_path / "compare", monkeypatch)
    assert (row["arm"], row["rl_run_id"]) == ("grpo", rl_run.info.run_id) and row["heldout_accuracy"] == metrics["greedy_accuracy"]


def test_the_mlflow_ui_of_the_shared_server_compares_the_runs_of_the_text_run(airflow, triggered, tracking_server, browser):
    from mlflow.tracking import MlflowClient

    work, run_id = triggered["text"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "success"
    runs = _runs(work, run_id, tracking_server)
    experiment = MlflowClient(tracking_server.url).get_experiment_by_name("posttrain")
    mlflow_compare(browser, tracking_server.url, experiment.experiment_id, sorted(r.info.run_id for r in runs))


def _digests(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*.safetensors"))}


def test_a_task_killed_mid_run_is_retried_resumes_from_its_checkpoint_and_ends_as_if_never_killed(airflow, triggered, tracking_server):
    work, run_id = triggered["text"]
    assert airflow.wait("posttrain_text", run_id, RUN_TIMEOUT) == "success", airflow.task_states("posttrain_text", run_id)
    assert "error" not in KILLS, KILLS.get("error")
    assert KILLS["pids"], "the watcher killed nothing"
    tasks = airflow.task_instances("posttrain_text", run_id)
    assert {t["state"] for t in tasks.values()} == {"success"} and tasks["rl"]["try_number"] == 2, tasks["rl"]
    first, retry = (airflow.task_log("posttrain_text", run_id, "rl", n) for n in (1, 2))
    assert "posttrain: resumed" not in first and "posttrain: resumed rl at step 1 from " in retry, retry[-3000:]
    # the same rl metrics, history and weights as the uninterrupted rl of the same conf: the sweep's grpo arm
    assert airflow.wait("posttrain_sweep", triggered["sweep"][1], RUN_TIMEOUT) == "success"
    killed = airflow.home / "runs" / run_id / "outputs" / "rl"
    straight = airflow.home / "runs" / triggered["sweep"][1] / "objectives" / "grpo" / "outputs" / "rl"
    for name in ("metrics.json", "history.json"):
        assert deterministic(json.loads((killed / name).read_text())) == deterministic(json.loads((straight / name).read_text())), name
    assert _digests(killed) and _digests(killed) == _digests(straight)
    # the retry reopened the killed attempt's MLflow run and ended it (the text test's `posttrain compare` of this
    # pipeline run adds a compare run of its own)
    runs = [r for r in _runs(work, run_id, tracking_server) if r.data.tags["stage"] != "compare"]
    assert sorted(r.data.tags["stage"] for r in runs) == ["data", "distill", "eval", "eval", "rl", "sft"]
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_a_sweep_of_two_objectives_runs_both_arms_and_compares_them_alone(airflow, triggered, tracking_server):
    work, run_id = triggered["sweep"]
    assert airflow.wait("posttrain_sweep", run_id, RUN_TIMEOUT) == "success", airflow.task_states("posttrain_sweep", run_id)
    states = airflow.task_states("posttrain_sweep", run_id)
    assert set(states.values()) == {"success"} and {"objective[0]", "objective[1]", "compare"} <= set(states), states
    airflow.record_wall_time("sweep", "posttrain_sweep", run_id, f"objectives grpo, rloo; {len(RUNS)} runs triggered together, 2 task slots")
    runs = _runs(work, run_id, tracking_server)
    assert {r.info.status for r in runs} == {"FINISHED"} and {r.data.tags["launcher"] for r in runs} == {"airflow"}
    rl = {r.data.tags["arm"]: r for r in runs if r.data.tags["stage"] == "rl"}
    assert {arm: r.data.tags["mlflow.runName"] for arm, r in rl.items()} == {"grpo": "rl grpo+clip seed 0", "rloo": "rl rloo+clip seed 0"}
    assert {arm: r.data.tags["objective"] for arm, r in rl.items()} == {"grpo": "grpo+clip", "rloo": "rloo+clip"}
    rows = json.loads((airflow.home / "runs" / run_id / "compare" / "comparison.json").read_text())
    assert [(r["arm"], r["rl_run_id"]) for r in rows] == [(arm, rl[arm].info.run_id) for arm in ("grpo", "rloo")]  # its two arms only
    arms = airflow.home / "runs" / run_id / "objectives"
    assert _digests(arms / "grpo/outputs/rl") != _digests(arms / "rloo/outputs/rl")  # two updates, not one twice


def test_the_image_pipeline_triggered_like_the_ui_writes_its_outputs_and_logs_to_mlflow(airflow, triggered, tracking_server):
    work, run_id = triggered["image"]
    assert airflow.wait("posttrain_image", run_id, RUN_TIMEOUT) == "success", airflow.task_states("posttrain_image", run_id)
    assert set(airflow.task_states("posttrain_image", run_id).values()) == {"success"}
    airflow.record_wall_time("image", "posttrain_image", run_id, f"{len(RUNS)} runs triggered together, 2 task slots")
    runs = _runs(work, run_id, tracking_server, "posttrain-images")  # the pipeline's own experiment (its pipeline.name)
    assert sorted(r.data.tags["stage"] for r in runs) == ["city", "curate", "flow_eval", "flow_rl", "flow_sft"]
    assert {r.info.status for r in runs} == {"FINISHED"} and {r.data.tags["launcher"] for r in runs} == {"airflow"}
    out = airflow.home / "runs" / run_id / "outputs" / "images"
    assert (out / "flow_sft/model/unet/config.json").is_file() and (out / "flow_eval/samples.png").is_file()
    assert len(json.loads((out / "flow_rl/history.json").read_text())) == MICRO_IMAGE["flow_rl"]["steps"]
    ev = json.loads((out / "flow_eval/metrics.json").read_text())
    assert all(0 <= ev[f"{model}_overall"] <= 1 for model in ("sft", "rl")), ev
    flow_eval = next(r for r in runs if r.data.tags["stage"] == "flow_eval")
    assert flow_eval.data.metrics["rl_overall"] == pytest.approx(ev["rl_overall"])


@pytest.mark.heavy
def test_the_rlhf_pipeline_triggered_like_the_ui_runs_every_task_and_logs_to_mlflow(tmp_path):
    """posttrain_rlhf (data and sft, then the reward-model, preference, knowledge-editing and CARE chains) on its own
    servers: about 8 minutes of tasks at the tiny config's sizes, so `make test-heavy`, not `make test`."""
    # No retries: its first tasks (knowledge, care, data) start together, on the SQLite MLflow store and the
    # experiment that preflight made before them (they used to race on creating both)
    with airflow_servers(tmp_path / "airflow", ("posttrain_rlhf",)) as airflow:
        status, run = airflow.trigger("posttrain_rlhf", _conf(tmp_path))
        assert status == 200, run
        run_id = run["dag_run_id"]
        assert airflow.wait("posttrain_rlhf", run_id, 2400) == "success", airflow.task_states("posttrain_rlhf", run_id)
        states = airflow.task_states("posttrain_rlhf", run_id)
        assert set(states.values()) == {"success"} and {"knowledge", "edit", "care", "reward_model", "rl_rm", "preference"} <= set(states)
        airflow.record_wall_time("rlhf", "posttrain_rlhf", run_id, "alone on its servers, 2 task slots, no retries")
        runs = _runs(tmp_path, run_id)
        stages = sorted(r.data.tags["stage"] for r in runs)
        assert stages == ["care", "data", "edit", "eval", "eval", "knowledge", "preference", "reward_model", "rl_rm", "sft"], stages
        assert {r.info.status for r in runs} == {"FINISHED"} and {r.data.tags["launcher"] for r in runs} == {"airflow"}
        for task in ("reward_model", "rl_rm", "preference"):
            assert (airflow.home / "runs" / run_id / "outputs" / task / "metrics.json").is_file(), task


@pytest.mark.heavy
def test_a_recipe_pipeline_triggered_like_the_ui_runs_on_its_own_params_file(tmp_path):
    """posttrain_dsp, the DSP recipe's pipeline (recipes/dsp/dvc.yaml), on its own servers with a micro dsp section in
    the conf: preflight reads recipes/dsp/params.yaml, both stages run and log to MLflow under Airflow."""
    from recipes.dsp.test_dsp_stage import micro_dsp

    with airflow_servers(tmp_path / "airflow", ("posttrain_dsp",)) as airflow:
        conf = _conf(tmp_path, **{f"dsp.{key}": value for key, value in micro_dsp().items()})
        status, run = airflow.trigger("posttrain_dsp", conf)
        assert status == 200, run
        run_id = run["dag_run_id"]
        assert airflow.wait("posttrain_dsp", run_id, RUN_TIMEOUT) == "success", airflow.task_states("posttrain_dsp", run_id)
        assert set(airflow.task_states("posttrain_dsp", run_id).values()) == {"success"}
        runs = _runs(tmp_path, run_id)
        assert sorted(r.data.tags["stage"] for r in runs) == ["dsp", "maze_data"]
        assert {r.info.status for r in runs} == {"FINISHED"} and {r.data.tags["launcher"] for r in runs} == {"airflow"}
        results = json.loads((airflow.home / "runs" / run_id / "outputs" / "dsp" / "results.json").read_text())
        assert {row["arm"] for row in results} >= {"flat_bc"}, results

