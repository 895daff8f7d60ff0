"""The claim experiments (experiments/*.py) run end to end on a micro budget through the claims harness (2 seeds) and
write their JSON (per seed, the comparisons with intervals and verdicts) and MLflow runs (a parent per claim, a
child per arm x seed)."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import pytest

from helpers import REPO, is_verdict
from posttrain import resolve

EXPECTED = {
    "gdpo_vs_sum": ({"claim", "steps", "distinct", "arms", "table", "distinct_table", "mlflow_runs", "runtime_s", "sft_heldout"},
                    {"sum_then_normalize", "gdpo"}),
    "respo_vs_clip": ({"claim", "steps", "epochs_per_batch", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout"},
                      {"clip", "respo"}),
    "witness_vs_grpo": ({"claim", "steps", "samples", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout"}, {"grpo", "witness_reward", "witness_raw"}),
    "qglas_vs_quality": ({"claim", "steps", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout"}, {"quality_only", "qglas"}),
    "sdrl_strategies": ({"claim", "steps", "samples", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout"}, {"correctness", "sdrl"}),
    "kgpo_vs_hit1": ({"claim", "steps", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout", "start_signal"}, {"hit1", "kgpo"}),
    "flow_gdpo_vs_sum": ({"claim", "steps", "n_heldout_edits", "sft", "arms", "between_rl_arms", "table", "mlflow_runs", "runtime_s"},
                         {"gdpo", "sum_then_normalize"}),
    "audit_selective_control": ({"claim", "steps", "verifier", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout", "start"},
                                {"verifier", "audit_0.1", "audit_0.3"}),
}


# fewer held-out samples than the experiments' defaults (the numbers are meaningless at micro size); the MLflow
# path is the same for every experiment (_common.log_arm), so the sdrl run skips it
EXTRA = {"witness_vs_grpo": ["--samples", "8"], "sdrl_strategies": ["--samples", "2", "--no-mlflow"],
         "kgpo_vs_hit1": ["--samples", "4", "--probe", "8", "--no-mlflow"], "audit_selective_control": ["--samples", "2", "--probe", "8", "--no-mlflow"],
         "flow_gdpo_vs_sum": ["--no-mlflow"]}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_experiment_runs_and_writes_json(name, tmp_path):
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"POSTTRAIN_EXP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin"}
    extra = EXTRA.get(name, [])
    tracking = [] if "--no-mlflow" in extra else ["--tracking-uri", uri]
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / f"{name}.py"), "--steps", "2", "--micro", "--seeds", "2", "--json", str(out), *tracking, *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    claim = json.loads(out.read_text())
    assert claim["claim"] == name and claim["seeds"] == [0, 1] and len(claim["per_seed"]) == 2
    assert claim["command"].startswith(f".venv/bin/python experiments/{name}.py ") and "--seeds 2" in claim["command"]
    check_comparisons(claim, 2)
    keys, arms = EXPECTED[name]
    for data in claim["per_seed"]:
        check_one_seed(name, data, keys, arms)
    if not tracking:
        assert claim["mlflow_parent_run"] is None and all(data["mlflow_runs"] == {} for data in claim["per_seed"])
        return
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claims"])
    parent = runs[runs["tags.mlflow.runName"] == name]
    assert len(parent) == 1 and parent["run_id"].iloc[0] == claim["mlflow_parent_run"]
    children = runs[runs["tags.mlflow.parentRunId"] == claim["mlflow_parent_run"]]
    prefix = f"{name}/format" if name == "gdpo_vs_sum" else name
    assert len(runs) == 1 + 2 * len(arms) and set(children["tags.mlflow.runName"]) == {f"{prefix}/{a}/seed{s}" for a in arms for s in (0, 1)}


def check_comparisons(claim: dict, n_seeds: int) -> None:
    """Each claimed difference has both sides' per-seed values, a paired 95% interval and a verdict."""
    assert claim["comparisons"]
    for c in claim["comparisons"]:
        assert len(c["better_values"]) == len(c["worse_values"]) == n_seeds
        assert c["diff_mean"] == pytest.approx(sum(b - w for b, w in zip(c["better_values"], c["worse_values"])) / n_seeds)
        low, high = c["diff_ci"]
        assert is_verdict(c["verdict"]) and (low <= c["diff_mean"] <= high or low != low)


def check_one_seed(name: str, data: dict, keys: set, arms: set) -> None:
    assert keys <= set(data) and set(data["arms"]) == arms and data["claim"] == name and data["steps"] == 2
    if name == "sdrl_strategies":  # strategy use of held-out samples, before and after each arm
        for arm in data["arms"].values():
            assert {"heldout_success", "distinct_strategies", "strategy_entropy", "share_d", "share_g", "share_r"} <= set(arm["after"])
            assert arm["before"] == data["arms"]["correctness"]["before"]
        # the bonus is recorded from the sdrl arm's own reward column on every step, and only there (at micro size
        # the policy rarely solves an instance, so its value is not asserted here: test_objectives_smoke.py does)
        sdrl, correctness = data["arms"]["sdrl"], data["arms"]["correctness"]
        assert sdrl["bonus_steps"] == data["steps"] and correctness["bonus_steps"] == 0 and correctness["bonus_mean"] == 0.0
        opts = resolve.load(REPO / "params.yaml", []).rl.options_for("sdrl")
        assert 0.0 <= sdrl["bonus_mean"] <= opts.beta_b + opts.beta_w  # the bonus c (beta_b D_b + beta_w D_w), D in [0, 1]
        return
    if name == "audit_selective_control":  # acceptance, correctness and accepted errors before and after each arm, on both prompt sets
        for m in [data["start"], *(a["after"] for a in data["arms"].values())]:
            for where in ("train", "heldout"):
                v, c, e = m[where]["accepted"], m[where]["correct"], m[where]["accepted_error"]
                assert v == pytest.approx(c + e) and 0.0 <= e <= v <= 1.0  # the verifier accepts every correct answer
        assert [r["arm"] for r in data["table"]] == ["start", "verifier", "audit_0.1", "audit_0.3"]
        return
    if name == "flow_gdpo_vs_sum":  # each judge and overall = mean(IA, BP, QP) of the SFT start and both RL arms, same edits
        assert [r["arm"] for r in data["table"]] == ["sft", "gdpo", "sum_then_normalize"] and data["sft"]["overall"] == data["table"][0]["overall"]
        assert all(r["overall"] == pytest.approx((r["ia"] + r["bp"] + r["qp"]) / 3) for r in data["table"])
        # two RL steps move both arms off the SFT model (what the claim's premises measure), and apart
        assert all(a["param_distance_from_sft"] > 0 and a["image_difference_from_sft"] > 0 for a in data["arms"].values())
        assert data["between_rl_arms"]["param_distance"] > 0
        return
    for arm in data["arms"].values():
        assert "greedy_accuracy" in arm["heldout_after"]
    if name == "gdpo_vs_sum":
        assert data["distinct"]["n_groups"] == 2 * 2 * 4  # 2 arms x 2 steps x 4 prompts per step (micro)
        assert all("reward_delta" in a for a in data["arms"].values())
    elif name == "respo_vs_clip":
        assert all({"clip_zero_frac", "respo_floor_frac"} <= set(a["starvation_reuse_passes"]) for a in data["arms"].values())
    elif name == "kgpo_vs_hit1":
        assert all(-1.0 <= a["heldout_after"]["graded"] <= 1.0 for a in data["arms"].values())
        assert 0.0 <= data["start_signal"]["share_graded_differs"] <= 1.0
    elif name == "witness_vs_grpo":
        assert all(0.0 <= a["tv_after"]["tv_mean"] <= 1.0 and a["tv_before"] == data["arms"]["grpo"]["tv_before"] for a in data["arms"].values())
    else:
        assert all("greedy_list_length" in a["heldout_after"] and a["completion_tokens_last_k"] > 0 for a in data["arms"].values())
