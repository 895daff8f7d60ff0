"""The DSP stages on a micro config: maze_data draws the maze and the reward-free data, dsp trains the subgoal flow and
the baselines and runs every arm (a results table, maze and plan PNGs and a GIF in MLflow), resumes bit for bit after a
SIGKILL, refuses data of another maze; the claim script runs through the harness; and the measured claim fed the
method a non-degenerate signal."""

from __future__ import annotations

import copy
import json

import pytest

from helpers import repo_params, REPO, claim_in_process, fork_safe_params, is_verdict, kill_resume_and_compare, micro_params


def micro_dsp() -> dict:
    section = copy.deepcopy(repo_params()["dsp"])
    section["maze"].update(cells=3)
    section["data"].update(trajectories=20, length=12)
    section["eval"].update(pairs=3, min_distance=3, max_steps=6, renders=1)
    section.update(hidden_size=8, layers=1, fourier_bands=1, steps=4, batch_size=16, candidates=2, sampling_steps=2, log_every=1,
                   checkpoint_every=1, guidance_weights=[0.0, 2.0])
    return section


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from posttrain.resolve import load
    from posttrain.stages import execute

    root = tmp_path_factory.mktemp("maze_data")
    metrics = execute("maze_data", load(fork_safe_params(root, dsp=micro_dsp())), {}, root / "outputs" / "maze_data")
    assert metrics["trajectories"] == 20 and metrics["moved_share"] == 1.0 and 0 < metrics["visited_share"] <= 1
    assert (root / "outputs" / "maze_data" / "render" / "maze.png").is_file()
    return root / "outputs" / "maze_data"


def test_dsp_stage_logs_a_results_table_plans_and_a_gif(data_dir, tmp_path):
    import mlflow
    from PIL import Image

    from posttrain.resolve import load
    from posttrain.stages import execute

    out = tmp_path / "outputs" / "dsp"
    metrics = execute("dsp", load(micro_params(tmp_path, dsp=micro_dsp())), {"data": data_dir}, out)
    rows = json.loads((out / "results.json").read_text())
    assert [r["arm"] for r in rows] == ["flat_bc", "value_guided", "dsp_w0", "dsp_w2"]
    assert "flat_bc_subgoal_progress" not in metrics and metrics["dsp_w2_subgoal_free"] >= 0  # flat BC proposes no subgoal
    for label in ("flat_bc", "value_guided", "dsp_w0", "dsp_w2"):
        assert 0.0 <= metrics[f"{label}_success"] <= 1.0 and (out / "plans" / f"{label}_0.png").is_file()
    assert len(json.loads((out / "history.json").read_text())) == 4
    assert Image.open(out / "plans" / "dsp.gif").n_frames > 1
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(run_id, "flow_loss")) == 4
    assert {a.path for a in client.list_artifacts(run_id, "plans")} >= {"plans/dsp.gif", "plans/dsp_w2_0.png"}
    assert "results_table.json" in {a.path for a in client.list_artifacts(run_id)}


def test_a_killed_dsp_run_resumes_bit_for_bit(data_dir, tmp_path):
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, dsp=micro_dsp())
    assert len(kill_resume_and_compare(*roots, "dsp", ["--in", f"data={data_dir}"], kill_at=2, in_process=True, resumed_steps=2)) == 4


def test_data_of_another_maze_and_unreachable_pairs_are_one_clear_error(data_dir, tmp_path):
    from posttrain.errors import UserError
    from posttrain.resolve import load
    from posttrain.stages import execute

    cfg = load(fork_safe_params(tmp_path, dsp=micro_dsp(), pipeline={"seed": 5}))
    with pytest.raises(UserError, match="another maze"):
        execute("dsp", cfg, {"data": data_dir}, tmp_path / "outputs" / "dsp")
    section = micro_dsp()
    section["eval"]["min_distance"] = 99  # no pair of a 7 x 7 maze is that far apart: refused before any update
    with pytest.raises(UserError, match="lower dsp.eval.min_distance"):
        execute("dsp", load(fork_safe_params(tmp_path, dsp=section)), {"data": data_dir}, tmp_path / "outputs" / "dsp")
    assert not (tmp_path / "outputs" / "dsp").exists() and not (tmp_path / "outputs" / ".dsp.partial").exists()


def test_the_claim_script_runs_through_the_harness(tmp_path, monkeypatch):
    out = tmp_path / "dsp.json"
    claim = claim_in_process(monkeypatch, tmp_path, "dsp_vs_baselines", "dsp_vs_baselines",
                             ["--micro", "--steps", "2", "--seeds", "2", "--no-mlflow", "--json", str(out)])
    assert json.loads(out.read_text())["claim"] == "dsp_vs_baselines" and len(claim["comparisons"]) == 5
    for seed in claim["per_seed"]:
        assert {"flat_bc", "value_guided", "dsp_w0", "dsp_w1", "dsp_w2", "dsp_w3"} == {r["arm"] for r in seed["table"]}
    assert all(is_verdict(c["verdict"]) for c in claim["comparisons"])


def test_the_measured_claim_fed_dsp_a_non_degenerate_signal():
    """experiments/results/dsp_vs_baselines.json: on every seed the flow learnt (its loss fell), guidance moved the
    subgoals towards the goal (omega 2 makes more progress than omega 0) and no arm is at 0 or 1 everywhere."""
    results = json.loads((REPO / "experiments" / "results" / "dsp_vs_baselines.json").read_text())
    assert len(results["per_seed"]) >= 3
    for seed in results["per_seed"]:
        rows = {r["arm"]: r for r in seed["table"]}
        assert seed["flow_loss_curve"][-1] < seed["flow_loss_curve"][0]
        assert rows["dsp_w2"]["subgoal_progress"] > rows["dsp_w0"]["subgoal_progress"]
        assert 0.0 < rows["dsp_w2"]["success"] < 1.0
