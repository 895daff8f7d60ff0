"""A sweep's arms (presets or advantages, each once), the tags and names of its MLflow runs, and `compare` scoped
to the sweep run that called it."""

from __future__ import annotations

import json

import pytest

from helpers import REPO
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.orchestration.preflight import resolve_config
from posttrain.orchestration.sweep import arm_names, arm_overrides, check_arms
from posttrain.stages.compare import comparison_rows
from posttrain.tracking import objective_tags, run_name

PARAMS = REPO / "params.yaml"


def test_a_preset_arm_runs_with_every_key_of_its_preset_and_an_advantage_arm_with_the_rest():
    base = resolve.load(PARAMS)
    dr_grpo = resolve_config(PARAMS, [], arm_overrides("dr_grpo"))
    assert base.rl.loss_agg == "token_mean"  # the default the old sweep left dr_grpo with
    assert (dr_grpo.rl.advantage, dr_grpo.rl.loss_agg, dr_grpo.rl.preset) == ("dr_grpo", "token_sum_norm", "dr_grpo")
    dapo = resolve_config(PARAMS, [], arm_overrides("dapo"))
    assert dapo.rl.dynamic_sampling and dapo.rl.clip_eps_high == 0.28 and "overlong" in [r.name for r in dapo.rl.rewards]
    # an advantage arm over a run that set a preset: the preset is dropped, its advantage replaced
    rloo = resolve_config(PARAMS, [json.dumps({"rl.preset": "dapo"})], arm_overrides("rloo"))
    assert (rloo.rl.advantage, rloo.rl.preset) == ("rloo", None)
    assert {"grpo", "rloo", "dr_grpo", "dapo", "gspo"} <= set(arm_names())


def test_arms_are_known_and_unique_in_params_and_at_preflight():
    with pytest.raises(UserError, match="'rloo' is listed twice"):
        check_arms(["rloo", "rloo"])
    with pytest.raises(UserError, match="'nope' is neither a preset nor an advantage"):
        check_arms(["grpo", "nope"])
    with pytest.raises(UserError, match="listed twice"):
        resolve.load(PARAMS, ["orchestration.sweep.objectives=[grpo, grpo]"])


def test_only_rl_trained_runs_carry_an_objective_and_names_say_what_a_run_is():
    from posttrain.stages import stages

    # the flag is declared where each stage registers, and only the stages that train with the rl settings set it
    flagged = {name for name in stages.names() if stages.entry(name).meta.get("rl_objective")}
    assert flagged == {"rl", "rl_rm", "distill"}, flagged
    cfg = resolve.load(PARAMS)
    assert objective_tags(cfg, False) == {}  # sft, data: shared by every arm of a sweep
    assert objective_tags(cfg, None) == {"objective": "grpo+clip", "arm": "grpo"}  # an experiment's arm keeps them
    tags = objective_tags(cfg, True)
    assert tags == {"objective": "grpo+clip", "arm": "grpo"}
    assert run_name(cfg, "rl", tags, True) == "rl grpo+clip seed 0"
    assert run_name(cfg, "respo_vs_clip/clip", tags, None) == "respo_vs_clip/clip"  # an experiment names its own runs
    dr = resolve_config(PARAMS, [], arm_overrides("dr_grpo"))
    assert run_name(dr, "rl", objective_tags(dr, True), True) == "rl dr_grpo+clip seed 0"
    dapo = resolve_config(PARAMS, [], arm_overrides("dapo"))
    assert run_name(dapo, "rl", objective_tags(dapo, True), True) == "rl dapo (grpo+clip) seed 0"  # a preset says more than its parts
    assert run_name(cfg, "eval", {"input.model.stage": "sft"}, False) == "eval sft"
    assert run_name(cfg, "eval", {"input.model.stage": "rl", "objective": "rloo+clip", "arm": "rloo"}, False) == "eval rl rloo"
    assert run_name(cfg, "sft", {}, False) == "sft"


def test_compare_reads_the_arms_of_its_own_sweep_run_only(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the same search filters as SQLite, without its migrations
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    experiment = client.create_experiment("posttrain", artifact_location=(tmp_path / "art").as_uri())

    def rl_run(arm: str, pipeline_run: str, reward: float) -> str:
        run = client.create_run(experiment, tags={"stage": "rl", "arm": arm, "objective": f"{arm}+clip", "pipeline_run": pipeline_run})
        client.log_metric(run.info.run_id, "reward/total_mean", reward, step=0)
        client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id

    ours = {"grpo": rl_run("grpo", "sweep-1", 0.5), "rloo": rl_run("rloo", "sweep-1", 0.25)}
    rl_run("dr_grpo", "text-7", 0.9)  # an unrelated text run, later: the old compare listed it as an arm
    rl_run("grpo", "sweep-2", 0.1)  # a later sweep's arm of the same name
    rows, curves = comparison_rows(client, experiment, "sweep-1")
    assert [(r["arm"], r["rl_run_id"], r["final_reward"]) for r in rows] == [("grpo", ours["grpo"], 0.5), ("rloo", ours["rloo"], 0.25)]
    assert set(curves) == {"grpo", "rloo"}
    everything, _ = comparison_rows(client, experiment)  # by hand (no pipeline run): the latest run of each arm
    assert [(r["arm"], r["final_reward"]) for r in everything] == [("dr_grpo", 0.9), ("grpo", 0.1), ("rloo", 0.25)]
