"""An objective sweep with `dvc exp run`, then `posttrain compare` over the MLflow experiment."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from orch_helpers import BIN, dvc, tool_env

from helpers import copy_repro_run

pytestmark = pytest.mark.slow


def test_dvc_exp_run_of_a_second_objective_then_compare_writes_table_and_plot(dvc_repro_run, tmp_path):
    repo = copy_repro_run(dvc_repro_run, tmp_path / "repo")  # its grpo run is the first arm; data and sft stay cached
    output = dvc("exp", "run", "-S", "rl.advantage=rloo", cwd=repo)
    ran = {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}
    assert ran == {"rl", "eval@rl", "distill"}, output  # distill reads the rl settings and model
    result = subprocess.run([str(BIN / "posttrain"), "compare", "--out", "outputs/compare"], cwd=repo, env=tool_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((repo / "outputs/compare/comparison.json").read_text())
    assert [(r["arm"], r["objective"]) for r in rows] == [("grpo", "grpo+clip"), ("rloo", "rloo+clip")]
    for row in rows:
        assert 0.0 <= row["heldout_accuracy"] <= 1.0 and row["steps"] == 2 and row["wall_seconds"] > 0
    table = (repo / "outputs/compare/comparison.md").read_text()
    assert "| rloo | rloo+clip |" in table and "| grpo | grpo+clip |" in table
    assert (repo / "outputs/compare/reward_curves.png").read_bytes()[:4] == b"\x89PNG"
    metrics = json.loads(result.stdout)
    assert metrics["objectives"] == 2.0 and "rloo/heldout_accuracy" in metrics

    from mlflow.tracking import MlflowClient

    uri = yaml.safe_load((repo / "params.yaml").read_text())["tracking"]["uri"]  # `dvc exp run -S` re-dumps the file: a long value may wrap
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("posttrain")
    (compare_run,) = client.search_runs([experiment.experiment_id], "tags.stage = 'compare'")
    logged = [a.path for a in client.list_artifacts(compare_run.info.run_id)]
    assert sorted(logged) == ["comparison.json", "comparison.md", "reward_curves.png"]  # each once, nothing else
