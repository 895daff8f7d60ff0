"""The reward-model and preference claim experiments run end to end on a micro budget through the claims harness
(2 seeds) and write their JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO, is_verdict

TRM_MICRO = ["--set", "reward_model.options.trm.rl_steps=1", "--set", "reward_model.options.trm.pairs_per_step=2",
             "--set", "reward_model.options.trm.group_size=2"]
EXPECTED = {
    # trm_disjoint is left out (the same code path as bt_disjoint, and a TRM is the slowest part)
    "reward_model_rl": ({"bt", "trm", "verifier", "bt_disjoint"}, ["--arms", "bt,trm,verifier,bt_disjoint", "--set", "reward_model.steps=3", "--set", "reward_model.n_pairs=30",
                                                    "--set", "reward_model.n_heldout_pairs=10", *TRM_MICRO]),
    "gm_dpo_flexbench": ({"dpo", "gm_dpo"}, ["--sft-stop-gpa", "-1000"]),  # any GPA reaches -1000: the SFT stops at its first check
    "abc_align_pseudo_labels": ({"pseudo_only", "gold_only", "abc_align", "ppi"}, ["--gold", "8"]),
    "glime_vs_naive": ({"naive", "naive_paraphrase", "glime"}, ["--edits", "2"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_experiment_runs_and_writes_json(name, tmp_path):
    arms, extra = EXPECTED[name]
    out = tmp_path / "out.json"
    env = {"POSTTRAIN_EXP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, str(REPO / "experiments" / f"{name}.py"), "--steps", "2", "--micro", "--seeds", "2", "--json", str(out), "--no-mlflow", *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=400, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    claim = json.loads(out.read_text())
    assert claim["claim"] == name and claim["seeds"] == [0, 1] and claim["comparisons"]
    assert all(len(c["worse_values"]) == 2 and is_verdict(c["verdict"]) for c in claim["comparisons"])
    for data in claim["per_seed"]:
        assert data["claim"] == name and data["steps"] == 2 and set(data["arms"]) == arms and data["table"]
        if name == "gm_dpo_flexbench":
            assert data["sft_steps"] == 5 and data["sft_stop_gpa"] == -1000
        if name == "reward_model_rl":  # each reward model's pick among 8 SFT samples, between a random pick and the oracle's
            assert {"bt_pick_accuracy", "trm_pick_accuracy"} <= set(data["best_of_n"]["same"]) and "bt_pick_accuracy" in data["best_of_n"]["disjoint"]
            for picks in data["best_of_n"].values():
                assert 0 <= picks["random_pick_accuracy"] <= picks["oracle_accuracy"] <= 1 and picks["bt_pick_accuracy"] <= picks["oracle_accuracy"]
            # a disjoint reward model saw no RL prompt in its training pairs; a same-prompt one saw only RL prompts
            overlap = data["rm_prompt_overlap"]
            assert set(overlap) == {"bt_same", "trm_same", "bt_disjoint"}
            for rm, o in overlap.items():
                assert o["rm_pair_prompts"] > 0 and o["rm_pair_prompts_in_rl"] == (0 if rm.endswith("_disjoint") else o["rm_pair_prompts"])
            assert {r["arm"]: r["rm_prompts"] for r in data["table"]} == {"bt": "same", "trm": "same", "verifier": "-", "bt_disjoint": "disjoint"}
        if name == "abc_align_pseudo_labels":  # PPI is the same correction with alpha held at 1 on every step
            assert data["arms"]["ppi"]["alpha_curve"] and set(data["arms"]["ppi"]["alpha_curve"]) == {1.0}
