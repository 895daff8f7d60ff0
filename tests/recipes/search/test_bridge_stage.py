"""The bridge stage on a micro search corpus: per-iteration metrics and the example-episodes table (question, queries,
retrieved passages, answer, gold) in MLflow, the policy and the trained retriever written; one-line errors for the
wrong task and an untrainable retriever; a bit-for-bit resume after a SIGKILL."""

from __future__ import annotations

import copy
import json

import pytest

from helpers import repo_params, fork_safe_params, kill_resume_and_compare, micro_params


def micro_sections(**bridge) -> dict:
    params = repo_params()
    task = copy.deepcopy(params["task"])
    task.update(name="search", n_train=4, n_heldout=2)
    task["options"]["search"].update(people=6, companies=3, cities=3, kinds=["employer"], top_k=1, candidates=6,
                                     max_calls=2, cost_per_call=0.2)
    model = {"hidden_size": 32, "intermediate_size": 64, "layers": 1, "heads": 2, "kv_heads": 1, "max_positions": 256}
    return {"task": task, "model": model, "bridge": {**params["bridge"], "iterations": 2, "prompts_per_step": 2, "group_size": 3, "max_new_tokens": 80,
                                                      "sft_steps": 40, "sft_lr": 0.01, "retriever_warmup_steps": 3, "example_episodes": 2,
                                                      "log_every": 1, "checkpoint_every": 1, **bridge}}


def test_bridge_stage_logs_metrics_episodes_and_writes_both_levels(tmp_path):
    import mlflow

    from posttrain.resolve import load
    from posttrain.stages import execute

    out = tmp_path / "outputs" / "bridge"
    metrics = execute("bridge", load(micro_params(tmp_path, **micro_sections())), {}, out)
    assert {"heldout_em", "heldout_f1", "heldout_recall", "heldout_em_before", "train_reward_last"} <= set(metrics) and metrics["order_ok"] == 1.0
    history = json.loads((out / "history.json").read_text())
    assert len(history) == 2
    # a non-degenerate signal: rollouts that differ in reward within a step (GRPO advantages not all zero), searches made
    assert any(h["w_hat_spread"] > 0 for h in history) and all(h["calls"] > 0 for h in history)
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {"question", "queries", "retrieved", "answer", "gold"} == set(rows[0]) and rows[0]["retrieved"]
    assert (out / "model" / "model.safetensors").is_file() and (out / "retriever" / "model.safetensors").is_file()
    assert json.loads((out / "retriever" / "retriever.json").read_text()) == {"name": "dual_encoder", "path": None, "trained": True}
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(run_id, "reward")) == 2 and len(client.get_metric_history(run_id, "gamma")) == 2
    assert "example_episodes.json" in [a.path for a in client.list_artifacts(run_id)]


@pytest.mark.parametrize("override, message", [
    ({"task": {"name": "arithmetic"}}, "stage bridge runs in the search environment: set task.name=search"),
    ({"retriever": "bm25"}, "bridge.arm bridge trains the retriever, and bridge.retriever bm25 has no parameters"),
])
def test_bridge_stage_user_errors_are_one_line(tmp_path, override, message):
    from posttrain.errors import UserError
    from posttrain.resolve import load
    from posttrain.stages import execute

    sections = micro_sections()
    if "task" in override:
        sections["task"]["name"] = override["task"]["name"]
    else:
        sections["bridge"]["retriever"] = override["retriever"]
    out = tmp_path / "outputs" / "bridge"
    with pytest.raises(UserError, match=message) as error:
        execute("bridge", load(fork_safe_params(tmp_path, **sections)), {}, out)
    assert "\n" not in str(error.value) and not out.exists()


def test_a_killed_bridge_run_resumes_bit_for_bit(tmp_path):
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, **micro_sections(group_size=2))
    # killed after iteration 1's checkpoint: the resume runs iteration 2 only (no warm start), its retriever and policy steps
    assert len(kill_resume_and_compare(*roots, "bridge", [], kill_at=1, in_process=True, resumed_steps=2)) == 2
