"""Every stage through its CLI on the micro config: outputs, metrics.json, and one MLflow run each."""

from __future__ import annotations

import json

import mlflow
import pytest

from helpers import copy_outputs, micro_params, posttrain


def test_data_stage_writes_validated_disjoint_splits(workdir):
    result = posttrain("data", cwd=workdir)
    out = workdir / "outputs" / "data"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == json.loads(result.stdout)
    assert metrics["n_train"] == 200 and metrics["n_heldout"] == 40
    report = json.loads((out / "validation.json").read_text())
    assert report["success"] and all(c["success"] for c in report["checks"])
    train = {json.loads(line)["prompt"] for line in (out / "train.jsonl").read_text().splitlines()}
    heldout = {json.loads(line)["prompt"] for line in (out / "heldout.jsonl").read_text().splitlines()}
    assert len(train) == 200 and len(heldout) == 40 and not train & heldout
    assert not list((workdir / "outputs").glob(".*")), "staging directories left behind"


def test_sft_rl_eval_chain_and_mlflow_runs(pipeline_outputs, tmp_path):
    copy_outputs(pipeline_outputs, tmp_path)
    (tmp_path / "params.yaml").write_text((pipeline_outputs / "params.yaml").read_text())
    for name in ("sft", "rl"):
        out = pipeline_outputs / "outputs" / name
        assert (out / "model" / "config.json").is_file() and (out / "model" / "tokenizer.json").is_file()
        assert "checkpoints" not in {p.name for p in out.iterdir()}, "checkpoints are removed once the stage succeeds"
    history = json.loads((pipeline_outputs / "outputs" / "rl" / "history.json").read_text())
    assert len(history) == 4
    for key in ("reward/correctness_mean", "reward/format_std", "accuracy", "loss", "clip_fraction", "entropy", "tokens_per_s"):
        assert key in history[0]

    result = posttrain("eval", "--in", "model=outputs/sft", "--out", "outputs/eval/sft", cwd=tmp_path)
    metrics = json.loads(result.stdout)
    assert 0.0 <= metrics["greedy_accuracy"] <= 1.0 and 0.0 <= metrics["sampled_accuracy"] <= 1.0
    assert metrics["n_prompts"] == 40
    samples = (tmp_path / "outputs" / "eval" / "sft" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 5 and {"prompt", "answer", "completion", "correct"} <= set(json.loads(samples[0]))

    mlflow.set_tracking_uri(f"sqlite:///{pipeline_outputs / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["posttrain"], output_format="list")
    by_stage = {run.data.tags["stage"]: run for run in runs}
    assert set(by_stage) == {"data", "sft", "rl", "eval"}
    rl = by_stage["rl"]
    assert rl.info.status == "FINISHED"
    assert rl.data.tags["launcher"] == "cli" and rl.data.tags["objective"] == "grpo+clip" and rl.data.tags["git_sha"]
    assert rl.data.params["rl.group_size"] == "4" and rl.data.params["model.hidden_size"] == "32"
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(rl.info.run_id, "reward/correctness_mean")) == 4
    artifacts = {a.path for a in client.list_artifacts(rl.info.run_id)}
    assert {"model", "reward_curve.png", "rollout_samples.json"} <= artifacts


def test_registry_lists_every_registry(workdir):
    listing = json.loads(posttrain("registry", "--json", cwd=workdir).stdout)
    assert {"advantages", "losses", "loss_aggregations", "rewards", "tasks", "stages"} <= set(listing)
    assert "grpo" in listing["advantages"] and "clip" in listing["losses"]
    assert set(listing["stages"]) >= {"data", "sft", "rl", "eval"}
    text = posttrain("registry", cwd=workdir).stdout
    advantages_line = next(line for line in text.splitlines() if line.startswith("advantages: "))
    assert "grpo" in advantages_line.removeprefix("advantages: ").split(", ")


VARIANTS = {
    "k3 KL to the reference, sequence-mean": ["--set", "rl.beta=0.04", "--set", "rl.loss_agg=seq_mean"],
    "LoRA, batch std, two epochs per batch": ["--set", "model.lora.r=4", "--set", "rl.std_scaling=batch", "--set", "rl.epochs_per_batch=2"],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rl_variants_run_and_report_their_terms(variant, pipeline_outputs, tmp_path):
    copy_outputs(pipeline_outputs, tmp_path)
    micro_params(tmp_path)
    posttrain("rl", *VARIANTS[variant], cwd=tmp_path)
    history = json.loads((tmp_path / "outputs" / "rl" / "history.json").read_text())
    assert len(history) == 4
    if "beta" in " ".join(VARIANTS[variant]):
        assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6), "the policy starts equal to its reference"
        assert history[-1]["kl"] > 1e-9, "after three updates the policy's rollouts differ from the reference's"
    else:
        assert "kl" not in history[0], "no reference model without a KL term"
