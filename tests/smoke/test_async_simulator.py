"""experiments/async_simulator.py: its version tagging against a brute-force count, and a micro run of the study
(few workers, few updates) whose figures are not degenerate."""

from __future__ import annotations

import bisect
import importlib.util
import json
import random
import sys

import pytest

from helpers import REPO
from posttrain.rollout.pool import Group, MaxStalenessOptions, PACEOptions, pool_policies


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("async_simulator", REPO / "experiments" / "async_simulator.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_decode_versions_match_a_brute_force_count(sim):
    rng = random.Random(0)
    for _ in range(200):
        arrivals = sorted(rng.uniform(0, 30) for _ in range(rng.randint(0, 6)))
        start, n, step = rng.uniform(0, 20), rng.randint(1, 60), rng.choice([0.1, 0.25, 0.7])
        brute = [bisect.bisect_right(arrivals, start + (k + 1) * step) for k in range(n)]
        assert sim.decode_versions(start, n, step, arrivals) == brute


def test_group_profile_matches_the_tensor_functions():
    from posttrain.rollout.pool import naive_generation_staleness, prefix_aware_generation_staleness
    rng = random.Random(1)
    for _ in range(20):
        rows = [sorted(rng.randint(0, 5) for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(1, 4))]
        g = Group(0, tuple(map(tuple, rows)), tuple(r[-1] + rng.randint(0, 1) for r in rows))
        versions, mask, v_end = g.tensors()
        gp, gn, _, oldest = g.profile
        assert gp == pytest.approx(float(prefix_aware_generation_staleness(versions, mask, v_end).mean()))
        assert gn == pytest.approx(float(naive_generation_staleness(versions, mask, v_end).mean()))
        assert oldest == min(min(r) for r in rows)


def test_micro_study_has_a_real_signal(sim):
    model = sim.CostModel(workers=16, group_size=4, batch_groups=2, decode_step=0.02, median_tokens=40.0,
                          length_sigma=0.8, max_tokens=200, update=1.0, sync=0.1)
    policies = {"none": pool_policies.get("none")(),
                "max_staleness": pool_policies.get("max_staleness")(MaxStalenessOptions(cap=2)),
                "pace": pool_policies.get("pace")(PACEOptions(kappa=1.0, rho=1.0, beta_g=1.0, cap=0, order="fifo"))}
    runs = {name: sim.simulate(model, policy, updates=12, seed=0) for name, policy in policies.items()}
    # 16 workers outpace the trainer: the unfiltered pool grows stale, PACE rejects and trains on fresher groups
    assert runs["none"]["rejected_share"] == 0.0 and runs["none"]["W_mean"] > 1.0
    assert runs["pace"]["rejected_share"] > 0.0 and runs["pace"]["E_mean"] < runs["none"]["E_mean"]
    assert runs["max_staleness"]["rejected_share"] > 0.0
    assert 0.0 < runs["pace"]["Gp_mean"] < runs["pace"]["Gn_mean"]  # rollouts do span refreshes
    assert all(abs(sum(r["E_hist"].values()) - 1.0) < 1e-9 for r in runs.values())
    # sync on the same cluster: nothing stale, the trainer blocked on every batch, 2 of the 16 workers busy
    sync = sim.simulate(model, None, updates=12, seed=0)
    assert sync["E_mean"] == 0.0 and 0.0 < sync["trainer_idle_share"] < 1.0
    assert runs["pace"]["groups_per_s"] > sync["groups_per_s"] and runs["pace"]["trainer_idle_share"] < sync["trainer_idle_share"]


def test_main_writes_intervals_and_verdicts(sim, tmp_path, monkeypatch):
    out = tmp_path / "sim.json"
    monkeypatch.setattr(sys, "argv", ["async_simulator.py", "--workers", "2", "12", "--updates", "5", "--batch-groups", "2",
                                      "--median-tokens", "30", "--max-tokens", "120", "--update", "1.0", "--json", str(out)])
    sim.main()
    data = json.loads(out.read_text())
    assert set(data["results"]) == {f"{w}/{p}" for w in (2, 12) for p in ("sync", "none", "max_staleness", "pace")}
    assert "12: sync groups_per_s - pace groups_per_s < 0" in data["verdicts"]
    summary = data["results"]["12/pace"]["summary"]["E_mean"]
    assert len(data["results"]["12/pace"]["seeds"]) == 3 and summary["low"] <= summary["mean"] <= summary["high"]
    assert {v["verdict"] for v in data["verdicts"].values()} <= {"reproduced", "contradicted", "inconclusive"}
