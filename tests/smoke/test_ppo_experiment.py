"""experiments/ppo_vs_grpo.py runs end to end on a micro budget (2 seeds, 2 steps) and writes its JSON + MLflow runs."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow

from helpers import REPO


def test_ppo_vs_grpo_runs_and_reports_intervals(tmp_path):
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"POSTTRAIN_EXP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "ppo_vs_grpo.py"), "--steps", "2", "--seeds", "2", "--micro", "--json", str(out),
         "--tracking-uri", uri], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["claim"] == "ppo_vs_grpo" and data["seeds"] == [0, 1] and len(data["per_seed"]) == 2
    for key in ("grpo_gain", "ppo_gain", "ppo_minus_grpo"):
        s = data["summary"][key]
        assert s["ci95"][0] <= s["mean"] <= s["ci95"][1] and s["verdict"] in {"reproduced", "contradicted", "inconclusive"}
    assert all("ppo_explained_variance_last" in row for row in data["per_seed"])
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claims"])
    assert set(runs["tags.mlflow.runName"]) == {"ppo_vs_grpo/grpo", "ppo_vs_grpo/ppo"}
    assert "metrics.value_loss" in runs.columns  # the critic's figures are logged per step
