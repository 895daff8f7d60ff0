"""Issue 20's "what must hold", end to end: each vision method (VisKG, MotionInsight, DSP) runs from params.yaml
through its own dvc.yaml (`dvc repro recipes/viskg/dvc.yaml`, `dvc repro recipes/motion/dvc.yaml`, ...) in a Git- and
DVC-initialised copy on a micro config,
every stage of the file runs, writes its metrics, and logs its images or GIFs and its tables to MLflow.

A minute or more each on 2 shared cores (two to three `posttrain` subprocesses, each importing torch): marked heavy,
run by `make test-heavy`. What `make test` keeps of it: the dvc.yaml files are checked statically
(tests/orchestration/test_viskg_dvc_yaml.py, tests/recipes/{motion,dsp}/test_*_dvc_yaml.py), and each stage's MLflow
logging and resume after a kill run in process (tests/smoke/test_viskg_stage*.py, tests/recipes/{motion,dsp}/test_*_stage*.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from helpers import REPO, dvc, git, micro_params, ran_stages

# side pipeline -> (its params section's micro settings, {stage: MLflow artifacts it must have logged})
PIPELINES = {
    "viskg": ("recipes.viskg.test_viskg_stage:micro_viskg", {"viskg_sft": {"scenes/scenes.png", "sft_samples.json"},
                                                     "viskg_rl": {"scenes/scenes.png", "rl_samples.json"}}),
    "motion": ("recipes.motion.test_motion_stages:micro_motion", {"motion_data": {"gifs/heldout_00.gif", "annotations.json"},
                                                         "motion_sft": {"predictions.json"},
                                                         "motion_grpo": {"gifs/heldout_00.gif", "predictions.json"}}),
    "dsp": ("recipes.dsp.test_dsp_stage:micro_dsp", {"maze_data": {"render/maze.png"}, "dsp": {"results_table.json", "plans/dsp.gif"}}),
}


def artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


@pytest.mark.heavy
@pytest.mark.parametrize("side", sorted(PIPELINES))
def test_the_side_pipeline_runs_through_dvc_repro_and_logs_media_and_tables(side, tmp_path):
    import importlib

    import mlflow

    target, logged = PIPELINES[side]
    module, function = target.split(":")
    section = getattr(importlib.import_module(module), function)()
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    folder = side if (REPO / side).is_dir() else f"recipes/{side}"  # a recipe's pipeline files: recipes/<name>/
    (tmp_path / folder).mkdir(parents=True)
    shutil.copy(REPO / folder / "dvc.yaml", tmp_path / folder / "dvc.yaml")
    micro_params(tmp_path, **{side: section})
    own = yaml.safe_load((REPO / folder / "params.yaml").read_text())  # the keys its dvc.yaml tracks, set to the micro values
    own[side] = {**own[side], **section}
    (tmp_path / folder / "params.yaml").write_text(yaml.safe_dump(own, sort_keys=False))
    git("init", "-q", cwd=tmp_path)
    dvc("init", "-q", cwd=tmp_path)
    dvc("config", "core.analytics", "false", cwd=tmp_path)
    git("add", "-A", cwd=tmp_path)
    git("commit", "-qm", f"micro {side}", cwd=tmp_path)

    ran = ran_stages(dvc("repro", f"{folder}/dvc.yaml", cwd=tmp_path))
    assert {name.split(":")[-1] for name in ran} == set(logged)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    for stage, expected in logged.items():
        out = tmp_path / "outputs" / stage
        assert json.loads((out / "metrics.json").read_text()), stage
        run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
        assert expected <= artifacts(client, run_id), (stage, artifacts(client, run_id))
    assert "up to date" in dvc("repro", f"{folder}/dvc.yaml", cwd=tmp_path).lower()  # nothing changed: nothing reruns
