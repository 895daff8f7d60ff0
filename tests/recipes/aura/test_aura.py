"""AURA on the market sandbox end to end at micro size: PPO (rl.preset ppo, reward `aura`) from params.yaml through the
rl stage, its history (what the stage logs to MLflow every step) holding the score, its two factors and each tool's
share of the calls, resumed bit for bit after a kill; and the claim script (experiments/aura_ppo.py) through the
claims harness."""

from __future__ import annotations

import json

import torch

from helpers import claim_in_process, copy_outputs, fork_safe_params, kill_resume_and_compare

MARKET = {
    "task": {"name": "market", "n_train": 40, "n_heldout": 8},
    "model": {"hidden_size": 32, "intermediate_size": 64, "layers": 1, "max_positions": 64},
    "sft": {"steps": 15, "batch_size": 16, "n_examples": 0, "log_every": 5, "warmup_steps": 0, "lr": 0.01},
    "rl": {"preset": "ppo", "steps": 2, "checkpoint_every": 1, "prompts_per_step": 2, "group_size": 3, "max_new_tokens": 24, "warmup_steps": 0,
           "rewards": [{"name": "aura", "weight": 1.0}, {"name": "aura_direction", "weight": 0.0}, {"name": "aura_magnitude", "weight": 0.0}],
           "critic": {"path": None, "lr": 0.0005, "warmup_steps": 1}},
}


def _start(root) -> None:
    """outputs/data and outputs/sft of a micro market run, made in this process (the data and sft stages have tests of their
    own; here a few SFT steps only so that some episodes call tools)."""
    from posttrain import resolve
    from posttrain.data import write_examples
    from posttrain.models import build_tiny, save_pretrained, train_char_tokenizer
    from posttrain.tasks import build_task
    from posttrain.trainers.sft import train_sft

    cfg = resolve.load(root / "params.yaml", [])
    task = build_task(cfg.task)
    splits = task.splits(0)
    (root / "outputs" / "data").mkdir(parents=True)
    for name, rows in splits.items():
        write_examples(root / "outputs" / "data" / f"{name}.jsonl", rows)
    torch.manual_seed(0)
    tok = train_char_tokenizer([task.alphabet()])
    model = build_tiny(cfg.model, tok)
    train_sft(model, tok, splits["train"], cfg.sft, 0, on_log=lambda s, m: None)
    save_pretrained(model, tok, root / "outputs" / "sft" / "model")


def test_market_ppo_from_params_logs_the_score_and_tool_shares_and_resumes_after_a_kill(tmp_path):
    start = tmp_path / "start"
    start.mkdir()
    fork_safe_params(start, **MARKET)
    _start(start)
    roots = []
    for name in ("straight", "resumed"):
        copy_outputs(start, tmp_path / name)  # makes the directory
        fork_safe_params(tmp_path / name, **MARKET)
        roots.append(tmp_path / name)
    history = kill_resume_and_compare(*roots, "rl", [], kill_at=1, in_process=True)
    assert len(history) == 2 and history[0]["critic_warmup"] == 1.0 and "value/explained_variance" in history[-1]
    for row in history:
        assert {"reward/aura_mean", "reward/aura_direction_mean", "reward/aura_magnitude_mean"} <= set(row)
        assert abs(sum(row[f"tools/share_{t}"] for t in ("price", "volume", "rel", "market")) - 1.0) < 1e-9 or row["tools/calls_per_episode"] == 0
    assert (roots[0] / "outputs" / "rl" / "critic").is_dir()  # PPO's critic is trained and saved with the policy


def test_the_claim_script_runs_through_the_harness(tmp_path, monkeypatch):
    """The micro run (its numbers are meaningless). Its MLflow path is `_common.log_arm`, the one every claim script
    uses (tests/smoke/test_experiments.py checks it), so this run skips it."""
    out = tmp_path / "aura.json"
    claim = claim_in_process(monkeypatch, tmp_path, "aura_ppo", "aura_ppo", ["--micro", "--steps", "1", "--seeds", "1", "--no-mlflow", "--json", str(out)])
    assert json.loads(out.read_text())["claim"] == "aura_ppo" and claim["command"].startswith(".venv/bin/python experiments/aura_ppo.py ")
    assert {c["metric"] for c in claim["comparisons"]} == {"score", "directional_accuracy", "magnitude_agreement"}
    (seed,) = claim["per_seed"]
    assert {r["arm"] for r in seed["table"]} == {"sft", "ppo", "analyst"} and 0.0 <= seed["informative_groups"] <= 1.0
    analyst = next(r for r in seed["table"] if r["arm"] == "analyst")
    assert analyst["format_rate"] == 1.0 and abs(sum(analyst[f"share_{t}"] for t in ("price", "volume", "rel", "market")) - 1.0) < 1e-9
