"""The compiled Kubeflow pipelines: structure, settings, and a local execution of the YAML that matches `dvc repro`."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from orch_helpers import dvc, tiny_params, tool_env
from kfp_local import LocalPipeline, kill_group
from tracking_server import compare_pipeline_run

from helpers import REPO, WALL_CLOCK, copy_repro_run, posttrain_main, ran_stages
from posttrain.orchestration.graph import load_tasks
from posttrain.orchestration.submit import run_arguments
from posttrain.stages import stages

COMPILED = REPO / "pipelines" / "compiled"
TEXT = COMPILED / "text.yaml"


def compiled(path: Path = TEXT) -> tuple[dict, dict]:
    docs = list(yaml.safe_load_all(path.read_text()))
    return docs[0], docs[1]


def container_tasks(spec: dict) -> dict[str, tuple[dict, dict]]:
    """Every task that runs a container, in any DAG: name -> (task, container)."""
    found = {}
    for dag in [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]:
        for name, task in dag["tasks"].items():
            component = spec["components"][task["componentRef"]["name"]]
            if "container" in spec["deploymentSpec"]["executors"].get(component.get("executorLabel"), {}):  # not importers
                found[name] = (task, spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"])
    return found


def command_name(container: dict) -> str:
    """`posttrain <name>`: the stage or command a container runs."""
    if container["command"][:2] == ["sh", "-c"]:
        assert "exec posttrain" in container["command"][2]
        return container["args"][2]
    assert container["command"] == ["posttrain"]
    return container["args"][0]


def test_pipelines_check_names_each_stale_file_and_fails(monkeypatch, tmp_path, capsys):
    import pipelines.__main__ as entry

    fresh, stale = tmp_path / "fresh.yaml", tmp_path / "stale.yaml"
    fresh.write_text("a: 1\n")
    stale.write_text("a: 1\n")
    monkeypatch.setattr(entry, "REPO", tmp_path)
    monkeypatch.setattr(entry, "generate", lambda: {fresh: "a: 1\n", stale: "a: 2\n", tmp_path / "new.yaml": "b: 1\n"})
    assert entry.main(["--check"]) == 1
    assert capsys.readouterr().out.splitlines() == ["out of date: stale.yaml (run `make pipelines`)", "out of date: new.yaml (run `make pipelines`)"]
    assert stale.read_text() == "a: 1\n"  # --check writes nothing
    assert entry.main([]) == 0 and stale.read_text() == "a: 2\n"


def test_every_task_runs_a_cli_stage_in_the_image_parameter():
    from posttrain.cli import _register_stage_commands, app

    _register_stage_commands()
    commands = {c.name for c in app.registered_commands}
    for path in (TEXT, COMPILED / "sweep.yaml"):
        spec, _ = compiled(path)
        assert "image" in spec["root"]["inputDefinitions"]["parameters"]
        for name, (_task, container) in container_tasks(spec).items():
            assert command_name(container) in commands, name
            assert container["image"] == "{{$.inputs.parameters['pipelinechannel--image']}}", name
    names = {command_name(c) for _, c in container_tasks(compiled()[0]).values()}
    assert {t.stage for t in load_tasks(REPO / "dvc.yaml") if t.pipeline == "text"} | {"preflight", "finalize"} == names


def preflight_stages(container: dict) -> list[str]:
    args = container["args"]
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--stage"]


def test_a_pipelines_preflight_checks_the_sections_its_stages_read_and_no_other(monkeypatch, capsys, tmp_path):
    """A bad value in the dsp recipe's section stops the dsp pipeline's preflight with one line naming the key, and
    not the text pipeline's, whose stages read no dsp settings (each preflight run with the `--stage` arguments its
    compiled pipeline passes); a misspelt key there is refused by name all the same."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {REPO / 'params.yaml'}\ndsp: {{steps: -1}}\n")
    store = [f"--set=tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"--set=tracking.artifact_root={tmp_path / 'art'}"]

    def preflight(pipeline: str, *values: str) -> tuple[int, str, str]:
        container = next(c for _, c in container_tasks(compiled(COMPILED / f"{pipeline}.yaml")[0]).values() if command_name(c) == "preflight")
        stages = [arg for stage in preflight_stages(container) for arg in ("--stage", stage)]
        assert stages, pipeline
        return posttrain_main(monkeypatch, capsys, "preflight", f"--params={bad}", *store, *stages, *values, f"--write-config={tmp_path / pipeline}.yaml")

    code, out, err = preflight("text")
    assert code == 0 and "preflight ok" in out, err
    assert "dsp" not in yaml.safe_load((tmp_path / "text.yaml").read_text())  # the stages' settings file holds what they read
    code, _, err = preflight("dsp")
    assert code == 2 and err.strip() == "posttrain: error: dsp.steps: Input should be greater than 0 (got -1)", err
    code, _, err = preflight("text", "--values-json", '{"dsp.stepz": 3}')
    assert code == 2 and "unknown key 'dsp.stepz'" in err and len(err.strip().splitlines()) == 1, err


def test_image_and_rlhf_pipelines_run_their_stages_with_their_overrides():
    from posttrain.orchestration.graph import load_pipelines

    for name, pipeline in load_pipelines(REPO).items():
        spec, platform = compiled(COMPILED / f"{name}.yaml")
        executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        tasks = container_tasks(spec)
        assert {command_name(c) for _, c in tasks.values()} == {t.stage for t in pipeline.tasks} | {"preflight", "finalize"}, name
        for task_name_, (task, container) in tasks.items():
            stage = command_name(container)
            args = container["args"]
            overrides = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
            # the pipeline's own settings reach the settings resolver and the exit task, and no stage repeats them
            assert overrides == (list(pipeline.overrides) if stage in ("preflight", "finalize") else []), (name, task_name_)
            if stage in ("preflight", "finalize"):  # they check the sections these stages read, and no other
                assert preflight_stages(container) == sorted({t.stage for t in pipeline.tasks}), (name, task_name_)
            label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
            wants_gpu = stage in stages and stages.entry(stage).meta.get("gpu", True)
            assert ("accelerator" in container.get("resources", {})) == wants_gpu, (name, task_name_)
            assert executors[label]["secretAsEnv"][0]["secretName"] == "posttrain-credentials"
    image = {command_name(c): c for _, c in container_tasks(compiled(COMPILED / "image.yaml")[0]).values()}
    assert "pipeline.name=posttrain-images" in image["preflight"]["args"] and "accelerator" not in image["curate"].get("resources", {})


def test_a_recipe_pipeline_takes_its_section_and_no_other_pipeline_does():
    """recipes/dsp/dvc.yaml compiles to its own pipeline, whose parameters are the core sections and `dsp` (defaults
    from recipes/dsp/params.yaml); the core pipelines have no `dsp` parameter, so adding a recipe changes none of them."""
    def parameters(name):
        spec = next(yaml.safe_load_all((REPO / "pipelines" / "compiled" / f"{name}.yaml").read_text()))
        return spec["root"]["inputDefinitions"]["parameters"]

    dsp = parameters("dsp")
    assert "dsp" in dsp and {"pipeline", "model", "rl"} <= set(dsp) and dsp["dsp"]["defaultValue"]["steps"] == 3000
    assert not any("dsp" in parameters(name) for name in ("text", "image", "rlhf", "sweep"))
    rfpo = parameters("rfpo")  # recipes/rfpo/dvc.yaml: the core data and sft, then the recipe's critic, rl under its preset, eval
    assert "critic" in rfpo and {"pipeline", "task", "model", "sft", "rl", "eval"} <= set(rfpo) and rfpo["critic"]["defaultValue"]["steps"] == 600
    assert not any("critic" in parameters(name) for name in ("text", "image", "rlhf", "sweep", "dsp"))


def test_gpu_retries_caching_secrets_and_exit_handler_are_in_the_yaml():
    spec, platform = compiled()
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    by_label = {c["executorLabel"]: n for n, c in spec["components"].items() if "executorLabel" in c}
    for name, (task, container) in container_tasks(spec).items():
        label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        stage = command_name(container)
        wants_gpu = stage in stages and stages.entry(stage).meta.get("gpu", True)
        accelerator = container.get("resources", {}).get("accelerator", {})
        assert (accelerator.get("type") == "nvidia.com/gpu") == wants_gpu, name
        assert bool(executors[label].get("tolerations")) == wants_gpu, name
        assert task["retryPolicy"]["maxRetryCount"] == 2 and task["retryPolicy"]["backoffDuration"] == "60s", name
        cached = task.get("cachingOptions", {}).get("enableCache", False)
        assert cached == (stage in stages and stages.entry(stage).meta.get("deterministic", True)), name
        if cached:  # the cache key covers the resolved config and the image: both are inputs of the task
            assert {"config", "pipelinechannel--image"} <= set(task["inputs"]["parameters"]), name
        secret = executors[label]["secretAsEnv"][0]
        assert secret["secretName"] == "posttrain-credentials" and {e["envVar"] for e in secret["keyToEnv"]} >= {"AWS_SECRET_ACCESS_KEY"}
        assert by_label[label]
    root_tasks = spec["root"]["dag"]["tasks"]
    exit_task = root_tasks["posttrain-finalize"]
    assert exit_task["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert exit_task["inputs"]["parameters"]["status"] == {"taskFinalStatus": {"producerTask": "exit-handler-1"}}


def test_the_committed_compiled_files_are_up_to_date_and_hold_no_credential(monkeypatch, tmp_path):
    secret = "do-not-leak-8f2d1c"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.setenv(key, secret)
    from pipelines.__main__ import generate

    texts = generate()
    assert all(secret not in text for text in texts.values())
    stale = [str(path.relative_to(REPO)) for path, text in texts.items() if not path.is_file() or path.read_text() != text]
    assert not stale, f"out of date (run `make pipelines`): {stale}"  # what `python -m pipelines --check` checks; the
    # environment's credentials change nothing


def test_sweep_pipeline_loops_over_objectives_with_bounded_parallelism():
    spec, _ = compiled(COMPILED / "sweep.yaml")
    dags = {n: c["dag"]["tasks"] for n, c in spec["components"].items() if "dag" in c}
    loops = {n: t for tasks in dags.values() for n, t in tasks.items() if "parameterIterator" in t}
    (loop,) = loops.values()  # one ParallelFor, over the `objectives` parameter, two arms at a time
    assert loop["parameterIterator"]["items"] == {"inputParameter": "pipelinechannel--objectives"}
    assert loop["iteratorPolicy"]["parallelismLimit"] == 2
    assert spec["root"]["inputDefinitions"]["parameters"]["objectives"]["defaultValue"] == ["grpo", "rloo", "dr_grpo"]
    # inside the loop: the arm's own preflight, then the stages below rl; outside: the shared stages and compare
    arm_tasks = dags[loop["componentRef"]["name"]]
    executors = spec["deploymentSpec"]["executors"]

    def args_of(tasks: dict, name: str) -> list[str]:
        return executors[spec["components"][tasks[name]["componentRef"]["name"]]["executorLabel"]]["container"]["args"]

    stage_names = {t["taskInfo"]["name"] for t in arm_tasks.values()}
    assert stage_names == {"posttrain-preflight-objective", "rl", "eval@rl", "distill"}, stage_names
    arm_check = args_of(arm_tasks, "posttrain-preflight-objective")
    # the arm is applied whole (a preset's every rl key), not as rl.advantage alone
    assert arm_check[arm_check.index("--sweep-arm") + 1] == "{{$.inputs.parameters['objective']}}" and "rl.advantage" not in json.dumps(arm_check)
    assert arm_tasks["posttrain-preflight-objective"]["inputs"]["parameters"]["objective"] == {"componentInputParameter": "pipelinechannel--objectives-loop-item"}
    outer = dags["comp-exit-handler-1"]
    sweep_check = args_of(outer, "posttrain-preflight-sweep")  # the list of arms is checked (known, none twice) first
    assert sweep_check[sweep_check.index("--sweep-arms") + 1] == "{{$.inputs.parameters['objectives']}}"
    assert set(loop["dependentTasks"]) == {"posttrain-data", "posttrain-sft"}
    assert "for-loop-2" in outer["posttrain-compare"]["dependentTasks"] and "posttrain-compare" not in arm_tasks


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _local_pipeline(work: Path, overrides: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[LocalPipeline, dict]:
    params = tiny_params(work)
    arguments = run_arguments(params, list(overrides), TEXT, image="")
    return LocalPipeline.load(TEXT, work / "kfp", tool_env(**(env or {}))), arguments


def _mlflow_runs(work: Path, uri: str | None = None, **filters: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri or f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("posttrain")
    query = " and ".join(f"tags.{k} = '{v}'" for k, v in filters.items())
    return client.search_runs([experiment.experiment_id], query)


@pytest.mark.slow
def test_local_execution_of_the_compiled_yaml_matches_dvc_repro(dvc_repro_run, tracking_server, tmp_path, monkeypatch):
    """The tasks log to the shared tracking server (PostgreSQL, S3 artifacts), as the Airflow text run does, and
    `posttrain compare` of this pipeline run reads its rl run back from there."""
    pipeline, arguments = _local_pipeline(tmp_path, tracking_server.overrides, tracking_server.env)
    states = pipeline.run(arguments)
    failed = [r for r in pipeline.runs if r.returncode]
    assert not failed, failed[0].stderr[-3000:]
    assert set(states.values()) == {"SUCCEEDED"}, states
    for task in load_tasks(REPO / "dvc.yaml"):
        kfp_out = pipeline.task_dir(f"exit-handler-1/{task_name(task.id)}") / "artifacts" / "out"
        dvc_out = dvc_repro_run / task.out
        assert json.loads((kfp_out / "metrics.json").read_text()) == json.loads((dvc_out / "metrics.json").read_text()), task.id
        weights = sorted(dvc_out.glob("model/*.safetensors"))
        assert [_digest(kfp_out / "model" / w.name) for w in weights] == [_digest(w) for w in weights], task.id
    assert sorted(dvc_repro_run.glob("outputs/*/model/*.safetensors"))  # there were weights to compare
    runs = _mlflow_runs(tmp_path, tracking_server.url, pipeline_run="local-job")
    assert sorted(r.data.tags["stage"] for r in runs) == ["data", "distill", "eval", "eval", "rl", "sft"]
    assert {r.info.status for r in runs} == {"FINISHED"} and {r.data.tags["launcher"] for r in runs} == {"kubeflow"}
    assert all(r.info.artifact_uri.startswith(tracking_server.artifact_root + "/") for r in runs)  # in the bucket
    (row,) = compare_pipeline_run(tracking_server, tmp_path / "params.yaml", "local-job", tmp_path / "compare", monkeypatch)
    assert (row["arm"], row["rl_run_id"]) == ("grpo", next(r.info.run_id for r in runs if r.data.tags["stage"] == "rl"))


def task_name(task_id: str, package: Path = TEXT) -> str:
    """The compiled task name of a dvc task (the pipeline names tasks posttrain-<stage>[-N])."""
    spec, _ = compiled(package)
    inner = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    return next(n for n, t in inner.items() if t["taskInfo"]["name"] == task_id)


@pytest.mark.slow
def test_a_killed_step_runs_the_exit_task_which_marks_its_mlflow_run_failed(tmp_path):
    def kill_once_running(process):
        deadline = time.time() + 300
        while time.time() < deadline and not _running_sft(tmp_path):
            time.sleep(0.2)
        assert process.poll() is None, "sft ended before it could be killed"
        kill_group(process)  # an evicted pod: no chance to mark its own run

    # sft long enough to be caught while it trains (it is killed as soon as its run shows RUNNING)
    pipeline, arguments = _local_pipeline(tmp_path, ("sft.steps=3000",))
    pipeline.faults[task_name("sft")] = kill_once_running
    states = pipeline.run(arguments)
    assert states["exit-handler-1"] == "FAILED" and states[f"exit-handler-1/{task_name('sft')}"] == "FAILED"
    assert states[f"exit-handler-1/{task_name('rl')}"] == "SKIPPED" and states["posttrain-finalize"] == "SUCCEEDED"
    (sft,) = _mlflow_runs(tmp_path, stage="sft")
    assert sft.info.status == "FAILED" and sft.data.tags["failure"].startswith("pipeline FAILED")
    (data,) = _mlflow_runs(tmp_path, stage="data")
    assert data.info.status == "FINISHED"


def _running_sft(work: Path) -> bool:
    try:
        return any(r.info.status == "RUNNING" for r in _mlflow_runs(work, stage="sft"))
    except Exception:  # the store is created by the first stage; until then there is nothing to find
        return False


def test_an_imported_model_replaces_its_task_and_reaches_consumers_as_a_uri(tmp_path):
    from kfp import compiler

    from pipelines.build import build_pipeline
    from posttrain import resolve
    from posttrain.orchestration.graph import load_pipelines

    cfg = resolve.load(REPO / "params.yaml")
    uri = "s3://models/sft-2026-11"
    cfg = cfg.model_copy(update={"orchestration": cfg.orchestration.model_copy(update={"imports": {"sft": uri}})})
    compiler.Compiler().compile(build_pipeline(load_pipelines(REPO)["text"], cfg), str(tmp_path / "text.yaml"))
    spec, _ = compiled(tmp_path / "text.yaml")
    inner = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert "sft" not in {command_name(c) for _, c in container_tasks(spec).values()}
    (importer,) = [t for t in inner.values() if t["componentRef"]["name"].startswith("comp-importer")]
    executor = spec["components"][importer["componentRef"]["name"]]["executorLabel"]
    assert spec["deploymentSpec"]["executors"][executor]["importer"]["artifactUri"]["constant"] == uri
    assert importer["taskInfo"]["name"] == "sft (imported)"
    rl = next(c for _, c in container_tasks(spec).values() if command_name(c) == "rl")
    inputs = [json.loads(rl["args"][i + 1])["Concat"] for i, a in enumerate(rl["args"][:-1]) if a == "--in"]
    # the imported model by its URI (read by the stage), the data made in this run by its local path
    assert ["policy=", "{{$.inputs.artifacts['policy'].uri}}"] in inputs and ["data=", "{{$.inputs.artifacts['data'].path}}"] in inputs


SWEEP = COMPILED / "sweep.yaml"


@pytest.mark.slow
def test_local_execution_of_the_sweep_yaml_runs_each_arm_and_compares_them(dvc_repro_run, tmp_path):
    """sweep.yaml's ParallelFor, two arms at a time: the shared stages once, then each arm's preflight, rl, eval and
    distill, then compare over this pipeline run's arms only. The grpo arm equals `dvc repro` of the same config."""
    params = tiny_params(tmp_path)
    arguments = run_arguments(params, ["orchestration.sweep.objectives=[grpo, rloo]"], SWEEP, image="")
    assert arguments["objectives"] == ["grpo", "rloo"]  # `posttrain submit` of the sweep passes its arms
    pipeline = LocalPipeline.load(SWEEP, tmp_path / "kfp", tool_env())
    states = pipeline.run(arguments)
    failed = [r for r in pipeline.runs if r.returncode]
    assert not failed, failed[0].stderr[-3000:]
    assert set(states.values()) == {"SUCCEEDED"}, states
    loop = "exit-handler-1/for-loop-2"
    assert {n for n in states if n.startswith(loop + "/")} == {f"{loop}/{i}/{t}" for i in (0, 1) for t in ("posttrain-preflight-objective", "posttrain-rl", "posttrain-eval-2", "posttrain-distill")}
    grpo_rl = pipeline.task_dir(f"{loop}/0/posttrain-rl") / "artifacts" / "out"
    assert json.loads((grpo_rl / "metrics.json").read_text()) == json.loads((dvc_repro_run / "outputs/rl/metrics.json").read_text())
    weights = sorted((dvc_repro_run / "outputs/rl/model").glob("*.safetensors"))
    assert weights and [_digest(grpo_rl / "model" / w.name) for w in weights] == [_digest(w) for w in weights]
    rloo_rl = pipeline.task_dir(f"{loop}/1/posttrain-rl") / "artifacts" / "out"
    assert [_digest(rloo_rl / "model" / w.name) for w in weights] != [_digest(w) for w in weights]  # the other arm's update
    compare = pipeline.task_dir("exit-handler-1/posttrain-compare") / "artifacts" / "out"
    rows = json.loads((compare / "comparison.json").read_text())
    assert [(r["arm"], r["objective"]) for r in rows] == [("grpo", "grpo+clip"), ("rloo", "rloo+clip")]
    runs = _mlflow_runs(tmp_path, pipeline_run="local-job", stage="rl")
    assert sorted(r.data.tags["arm"] for r in runs) == ["grpo", "rloo"] and {r.info.status for r in runs} == {"FINISHED"}


RLHF = COMPILED / "rlhf.yaml"


@pytest.mark.heavy
def test_local_execution_of_the_rlhf_yaml_matches_dvc_repro(dvc_repro_run, tmp_path):
    """rlhf.yaml (data and sft, then the reward-model, preference, knowledge-editing and CARE chains) run locally
    gives every task the metrics and weights `dvc repro recipes/rlhf/dvc.yaml` gives it on the same config. About 8
    minutes on 2 cores (the chains' extra models train at the tiny config's sizes): `make test-heavy`."""
    repo = copy_repro_run(dvc_repro_run, tmp_path / "repo")
    shutil.copytree(REPO / "recipes" / "rlhf", repo / "recipes" / "rlhf")  # its dvc.yaml and params.yaml
    rlhf_tasks = load_tasks(REPO / "recipes" / "rlhf" / "dvc.yaml", REPO, (REPO / "dvc.yaml",), "rlhf")
    ran = ran_stages(dvc("repro", "recipes/rlhf/dvc.yaml", cwd=repo))
    assert ran == {f"recipes/rlhf/dvc.yaml:{t.id}" for t in rlhf_tasks if t.id not in ("data", "sft")}, ran  # data, sft: the fixture's
    params = tiny_params(tmp_path)
    pipeline = LocalPipeline.load(RLHF, tmp_path / "kfp", tool_env())
    states = pipeline.run(run_arguments(params, [], RLHF, image=""))
    failed = [r for r in pipeline.runs if r.returncode]
    assert not failed, failed[0].stderr[-3000:]
    assert set(states.values()) == {"SUCCEEDED"}, states
    weighed = 0
    for task in rlhf_tasks:
        kfp_out = pipeline.task_dir(f"exit-handler-1/{task_name(task.id, RLHF)}") / "artifacts" / "out"
        dvc_out = repo / task.out
        ours, theirs = (json.loads((d / "metrics.json").read_text()) for d in (kfp_out, dvc_out))
        assert {k: v for k, v in ours.items() if k not in WALL_CLOCK} == {k: v for k, v in theirs.items() if k not in WALL_CLOCK}, task.id
        weights = sorted(p.relative_to(dvc_out) for p in dvc_out.glob("model/**/*.safetensors"))
        assert [_digest(kfp_out / w) for w in weights] == [_digest(dvc_out / w) for w in weights], task.id
        weighed += len(weights)
    assert weighed >= 4  # sft, reward_model, rl_rm, preference at least
