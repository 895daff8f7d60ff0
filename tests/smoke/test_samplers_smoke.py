"""experiments/samplers_compare.py end to end on a micro budget, in process, through the claims harness: every
sampler arm, best-of-N, the contexts, the RL arm, the claim's comparisons with verdicts, and the MLflow runs (a
child per seed, the parent with the comparisons and the accuracy-vs-forward-tokens figure)."""

from __future__ import annotations

import importlib.util
import sys

import mlflow

from helpers import REPO, is_verdict


def load_experiment():
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        spec = importlib.util.spec_from_file_location("samplers_compare", REPO / "experiments" / "samplers_compare.py")
        experiment = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(experiment)
    finally:
        sys.path.remove(str(REPO / "experiments"))
    return experiment


def test_samplers_experiment_runs_every_arm_and_reports_claims(tmp_path, monkeypatch):
    experiment = load_experiment()
    monkeypatch.setattr(experiment.C, "CACHE", tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--dataset", "arithmetic", "--micro", "--steps", "1", "--prompts", "6", "--k", "2", "--chunk", "6", "--tracking-uri", uri,
            "--seeds", "1", "--json", str(out)]
    assert experiment.claim_of(argv) == "samplers_arithmetic"
    data = experiment.C.run_seeds(experiment.main, "samplers_arithmetic", argv, script=str(REPO / "experiments" / "samplers_compare.py"),
                                  figure=experiment.claim_figure)
    arms = data["per_seed"][0]["arms"]
    for arm in ("greedy", "temperature", "beam", "power", "power_matched", "ppt", "ttsd", "beam_wide", "temperature_vote", "bon_likelihood",
                "bon_oracle", "rl_greedy", "context_plain", "context_positive", "context_negative"):
        assert 0.0 <= arms[arm]["accuracy"] <= 1.0 and arms[arm]["forward_tokens"] > 0, arm
    assert arms["ppt"]["forward_tokens"] > arms["greedy"]["forward_tokens"] and arms["ppt"]["swaps"] > 0
    assert arms["power_matched"]["forward_tokens"] >= arms["ppt"]["forward_tokens"]  # matched compute
    assert arms["temperature_vote"]["forward_tokens"] >= arms["ttsd"]["forward_tokens"] or arms["temperature_vote"]["votes"] == 256
    assert arms["bon_oracle"]["accuracy"] >= max(arms["temperature_vote"]["accuracy"], arms["bon_likelihood"]["accuracy"])
    assert len(data["comparisons"]) == 10 and all(is_verdict(c["verdict"]) for c in data["comparisons"])  # one seed: no interval, no premise verdict
    assert str(REPO) not in data["command"] and "experiments/samplers_compare.py --dataset arithmetic" in data["command"]
    assert "--tracking-uri" not in data["command"]
    mlflow.set_tracking_uri(uri)
    runs = {r.info.run_name: r for r in mlflow.search_runs(experiment_names=["claims"], output_format="list")}
    assert set(runs) == {"samplers_arithmetic", "samplers_arithmetic/seed0"}
    parent = runs["samplers_arithmetic"].info.run_id
    assert "accuracy_vs_forward_tokens.png" in {a.path for a in mlflow.MlflowClient().list_artifacts(parent)}
