"""The VLM-Safe-RL stages on a micro config: drive_encoder trains the tiny CLIP, safe_rl trains the PPO-Lagrangian agent
over it (metrics, an episode GIF and per-round figures in MLflow) and resumes bit-for-bit after a SIGKILL; and the
measured claim's encoders fed the method a non-degenerate safety score."""

from __future__ import annotations

import copy
import json

import pytest

from helpers import repo_params, REPO, fork_safe_params, is_verdict, kill_resume_and_compare, micro_params


def micro_safe_rl() -> dict:
    section = copy.deepcopy(repo_params()["safe_rl"])
    section["env"].update(image_size=16, horizon=6, cars=2)
    section["encoder"].update(n_frames=64, n_heldout=16, steps=2, batch_size=16, log_every=1, hidden_size=16, layers=1, embed_dim=8)
    section.update(iterations=4, envs=3, epochs=1, minibatches=1, eval_episodes=2, checkpoint_every=1)
    return section


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    from posttrain.resolve import load
    from posttrain.stages import execute

    root = tmp_path_factory.mktemp("drive_encoder")
    metrics = execute("drive_encoder", load(fork_safe_params(root, safe_rl=micro_safe_rl())), {}, root / "outputs" / "drive_encoder")
    assert {"danger_phrase_accuracy", "score_gap", "loss"} <= set(metrics)
    return root / "outputs" / "drive_encoder"


def test_safe_rl_stage_logs_costs_and_an_episode_gif(encoder_dir, tmp_path):
    import mlflow
    from PIL import Image

    from posttrain.resolve import load
    from posttrain.stages import execute

    params = micro_params(tmp_path, safe_rl=micro_safe_rl())
    out = tmp_path / "outputs" / "safe_rl"
    metrics = execute("safe_rl", load(params), {"encoder": encoder_dir}, out)
    assert {"final_catastrophe_rate", "final_cost", "final_progress", "final_cost_normalised", "lambda"} <= set(metrics)
    assert 0.0 <= metrics["final_catastrophe_rate"] <= 1.0
    history = json.loads((out / "history.json").read_text())
    assert len(history) == 4 and all({"catastrophe_rate", "cost", "progress", "lambda", "risk", "safety_score"} <= set(h) for h in history)
    assert metrics["lambda"] == pytest.approx(history[-1]["lambda_next"])  # the multiplier after the last update
    gif = Image.open(out / "episode" / "episode.gif")
    assert gif.n_frames > 1 and gif.size == (64, 64)
    assert (out / "model" / "model.safetensors").is_file()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(run_id, "catastrophe_rate")) == 4 and client.get_run(run_id).data.metrics["final_progress"] == pytest.approx(metrics["final_progress"])
    assert [a.path for a in client.list_artifacts(run_id, "episode")] == ["episode/episode.gif"]


def test_a_killed_safe_rl_run_resumes_bit_for_bit(encoder_dir, tmp_path):
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, safe_rl=micro_safe_rl())
    kill_resume_and_compare(*roots, "safe_rl", ["--in", f"encoder={encoder_dir}"], kill_at=2, in_process=True)


def test_the_claims_encoders_fed_a_non_degenerate_safety_score():
    """The measured claim (experiments/results/safe_rl_vlm.json): on each seed the frozen encoder scores held-out frames
    captioned safe above those captioned about to crash, and the VLM risk term moved (kappa_term_mean != 0)."""
    results = json.loads((REPO / "experiments" / "results" / "safe_rl_vlm.json").read_text())
    assert len(results["per_seed"]) >= 3
    for seed in results["per_seed"]:
        assert seed["encoder"]["score_safe_frames"] > seed["encoder"]["score_crash_frames"]
        vlm = next(r for r in seed["table"] if r["arm"] == "ppo_lag_vlm")
        assert vlm["kappa_term_mean"] != 0.0 and next(r for r in seed["table"] if r["arm"] == "ppo_lag")["kappa_term_mean"] == 0.0


def test_the_claim_experiment_runs_through_the_harness_on_a_micro_budget(tmp_path, monkeypatch):
    """experiments/safe_rl_vlm.py under the claims harness (in this process: 2 seeds, 1 round, micro sizes, no MLflow):
    per seed the four arms' table, and per claimed difference both sides' values, an interval and a verdict."""
    import importlib.util
    import sys

    monkeypatch.setenv("POSTTRAIN_EXP_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(REPO / "experiments"))
    spec = importlib.util.spec_from_file_location("claim_safe_rl_vlm", REPO / "experiments" / "safe_rl_vlm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from _claims import run_seeds

    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["safe_rl_vlm.py"])
    results = run_seeds(module.main, "safe_rl_vlm", ["--steps", "1", "--micro", "--no-mlflow", "--seeds", "2", "--json", str(out)],
                        script=str(REPO / "experiments" / "safe_rl_vlm.py"))
    assert json.loads(out.read_text())["seeds"] == [0, 1] and len(results["comparisons"]) == 6
    assert results["command"].startswith(".venv/bin/python experiments/safe_rl_vlm.py ")
    for seed in results["per_seed"]:
        assert [r["arm"] for r in seed["table"]] == list(module.ARMS) and seed["steps"] == 1
    for c in results["comparisons"]:
        assert len(c["better_values"]) == 2 and is_verdict(c["verdict"])


def test_a_killed_encoder_run_resumes_bit_for_bit(tmp_path):
    """drive_encoder checkpoints its model, optimizer, schedule and batch draw: killed after step 2 of 4, resumed, it
    ends with the uninterrupted run's weights and history."""
    section = micro_safe_rl()
    section["encoder"].update(steps=4, checkpoint_every=1)
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, safe_rl=section)
    assert len(kill_resume_and_compare(*roots, "drive_encoder", [], kill_at=2, in_process=True, resumed_steps=2)) == 4
