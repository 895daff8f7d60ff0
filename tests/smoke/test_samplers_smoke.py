"""experiments/samplers_compare.py end to end on a micro budget: every sampler arm, the contexts, the RL arm, the
claims with verdicts, the figure and the MLflow run."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow

from helpers import REPO


def test_samplers_experiment_runs_every_arm_and_reports_claims(tmp_path):
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"POSTTRAIN_EXP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "samplers_compare.py"), "--micro", "--steps", "1", "--seeds", "0", "--prompts", "6",
         "--k", "2", "--json", str(out), "--tracking-uri", uri],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    seed = data["per_seed"][0]
    for arm in ("greedy", "temperature", "beam", "power", "power_full", "ppt", "ttsd", "beam_wide", "temperature_vote", "rl_greedy"):
        assert 0.0 <= seed[arm]["accuracy"] <= 1.0 and seed[arm]["forward_tokens"] > 0, arm
    assert seed["ppt"]["forward_tokens"] > seed["greedy"]["forward_tokens"] and seed["ppt"]["swaps"] > 0
    assert {"context_plain", "context_positive", "context_negative"} <= set(seed)
    assert all(c["verdict"] in {"reproduced", "contradicted", "inconclusive"} for c in data["claims"].values())
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claims"], output_format="list")
    assert len(runs) == 1 and "accuracy_vs_forward_tokens.png" in {a.path for a in mlflow.MlflowClient().list_artifacts(runs[0].info.run_id)}
