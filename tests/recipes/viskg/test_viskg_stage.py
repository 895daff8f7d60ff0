"""The VisKG stages on a micro config: viskg_sft trains the tiny vision-language model (metrics, held-out samples as
an MLflow table, the scene grid as an image), viskg_rl continues it with GDPO and resumes bit-for-bit after a SIGKILL;
the claim experiment runs through the claims harness; and the measured claim fed the methods a non-degenerate signal."""

from __future__ import annotations

import copy
import json

import pytest

from helpers import repo_params, REPO, claim_in_process, fork_safe_params, is_verdict, kill_resume_and_compare, micro_params


def micro_viskg() -> dict:
    section = copy.deepcopy(repo_params()["viskg"])
    section["data"].update(grid=2, n_objects=3, max_hops=2, n_train=24, n_heldout=4)
    section["model"].update(hidden_size=16, layers=1)
    section["sft"].update(steps=3, batch_size=4, log_every=1, checkpoint_every=1, warmup_steps=0)
    section["rl"].update(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=12, checkpoint_every=1, log_every=1)
    section["eval"].update(max_new_tokens=12, batch_size=4, n_table=2, n_images=2)
    return section


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    import mlflow

    from posttrain.resolve import load
    from posttrain.stages import execute

    root = tmp_path_factory.mktemp("viskg_sft")
    out = root / "outputs" / "viskg_sft"
    metrics = execute("viskg_sft", load(micro_params(root, viskg=micro_viskg())), {}, out)
    assert {"accuracy", "format_rate", "tokens", "reference_kg_tokens", "reference_caption_tokens", "sft_negatives"} <= set(metrics)
    assert metrics["reference_kg_tokens"] < metrics["reference_caption_tokens"] and metrics["sft_negatives"] == 8
    assert len(json.loads((out / "history.json").read_text())) == 3 and len(json.loads((out / "samples.json").read_text())) == 2
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    paths = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id)}
    assert {"scenes", "sft_samples.json", "model"} <= paths
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "scenes")] == ["scenes/scenes.png"]
    return out


def test_a_killed_viskg_rl_run_resumes_bit_for_bit(sft_dir, tmp_path):
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, viskg=micro_viskg())
    history = kill_resume_and_compare(*roots, "viskg_rl", ["--in", f"model={sft_dir}"], kill_at=2, in_process=True, resumed_steps=1)
    assert len(history) == 3 and all({"reward_accuracy", "reward_format", "reward_compactness", "varied_accuracy"} <= set(h) for h in history)
    assert (roots[0] / "outputs" / "viskg_rl" / "scenes" / "scenes.png").is_file()


def test_the_claim_experiment_runs_through_the_harness_on_a_micro_budget(tmp_path, monkeypatch):
    """experiments/viskg_gdpo_vs_grpo.py under the claims harness (2 seeds, 1 RL step, micro sizes, no MLflow): per seed
    the arms' table, per claimed difference both sides' values, an interval and a verdict."""
    out = tmp_path / "out.json"
    results = claim_in_process(monkeypatch, tmp_path, "viskg_gdpo_vs_grpo", "viskg_gdpo_vs_grpo",
                               ["--steps", "1", "--micro", "--no-mlflow", "--seeds", "2", "--json", str(out)])
    assert json.loads(out.read_text())["seeds"] == [0, 1] and len(results["comparisons"]) == 3
    for seed in results["per_seed"]:
        assert [r["arm"] for r in seed["table"]] == ["gdpo", "grpo", "caption_gdpo"]  # the script's ARMS
    for c in results["comparisons"]:
        assert len(c["better_values"]) == 2 and is_verdict(c["verdict"])


def test_the_claims_rl_runs_had_a_non_degenerate_signal():
    """The measured claim (experiments/results/viskg_gdpo_vs_grpo.json): on every seed the SFT start answers above
    chance's floor of 0 and below 1, and in every RL arm the accuracy reward varied inside some groups (a non-zero
    advantage for the method to act on)."""
    results = json.loads((REPO / "experiments" / "results" / "viskg_gdpo_vs_grpo.json").read_text())
    assert len(results["per_seed"]) >= 3
    for seed in results["per_seed"]:
        for arm, data in seed["arms"].items():
            assert 0 < data["sft"]["accuracy"] < 1, arm
            assert data["varied_accuracy_mean"] > 0, arm
