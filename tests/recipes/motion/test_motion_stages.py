"""The MotionInsight stages on a micro config: motion_data draws the annotated clips (GIFs and a table in MLflow),
motion_sft and motion_grpo train the evaluator (held-out rank correlations, cause F1, judgements as a table, clips as
GIFs), motion_grpo resumes bit-for-bit after a SIGKILL, a mismatched evaluator is refused in one line, and the
measured claim's evaluators were fed a non-degenerate reward."""

from __future__ import annotations

import copy
import json

import pytest

from helpers import repo_params, REPO, claim_in_process, fork_safe_params, is_verdict, kill_resume_and_compare, micro_params


def micro_motion() -> dict:
    section = copy.deepcopy(repo_params()["motion"])
    section["video"].update(frames=10, size=16)
    section["model"].update(encoder_width=8, soft_tokens=2, hidden_size=16, layers=1)
    section.update(n_train=12, n_heldout=6, n_gifs=2)
    section["sft"].update(steps=3, batch_size=4, log_every=1, checkpoint_every=1)
    section["rl"].update(steps=3, videos_per_step=2, group_size=2, checkpoint_every=1)
    return section


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    from posttrain.resolve import load
    from posttrain.stages import execute

    root = tmp_path_factory.mktemp("motion")
    cfg = load(fork_safe_params(root, motion=micro_motion()))
    data = execute("motion_data", cfg, {}, root / "outputs" / "motion_data")
    assert abs(sum(data[k] for k in data if k.startswith("share_") and k != "share_clean")) > 0
    sft = execute("motion_sft", cfg, {"data": root / "outputs" / "motion_data"}, root / "outputs" / "motion_sft")
    assert {"heldout_rho_consistency", "heldout_rho_continuity", "heldout_rho_plausibility", "heldout_cause_f1", "heldout_format_rate",
            "loss"} <= set(sft)
    return root / "outputs"


def test_motion_grpo_logs_judgements_and_gifs(upstream, tmp_path):
    import mlflow
    from PIL import Image

    from posttrain.resolve import load
    from posttrain.stages import execute

    out = tmp_path / "outputs" / "motion_grpo"
    metrics = execute("motion_grpo", load(micro_params(tmp_path, motion=micro_motion())),
                      {"data": upstream / "motion_data", "sft": upstream / "motion_sft"}, out)
    assert all(-1 <= metrics[f"heldout_rho_{d}"] <= 1 for d in ("consistency", "continuity", "plausibility"))
    assert 0 <= metrics["heldout_cause_f1"] <= 1 and 0 <= metrics["heldout_reward"] <= 1.6
    history = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in history] == [1, 2, 3] and all({"reward", "score_accuracy", "cause_f1", "format", "kl"} <= set(h) for h in history)
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 6 and all(0 <= p["reward"] <= 1.6 for p in predictions)
    assert Image.open(out / "gifs" / "heldout_00.gif").n_frames == 10
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(run_id, "reward")) == 3 and "heldout_reward" in client.get_run(run_id).data.metrics
    assert {a.path for a in client.list_artifacts(run_id)} >= {"gifs", "model", "predictions.json"}
    assert [a.path for a in client.list_artifacts(run_id, "gifs")] == ["gifs/heldout_00.gif", "gifs/heldout_01.gif"]


def test_a_killed_motion_grpo_run_resumes_bit_for_bit(upstream, tmp_path):
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, motion=micro_motion())
    args = ["--in", f"data={upstream / 'motion_data'}", "--in", f"sft={upstream / 'motion_sft'}"]
    assert len(kill_resume_and_compare(*roots, "motion_grpo", args, kill_at=2, in_process=True, resumed_steps=1)) == 3


def test_an_rgb_run_refuses_a_motion_evaluator_in_one_line(upstream, tmp_path):
    from posttrain.errors import UserError
    from posttrain.resolve import load
    from posttrain.stages import execute

    cfg = load(fork_safe_params(tmp_path, motion={**micro_motion(), "representation": "rgb"}))
    with pytest.raises(UserError, match="reads 'motion', but motion.representation is 'rgb'"):
        execute("motion_grpo", cfg, {"data": upstream / "motion_data", "sft": upstream / "motion_sft"}, tmp_path / "outputs" / "motion_grpo")
    assert not (tmp_path / "outputs" / "motion_grpo").exists()


def test_the_claims_evaluators_were_fed_a_non_degenerate_reward():
    """The measured claim (experiments/results/motion_vs_rgb.json): on each seed both arms' GRPO groups had rewards that
    differ (a zero-variance group gives GRPO no signal) and the SFT evaluators wrote parseable judgements."""
    results = json.loads((REPO / "experiments" / "results" / "motion_vs_rgb.json").read_text())
    assert len(results["per_seed"]) >= 3
    for seed in results["per_seed"]:
        for row in seed["table"]:
            assert row["reward_std_in_group"] > 0.05 and row["sft_format_rate"] > 0.5, (seed["arms"].keys(), row["arm"])


def test_the_claim_experiment_runs_through_the_harness_on_a_micro_budget(tmp_path, monkeypatch):
    """experiments/motion_vs_rgb.py under the claims harness (in this process: 2 seeds, micro sizes, no MLflow): per seed
    both arms' table, and per claimed difference both sides' values, an interval and a verdict."""
    out = tmp_path / "out.json"
    results = claim_in_process(monkeypatch, tmp_path, "motion_vs_rgb", "motion_vs_rgb",
                               ["--steps", "1", "--sft-steps", "1", "--micro", "--no-mlflow", "--seeds", "2",
                                "--set", "motion.n_train=6", "--set", "motion.n_heldout=4", "--json", str(out)])
    assert json.loads(out.read_text())["seeds"] == [0, 1] and len(results["comparisons"]) == 5
    for seed in results["per_seed"]:
        assert [r["arm"] for r in seed["table"]] == ["motion", "rgb"] and seed["steps"] == 1  # the script's ARMS
    for c in results["comparisons"]:
        assert len(c["better_values"]) == 2 and is_verdict(c["verdict"])
