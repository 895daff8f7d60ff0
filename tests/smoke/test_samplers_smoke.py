"""experiments/samplers_compare.py end to end on a micro budget, in process: every sampler arm, the contexts, the RL
arm, the claims with verdicts, the figure and the MLflow run."""

from __future__ import annotations

import importlib.util
import json
import sys

import mlflow

from helpers import REPO


def test_samplers_experiment_runs_every_arm_and_reports_claims(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        spec = importlib.util.spec_from_file_location("samplers_compare", REPO / "experiments" / "samplers_compare.py")
        experiment = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(experiment)
    finally:
        sys.path.remove(str(REPO / "experiments"))
    monkeypatch.setattr(experiment.C, "CACHE", tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setattr(sys, "argv", ["samplers_compare.py", "--micro", "--steps", "1", "--seed", "0", "--seeds", "1", "--prompts", "6", "--k", "2",
                                      "--chunk", "6", "--json", str(out), "--tracking-uri", uri])
    experiment.main()
    data = json.loads(out.read_text())
    seed = data["per_seed"][0]
    for arm in ("greedy", "temperature", "beam", "power", "power_matched", "ppt", "ttsd", "beam_wide", "temperature_vote", "rl_greedy"):
        assert 0.0 <= seed[arm]["accuracy"] <= 1.0 and seed[arm]["forward_tokens"] > 0, arm
    assert seed["ppt"]["forward_tokens"] > seed["greedy"]["forward_tokens"] and seed["ppt"]["swaps"] > 0
    assert seed["power_matched"]["forward_tokens"] >= seed["ppt"]["forward_tokens"]  # matched compute
    assert seed["temperature_vote"]["forward_tokens"] >= seed["ttsd"]["forward_tokens"] or seed["temperature_vote"]["votes"] == 256
    assert {"context_plain", "context_positive", "context_negative"} <= set(seed)
    assert all(c["verdict"] in {"reproduced", "contradicted", "inconclusive"} for c in data["claims"].values())
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claims"], output_format="list")
    assert len(runs) == 1 and "accuracy_vs_forward_tokens.png" in {a.path for a in mlflow.MlflowClient().list_artifacts(runs[0].info.run_id)}
