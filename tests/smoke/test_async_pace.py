"""experiments/async_pace.py (issue 17's claim: sync vs unfiltered async vs max_staleness vs PACE): its scoring of
the weight copies (equal wall clock, time to a target, equal generated groups) on hand-made copies, and a micro run
under the claims harness whose arms are fed a real signal."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from helpers import REPO, claim_in_process


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("async_pace_smoke", REPO / "experiments" / "async_pace.py")
    sys.path.insert(0, str(REPO / "experiments"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(REPO / "experiments"))


def arm(wall: float, groups: float, copies: list[tuple[int, float, float, float]]) -> dict:
    return {"wall_s": wall, "groups_generated": groups, "gen_wait_s": 1.0, "rejected_share": 0.0, "token_lag_mean": 0.0,
            "advantage_abs_mean": 0.5, "copies": [{"step": s, "seconds": t, "groups": g, "accuracy": a} for s, t, g, a in copies]}


def test_scoring_by_hand(script):
    arms = {"fast": arm(10.0, 40.0, [(0, 0.0, 0, 0.2), (1, 4.0, 20, 0.3), (2, 10.0, 40, 0.6)]),
            "slow": arm(20.0, 80.0, [(0, 0.0, 0, 0.2), (1, 9.0, 40, 0.25), (2, 20.0, 80, 0.4)])}
    equal_time, equal_groups, target, rows = script.score(arms, 0.2, 0.5)
    assert (equal_time, equal_groups) == (10.0, 40.0) and target == pytest.approx(0.4)  # halfway from 0.2 to the best, 0.6
    fast, slow = rows
    assert (fast["acc_equal_time"], slow["acc_equal_time"]) == (0.6, 0.25)  # slow's last copy by 10 s is at 9 s
    assert (fast["acc_equal_groups"], slow["acc_equal_groups"]) == (0.6, 0.25)
    assert (fast["time_to_target"], fast["reached_target"], slow["time_to_target"], slow["reached_target"]) == (10.0, 1.0, 20.0, 1.0)
    arms["slow"]["copies"][-1]["accuracy"] = 0.3  # never reaches 0.4: censored at its wall clock
    assert script.score(arms, 0.2, 0.5)[3][1]["reached_target"] == 0.0
    assert script.claim_of(["--schedule", "deterministic"]) == "async_pace_deterministic" and script.claim_of([]) == "async_pace"


def test_micro_claim_run_and_rescore(monkeypatch, tmp_path, script):
    out = tmp_path / "claim.json"
    claim = claim_in_process(monkeypatch, tmp_path, "async_pace", "async_pace",
                             ["--micro", "--steps", "3", "--every", "1", "--seeds", "1", "--no-mlflow", "--json", str(out)])
    (data,) = claim["per_seed"]
    assert set(data["arms"]) == {"sync", "async_none", "async_max_staleness", "async_pace"} and len(claim["comparisons"]) == 9
    rows = {r["arm"]: r for r in data["table"]}
    assert all(r["advantage_abs_mean"] > 0 for r in rows.values())  # every arm trains on a non-zero advantage
    assert rows["sync"]["token_lag_mean"] == 0 and rows["sync"]["groups_generated"] == 3 * 4
    assert all(len(a["copies"]) == 4 and a["copies"][-1]["seconds"] <= a["wall_s"] + 1e-9 for a in data["arms"].values())
    assert all(rows[a]["groups_generated"] >= 3 * 4 for a in rows)  # the workers generate ahead of the trainer
    monkeypatch.setattr(sys, "argv", ["async_pace.py"])
    script.rescore(out, 0.25)
    again = json.loads(out.read_text())
    assert again["per_seed"][0]["target_accuracy"] <= data["target_accuracy"] + 1e-9 and "--target-frac 0.25" in again["rescored"]
