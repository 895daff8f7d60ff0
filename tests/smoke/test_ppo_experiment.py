"""experiments/ppo_vs_grpo.py and rfpo_vs_ppo.py run end to end on a micro budget through the claims harness: per
seed, the results table with one row per arm, the claimed comparisons with intervals and verdicts. ppo_vs_grpo runs
as a script (2 seeds) with MLflow: a parent run per claim, a child per arm x seed, the PPO arm's critic figures;
rfpo_vs_ppo in this process (1 seed, no MLflow: its path is the same `_common.log_arm`). The rfpo arm settings are
checked in tests/recipes/rfpo/test_rfpo.py."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import pytest

from helpers import REPO, claim_in_process
from test_experiments import check_comparisons

MICRO = ["--steps", "1", "--micro", "--set", "sft.steps=4", "--set", "eval.n_prompts=8", "--set", "eval.batch_size=8"]


def check_tables(claim: dict, arms: set[str]) -> None:
    for seed, data in enumerate(claim["per_seed"]):
        assert data["seed"] == seed and {row["arm"] for row in data["table"]} == arms
        assert all(row["gain"] == pytest.approx(row["heldout_greedy_after"] - row["heldout_greedy_before"]) for row in data["table"])


def test_ppo_vs_grpo_runs_through_the_harness(tmp_path):
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"POSTTRAIN_EXP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run([sys.executable, str(REPO / "experiments" / "ppo_vs_grpo.py"), *MICRO, "--seeds", "2", "--json", str(out),
                             "--tracking-uri", uri], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    claim = json.loads(out.read_text())
    assert claim["claim"] == "ppo_vs_grpo" and claim["seeds"] == [0, 1] and len(claim["per_seed"]) == 2
    assert claim["command"].startswith(".venv/bin/python experiments/ppo_vs_grpo.py ") and "--seeds 2" in claim["command"]
    check_comparisons(claim, 2)
    assert {(c["better"], c["worse"]) for c in claim["comparisons"]} == {("ppo", "sft"), ("grpo", "sft"), ("ppo", "grpo")}
    check_tables(claim, {"grpo", "ppo"})
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claims"])
    children = runs[runs["tags.mlflow.parentRunId"] == claim["mlflow_parent_run"]]
    assert set(children["tags.mlflow.runName"]) == {f"ppo_vs_grpo/{a}/seed{s}" for a in ("grpo", "ppo") for s in (0, 1)}
    assert "metrics.value_loss" in runs.columns  # the PPO arm logs the critic's figures per step


def test_rfpo_vs_ppo_runs_through_the_harness(tmp_path, monkeypatch):
    out = tmp_path / "rfpo.json"
    claim = claim_in_process(monkeypatch, tmp_path, "rfpo_vs_ppo", "rfpo_vs_ppo", [*MICRO, "--seeds", "1", "--no-mlflow", "--json", str(out)])
    assert json.loads(out.read_text())["claim"] == "rfpo_vs_ppo" and claim["command"].startswith(".venv/bin/python experiments/rfpo_vs_ppo.py ")
    check_comparisons(claim, 1)
    assert {(c["better"], c["worse"], c["metric"]) for c in claim["comparisons"]} == {
        ("rfpo", "sft", "heldout_greedy_after"), ("rfpo", "ppo", "heldout_greedy_after"), ("rfpo", "rfpo_raw", "heldout_greedy_after"),
        ("rfpo", "rfpo_raw", "len_last")}
    check_tables(claim, {"ppo", "rfpo", "rfpo_raw"})
    (seed,) = claim["per_seed"]
    assert 0.0 <= seed["critic"]["heldout_brier"] <= 1.0 and all(row["len_last"] > 0 for row in seed["table"])
    # the verifier's accuracy of every arm's training rollouts is recorded, the critic-rewarded arms' too
    assert all(0.0 <= row["train_acc_first"] <= 1.0 and 0.0 <= row["train_acc_last"] <= 1.0 for row in seed["table"])
