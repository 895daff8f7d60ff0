"""The task graph read from dvc.yaml, the generated Param schema, and the settings preflight resolves."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from helpers import repo_params, REPO
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.orchestration.graph import check_overrides, load_pipelines, load_tasks, pipeline_files
from posttrain.orchestration.preflight import config_text, resolve_config
from posttrain.orchestration.schema import param_specs, pipeline_spec, render


def test_tasks_follow_dvc_yaml_in_topological_order():
    tasks = load_tasks(REPO / "dvc.yaml")
    order = [t.id for t in tasks]
    for task in tasks:
        assert all(order.index(u) < order.index(task.id) for u in task.after), task.id
    by_id = {t.id: t for t in tasks}
    assert by_id["eval@rl"].inputs == {"data": "data", "model": "rl"} and by_id["eval@sft"].inputs["model"] == "sft"
    assert by_id["rl"].resume and by_id["sft"].resume and not by_id["eval@sft"].resume  # every training stage resumes
    assert not by_id["data"].gpu and by_id["sft"].gpu
    assert [t.id for t in load_pipelines(REPO)["text"].tasks] == order


def test_image_and_rlhf_pipelines_come_from_their_own_dvc_files():
    found = load_pipelines(REPO)
    image = found["image"]
    assert [t.id for t in image.tasks] == ["city", "curate", "flow_sft", "flow_rl", "flow_eval"]
    assert image.overrides == ("pipeline.name=posttrain-images", "pipeline.threads=1")  # ${run} filled from vars
    assert all(t.extra_args == () for t in image.tasks)  # shared by every task: moved to the pipeline
    by_id = {t.id: t for t in image.tasks}
    assert by_id["flow_eval"].inputs == {"data": "curate", "sft": "flow_sft", "rl": "flow_rl"}
    assert by_id["flow_rl"].out == "outputs/images/flow_rl" and not by_id["curate"].gpu and by_id["flow_sft"].gpu
    rlhf = {t.id: t for t in found["rlhf"].tasks}  # wdir: ../.. and the root file's data and sft, as dvc repro does
    assert set(rlhf) == {"data", "sft", "reward_model", "rl_rm", "preference", "eval@rl_rm", "eval@preference", "knowledge", "edit", "care"}
    assert rlhf["rl_rm"].inputs == {"data": "data", "policy": "sft", "reward_model": "reward_model"}
    assert rlhf["sft"].pipeline == "text" and rlhf["rl_rm"].pipeline == "rlhf"
    for pipeline in found.values():
        check_overrides(pipeline, REPO / "params.yaml")


def test_every_recipe_runs_under_every_launcher():
    """Each recipes/<name>/dvc.yaml is a Kubeflow pipeline (pipelines/compiled/) and an Airflow DAG (the spec the DAG
    file reads), every one of its stages a task of them, on the params file its dvc.yaml command reads. recipes/search
    reads two files (ASCT recipes/search/params.yaml, BRIDGE bridge.yaml: another task and model), so it is two
    pipelines, `search` and `search_bridge`, each on one file, as `dvc repro recipes/search/dvc.yaml` runs them."""
    spec = json.loads((REPO / "dags" / "posttrain_pipelines.json").read_text())
    found = load_pipelines(REPO)
    for dvc_yaml in sorted((REPO / "recipes").glob("*/dvc.yaml")):
        recipe = dvc_yaml.parent.name
        upstream = tuple(REPO / path for name, path in pipeline_files(REPO).items() if name != recipe)
        stages = {t.id: t for t in load_tasks(dvc_yaml, REPO, upstream, recipe) if t.pipeline == recipe}
        mine = {name: p for name, p in found.items() if name == recipe or name.startswith(f"{recipe}_")}
        ran = {t.id: name for name, p in mine.items() for t in p.tasks if t.pipeline == recipe}
        assert set(ran) == set(stages), recipe
        for task_id, name in ran.items():
            assert (REPO / "pipelines" / "compiled" / f"{name}.yaml").is_file(), name
            assert [t["id"] for t in spec["pipelines"][name]] == [t.id for t in mine[name].tasks], name
            assert spec["params_files"][name] == mine[name].params == stages[task_id].params, (name, task_id)
    assert {name: [t.id for t in found[name].tasks] for name in ("search", "search_bridge")} == {"search": ["asct"], "search_bridge": ["bridge"]}
    assert spec["defaults"]["search_bridge"]["task.n_train"] == 12 and spec["defaults"]["search"]["task.n_train"] == 1000


def test_a_dvc_yaml_reading_two_params_files_is_one_pipeline_per_file(tmp_path, monkeypatch):
    """Independent stages on two files: two pipelines; a stage downstream of one that reads another file: refused
    (the launchers resolve one params file per run)."""
    from posttrain.orchestration import graph

    monkeypatch.setattr(graph, "PIPELINE_FILES", {"sub": "sub/dvc.yaml"})
    (tmp_path / "sub").mkdir()
    stages = {"data": {"cmd": "posttrain data --params params.yaml --out outputs/data"},
              "data_b": {"cmd": "posttrain data --params b.yaml --out outputs/data_b"}}
    (tmp_path / "sub" / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    found = load_pipelines(tmp_path)
    assert {name: ([t.id for t in p.tasks], p.params) for name, p in found.items()} == {
        "sub": (["data"], "sub/params.yaml"), "sub_b": (["data_b"], "sub/b.yaml")}
    stages["sft"] = {"cmd": "posttrain sft --params b.yaml --in data=outputs/data --out outputs/sft"}
    (tmp_path / "sub" / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    with pytest.raises(UserError, match="stage 'data' reads sub/params.yaml but a stage downstream of it reads sub/b.yaml"):
        load_pipelines(tmp_path)


def _repo_with(tmp_path: Path, cmd: str, variables=None) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"data": {"cmd": "posttrain data --out outputs/data"}}}))
    stage = {"wdir": "..", "cmd": cmd}
    (tmp_path / "sub" / "dvc.yaml").write_text(yaml.safe_dump({"vars": variables or [], "stages": {"sft": stage}}))
    return tmp_path


def test_overrides_of_a_pipeline_and_of_a_task_are_validated(tmp_path, monkeypatch):
    from posttrain.orchestration import graph

    monkeypatch.setattr(graph, "PIPELINE_FILES", {"text": "dvc.yaml", "sub": "sub/dvc.yaml"})
    repo = _repo_with(tmp_path, "posttrain sft ${opts} --set sft.lr=0.5 --in data=outputs/data --out outputs/sft", [{"opts": "--set rl.advantage=gdpx"}])
    sub = load_pipelines(repo)["sub"]
    assert sub.overrides == ()  # data passes none, so the pipeline shares none: they stay with the task
    assert {t.id: t.extra_args for t in sub.tasks} == {"data": (), "sft": ("--set=rl.advantage=gdpx", "--set=sft.lr=0.5")}
    with pytest.raises(UserError, match="pipeline 'sub', stage 'sft'.*rl.advantage"):
        check_overrides(sub, REPO / "params.yaml")


def test_an_undefined_variable_is_refused(tmp_path, monkeypatch):
    from posttrain.orchestration import graph

    monkeypatch.setattr(graph, "PIPELINE_FILES", {"text": "dvc.yaml", "sub": "sub/dvc.yaml"})
    with pytest.raises(UserError, match=r"\$\{nope\} is not defined"):
        load_pipelines(_repo_with(tmp_path, "posttrain sft ${nope} --in data=outputs/data --out outputs/sft"))


def test_a_command_that_is_not_a_registered_stage_is_refused(tmp_path):
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"x": {"cmd": "posttrain nosuchstage --out outputs/x"}}}))
    with pytest.raises(UserError, match="registered stage"):
        load_tasks(tmp_path / "dvc.yaml")


def test_dag_spec_file_equals_the_one_generated_from_the_config():
    assert (REPO / "dags" / "posttrain_pipelines.json").read_text() == render(pipeline_spec(REPO / "params.yaml", REPO))


def test_param_schemas_accept_the_defaults_and_reject_unknown_names():
    specs = param_specs(REPO / "params.yaml")
    for spec in specs.values():
        jsonschema.validate(spec["default"], spec["schema"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("gdpx", specs["rl.advantage"]["schema"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "nosuch", "weight": 1.0}], specs["rl.rewards"]["schema"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(-1, specs["sft.steps"]["schema"])  # 0 is valid: it skips SFT


def test_resolved_settings_read_back_unchanged(tmp_path):
    cfg = resolve_config(REPO / "params.yaml", [json.dumps({"rl.advantage": "gdpo", "sft": {"steps": 7}})], ["rl.beta=0.01"])
    assert (cfg.rl.advantage, cfg.sft.steps, cfg.rl.beta) == ("gdpo", 7, 0.01)
    written = tmp_path / "params.yaml"
    written.write_text(config_text(cfg))
    assert resolve.load(written) == cfg


def test_sections_without_their_null_keys_resolve_them_to_null():
    sections = resolve.load(REPO / "params.yaml").model_dump(mode="json")
    values = [json.dumps({name: {k: v for k, v in section.items() if v is not None}}) for name, section in sections.items()]
    cfg = resolve_config(Path("/nonexistent/params.yaml"), values, [])
    assert cfg.model.path is None and cfg.rl.preset is None


def test_submit_arguments_are_the_validated_sections_and_the_image(tmp_path):
    from posttrain.orchestration.submit import run_arguments

    package = REPO / "pipelines" / "compiled" / "text.yaml"
    arguments = run_arguments(REPO / "params.yaml", ["rl.advantage=gdpo"], package, image="registry.local/posttrain:1")
    assert arguments["rl"]["advantage"] == "gdpo" and arguments["image"] == "registry.local/posttrain:1"
    assert set(arguments) == set(next(yaml.safe_load_all(package.read_text()))["root"]["inputDefinitions"]["parameters"])
    assert "path" not in arguments["model"]  # null: left out (Kubeflow parameters cannot hold null), read back as null
    with pytest.raises(UserError, match="rl.advantage"):
        run_arguments(REPO / "params.yaml", ["rl.advantage=gdpx"], package, image="")
    with pytest.raises(UserError, match="make pipelines"):
        run_arguments(REPO / "params.yaml", [], tmp_path / "missing.yaml", image="")


def test_values_are_section_keys_or_whole_sections():
    from posttrain.orchestration.schema import values_to_raw

    assert values_to_raw({"rl.beta": 0.1, "sft": {"steps": 3}, "sft.lr": 0.1}) == {"rl": {"beta": 0.1}, "sft": {"steps": 3, "lr": 0.1}}
    with pytest.raises(UserError, match="objectives"):
        values_to_raw({"objectives": ["grpo"]})


def test_nulls_dropped_for_kubeflow_read_back_as_null_at_any_depth():

    from posttrain.orchestration.preflight import _absent_optional_is_null, without_nulls

    raw = repo_params()
    stripped = {section: without_nulls(values) for section, values in raw.items()}
    assert "fixed_alpha" not in stripped["preference"]["options"]["abc_align"]  # a nested null, in an options block
    _absent_optional_is_null(stripped)
    assert stripped == raw
