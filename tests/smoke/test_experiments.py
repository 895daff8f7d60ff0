"""The claim experiments (experiments/*.py) run end to end on a micro budget and write their JSON + MLflow runs."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import pytest

from helpers import REPO

EXPECTED = {
    "gdpo_vs_sum": ({"claim", "steps", "distinct", "arms", "table", "distinct_table", "mlflow_runs", "runtime_s", "sft_heldout"},
                    {"sum_then_normalize", "gdpo"}),
    "respo_vs_clip": ({"claim", "steps", "epochs_per_batch", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout"},
                      {"clip", "respo"}),
    "witness_vs_grpo": ({"claim", "steps", "samples", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout"}, {"grpo", "witness"}),
    "qglas_vs_quality": ({"claim", "steps", "arms", "table", "mlflow_runs", "runtime_s", "sft_heldout"}, {"quality_only", "qglas"}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_experiment_runs_and_writes_json(name, tmp_path):
    out, uri = tmp_path / "out.json", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"POSTTRAIN_EXP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / f"{name}.py"), "--steps", "3", "--micro", "--json", str(out), "--tracking-uri", uri],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    keys, arms = EXPECTED[name]
    assert keys <= set(data) and set(data["arms"]) == arms and data["claim"] == name and data["steps"] == 3
    for arm in data["arms"].values():
        assert "greedy_accuracy" in arm["heldout_after"]
    if name == "gdpo_vs_sum":
        assert data["distinct"]["n_groups"] == 2 * 3 * 4  # 2 arms x 3 steps x 4 prompts per step (micro)
        assert all("reward_delta" in a for a in data["arms"].values())
    elif name == "respo_vs_clip":
        assert all({"clip_zero_frac", "respo_floor_frac"} <= set(a["starvation_reuse_passes"]) for a in data["arms"].values())
    elif name == "witness_vs_grpo":
        assert all(0.0 <= a["tv_after"]["tv_mean"] <= 1.0 and a["tv_before"] == data["arms"]["grpo"]["tv_before"] for a in data["arms"].values())
    else:
        assert all("greedy_list_length" in a["heldout_after"] and a["completion_tokens_last_k"] > 0 for a in data["arms"].values())
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["claims"])
    assert len(runs) == 2 and set(runs["tags.mlflow.runName"]) == {f"{name}/format/{a}" if name == "gdpo_vs_sum" else f"{name}/{a}" for a in arms}
