"""Issue 33's "what must hold": every recipe's pipeline runs from its params file through its own dvc.yaml
(`dvc repro recipes/<name>/dvc.yaml`) in a Git- and DVC-initialised copy on a micro config: every stage of the file
runs (and the core stages it reads, data and sft, built first from ./dvc.yaml where it reads them), writes its metrics
and logs a finished MLflow run; the vision recipes' stages log their images or GIFs and their tables; a second
`dvc repro` has nothing to do.

A minute or more each on 2 shared cores (two to five `posttrain` subprocesses): marked heavy, run by `make test-heavy`.
rlhf's pipeline runs under `dvc repro` in tests/orchestration/test_kfp_pipeline.py's heavy test (against its compiled
Kubeflow pipeline): ELSEWHERE. What `make test` keeps of it: that table and this one together name every recipe folder
with a dvc.yaml (a new recipe cannot be left out), the dvc.yaml files are checked statically (tests/recipes/*/test_*_dvc_yaml.py), and each
stage's MLflow logging and resume after a kill run in process (tests/recipes/*/test_*stage*.py)."""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import yaml

from helpers import MICRO_CRITIC, MICRO_IMAGE, REPO, dvc, git, micro_params, ran_stages


def stage_test(target: str) -> dict:
    """A stage test's micro settings, `module:name` under tests/ (a dict, or a function returning one); imported when a
    case runs, so that collecting this file imports no torch."""
    module, name = target.split(":")
    value = getattr(importlib.import_module(module), name)
    return value() if callable(value) else value


@dataclass(frozen=True)
class Recipe:
    micro: dict[str, Callable[[], dict]]  # a params file of the recipe's folder -> its micro sections, merged over the file's
    logged: dict[str, set[str]] = field(default_factory=dict)  # stage -> MLflow artifacts it must have logged


RECIPES = {
    "aura": Recipe({"params.yaml": lambda: {**stage_test("recipes.aura.test_aura:MARKET"),
                                            "eval": {"n_prompts": 8, "batch_size": 8, "max_new_tokens": 24}}}),
    "dsp": Recipe({"params.yaml": lambda: {"dsp": stage_test("recipes.dsp.test_dsp_stage:micro_dsp")}},
                  {"maze_data": {"render/maze.png"}, "dsp": {"results_table.json", "plans/dsp.gif"}}),
    "image": Recipe({"params.yaml": lambda: MICRO_IMAGE}),
    "motion": Recipe({"params.yaml": lambda: {"motion": stage_test("recipes.motion.test_motion_stages:micro_motion")}},
                     {"motion_data": {"gifs/heldout_00.gif", "annotations.json"}, "motion_sft": {"predictions.json"},
                      "motion_grpo": {"gifs/heldout_00.gif", "predictions.json"}}),
    "rfpo": Recipe({"params.yaml": lambda: {"critic": MICRO_CRITIC}}),  # data and sft: ./dvc.yaml's, on helpers.MICRO
    "safe_rl": Recipe({"params.yaml": lambda: {"safe_rl": stage_test("recipes.safe_rl.test_safe_rl_stage:micro_safe_rl")}}),
    "search": Recipe({"params.yaml": lambda: stage_test("recipes.search.test_asct_stage:micro_sections"),  # asct's
                      "bridge.yaml": lambda: stage_test("recipes.search.test_bridge_stage:micro_sections")}),
    "viskg": Recipe({"params.yaml": lambda: {"viskg": stage_test("recipes.viskg.test_viskg_stage:micro_viskg")}},
                    {"viskg_sft": {"scenes/scenes.png", "sft_samples.json"}, "viskg_rl": {"scenes/scenes.png", "rl_samples.json"}}),
}
# recipes whose `dvc repro recipes/<name>/dvc.yaml` a heavy test elsewhere runs: name -> (test file, test function)
ELSEWHERE = {"rlhf": ("tests/orchestration/test_kfp_pipeline.py", "test_local_execution_of_the_rlhf_yaml_matches_dvc_repro")}


def merged(base: dict, update: dict) -> dict:
    """`update` over `base`, mappings key by key (as a params file's `extends` merges)."""
    out = dict(base)
    for key, value in update.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def test_every_recipe_pipeline_is_run_by_a_heavy_test():
    folders = {p.parent.name for p in (REPO / "recipes").glob("*/dvc.yaml")}
    assert folders and not set(RECIPES) & set(ELSEWHERE)
    assert set(RECIPES) | set(ELSEWHERE) == folders, "add the recipe to RECIPES (its micro settings) or to ELSEWHERE"
    for name, recipe in RECIPES.items():
        assert all((REPO / "recipes" / name / file).is_file() for file in recipe.micro), name
    for name, (path, function) in ELSEWHERE.items():
        text = (REPO / path).read_text()
        assert f"@pytest.mark.heavy\ndef {function}(" in text and f"recipes/{name}/dvc.yaml" in text, (name, path, function)


@pytest.mark.heavy
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_recipe_pipeline_runs_through_dvc_repro_and_logs_its_runs(name, tmp_path):
    import mlflow

    from posttrain.orchestration.graph import load_tasks

    recipe, folder = RECIPES[name], f"recipes/{name}"
    tasks = load_tasks(REPO / folder / "dvc.yaml", REPO, (REPO / "dvc.yaml",), name)  # and the core stages it reads
    assert set(recipe.logged) <= {task.id for task in tasks}
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copytree(REPO / folder, tmp_path / folder)
    micro_params(tmp_path)
    for file, micro in recipe.micro.items():  # the keys its dvc.yaml tracks, set to the micro values
        path = tmp_path / folder / file
        path.write_text(yaml.safe_dump(merged(yaml.safe_load(path.read_text()), micro()), sort_keys=False))
    git("init", "-q", cwd=tmp_path)
    dvc("init", "-q", cwd=tmp_path)
    dvc("config", "core.analytics", "false", cwd=tmp_path)
    git("add", "-A", cwd=tmp_path)
    git("commit", "-qm", f"micro {name}", cwd=tmp_path)

    ran = ran_stages(dvc("repro", f"{folder}/dvc.yaml", cwd=tmp_path))
    assert {stage.split(":")[-1] for stage in ran} == {task.id for task in tasks}
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    for task in tasks:
        out = tmp_path / task.out
        assert json.loads((out / "metrics.json").read_text()), task.id
        run = client.get_run(json.loads((out / "mlflow_run.json").read_text())["run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["stage"] == task.stage and run.data.tags["launcher"] == "dvc", task.id
        assert recipe.logged.get(task.id, set()) <= artifacts(client, run.info.run_id), (task.id, artifacts(client, run.info.run_id))
    assert "up to date" in dvc("repro", f"{folder}/dvc.yaml", cwd=tmp_path).lower()  # nothing changed: nothing reruns
