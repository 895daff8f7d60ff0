"""The asct stage on a micro search corpus: metrics, history, held-out episodes (an MLflow table of queries, passages
and answers), a bit-for-bit resume after a SIGKILL; and the claim experiment through the harness on a micro budget."""

from __future__ import annotations

import copy
import json


from helpers import repo_params, REPO, claim_in_process, fork_safe_params, kill_resume_and_compare, micro_params


def micro_sections() -> dict:
    params = repo_params()
    task = copy.deepcopy(params["task"])
    task.update(name="search", n_train=30, n_heldout=10)
    task["options"]["search"].update(people=20, companies=5, cities=5, cost_per_call=0.1, reward="f1")
    asct = {**params["asct"], "iterations": 3, "episodes": 3, "n_sim": 3, "n_heldout": 5, "example_episodes": 2, "log_every": 1, "epochs": 1,
            "checkpoint_every": 1, "lm": {**params["asct"]["lm"], "sft_steps": 2, "sft_batch_size": 4}}
    model = {"hidden_size": 16, "intermediate_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "max_positions": 512}  # the lm actor
    return {"task": task, "asct": asct, "model": model}


def test_asct_stage_logs_episodes_and_figures(tmp_path):
    import mlflow

    from posttrain.resolve import load
    from posttrain.stages import execute

    out = tmp_path / "outputs" / "asct"
    metrics = execute("asct", load(micro_params(tmp_path, **micro_sections())), {}, out)
    assert {"heldout_utility", "heldout_f1", "heldout_calls", "heldout_recall", "aux_tokens"} <= set(metrics) and metrics["aux_tokens"] > 0
    history = json.loads((out / "history.json").read_text())
    assert len(history) == 3 and all(h["aux_tokens"] > 0 and "q_spread" in h for h in history)
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and {"question", "queries", "passages", "answer", "gold", "utility"} <= set(rows[0])
    assert (out / "model" / "model.safetensors").is_file() and (out / "model" / "tokenizer.json").is_file()  # the LM actor
    assert json.loads((out / "model" / "actor.json").read_text())["actor"] == "lm"
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(run_id, "train_utility")) == 3
    assert "example_episodes.json" in [a.path for a in client.list_artifacts(run_id)]


def test_a_killed_asct_run_resumes_bit_for_bit(tmp_path):
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, **micro_sections())
    assert len(kill_resume_and_compare(*roots, "asct", [], kill_at=2, in_process=True, resumed_steps=1)) == 3


def test_the_asct_claim_runs_through_the_harness_on_a_micro_budget(tmp_path, monkeypatch):
    results = claim_in_process(monkeypatch, tmp_path, "asct_vs_ppo", "asct_vs_ppo",
                               ["--steps", "1", "--micro", "--no-mlflow", "--seeds", "2", "--set", "asct.eval_samples=2", "--json", str(tmp_path / "o.json")])
    from _claims import COMPARISONS

    assert len(results["comparisons"]) == len(COMPARISONS["asct_vs_ppo"])
    for seed in results["per_seed"]:
        arms = {r["arm"]: r for r in seed["table"]}
        assert set(arms) == {"asct", "asct_agent_uct", "trajectory", "mc_value"} and arms["trajectory"]["aux_tokens"] == 0
        assert arms["asct"]["aux_tokens"] > 0 and arms["mc_value"]["aux_tokens_per_visit"] >= seed["mc_token_budget"] > 0
        assert all(0 <= r["sampled_f1"] <= 1 and "sampled_utility" in r for r in arms.values())  # the sampled held-out rows' figures
    assert {p["seed"] for p in results["premises"]} == {0, 1}  # the tree policies' search gap, measured on each seed


def test_the_measured_claim_fed_every_arm_a_learning_signal():
    """experiments/results/asct_vs_ppo.json: 3 seeds; on each the tree arms spent auxiliary tokens, the value baseline
    spent at least ASCT's per visited state (matched budget) and within 15% of its total, trajectory PPO none, and
    every arm's training utility rose from its first tenth of rounds to its last (each learned from its credit)."""
    results = json.loads((REPO / "experiments" / "results" / "asct_vs_ppo.json").read_text())
    assert len(results["per_seed"]) >= 3
    for seed in results["per_seed"]:
        arms = {r["arm"]: r for r in seed["table"]}
        assert arms["asct"]["aux_tokens"] > 0 and arms["asct_agent_uct"]["aux_tokens"] > 0 and arms["trajectory"]["aux_tokens"] == 0
        assert arms["mc_value"]["aux_tokens_per_visit"] >= seed["mc_token_budget"]
        assert abs(arms["mc_value"]["aux_tokens"] / arms["asct"]["aux_tokens"] - 1) < 0.15
        for arm, curve in seed["train_curve"].items():
            assert curve[-1] > curve[0] + 0.2, arm


def test_the_measured_lm_claim_fed_the_lm_actor_a_tree_signal():
    """experiments/results/asct_lm_vs_ppo.json: 3 seeds with the LM actor; on each the tree's Q_hat differed across a
    visited state's actions in every round, the tree arms spent auxiliary tokens, the value baseline at least ASCT's
    per visited state and in total (within 25%), trajectory PPO none."""
    results = json.loads((REPO / "experiments" / "results" / "asct_lm_vs_ppo.json").read_text())
    assert len(results["per_seed"]) >= 3
    for seed in results["per_seed"]:
        arms = {r["arm"]: r for r in seed["table"]}
        assert seed["actor"] == "lm" and all(r["actor"] == "lm" for r in seed["table"])
        assert min(seed["q_spread"]) > 0 and arms["asct"]["aux_tokens"] > 0 and arms["trajectory"]["aux_tokens"] == 0
        assert arms["mc_value"]["aux_tokens_per_visit"] >= seed["mc_token_budget"]
        assert 1 <= arms["mc_value"]["aux_tokens"] / arms["asct"]["aux_tokens"] < 1.25
