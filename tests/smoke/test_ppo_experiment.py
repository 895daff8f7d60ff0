"""experiments/ppo_vs_grpo.py runs end to end on a micro budget (2 seeds, 1 step) and writes its JSON (means, 95%
intervals, verdicts) and MLflow runs. rfpo_vs_ppo.py shares its statistics and arms (its arm settings are checked in
tests/unit/test_rfpo.py); its end-to-end run stays out of the suite's time budget."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow

from helpers import REPO


import pytest

CLAIMS = {"ppo_vs_grpo": ({"grpo_gain", "ppo_gain", "ppo_minus_grpo"}, {"grpo", "ppo"})}


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_claim_runs_and_reports_intervals(name, tmp_path):
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"POSTTRAIN_EXP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / f"{name}.py"), "--steps", "1", "--seeds", "2", "--micro", "--set", "sft.steps=4", "--set", "eval.n_prompts=8",
         "--set", "eval.batch_size=8", "--json", str(out),
         "--tracking-uri", uri], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    keys, arms = CLAIMS[name]
    assert data["claim"] == name and data["seeds"] == [0, 1] and len(data["per_seed"]) == 2 and set(data["summary"]) == keys
    for s in data["summary"].values():
        assert s["ci95"][0] <= s["mean"] <= s["ci95"][1]
        assert s.get("verdict", s.get("verdict_match")) in {"reproduced", "contradicted", "inconclusive"}
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claims"])
    assert set(runs["tags.mlflow.runName"]) == {f"{name}/{a}" for a in arms}
    assert "metrics.value_loss" in runs.columns  # the PPO arm logs the critic's figures per step
