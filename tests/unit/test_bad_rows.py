"""Data validation reads the whole file and reports every bad row in file order (issue 38, item 2): one line with
the count and the first few, and the full list in a report file next to the (unwritten) output."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import micro_params

GOOD = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "What is 3+3?", "answer": "6"}]
DATASET = ["data", "--set", "task.name=dataset", "--set", "task.options.dataset.path=problems.jsonl", "--out", "outputs/data"]


def stop(monkeypatch, capfd, tmp_path, lines: list[str], tracking: bool = False) -> tuple[int, str]:
    from posttrain.cli import main

    micro_params(tmp_path, tracking={"enabled": tracking})
    (tmp_path / "problems.jsonl").write_text("".join(f"{line}\n" for line in lines))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["posttrain", *DATASET])
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capfd.readouterr().err


def test_rows_2_3_and_4_bad_are_named_in_file_order_in_one_line(tmp_path, monkeypatch, capfd):
    lines = [json.dumps(GOOD[0]), json.dumps({"prompt": "What is 1+1?"}), json.dumps({"prompt": 7, "answer": "7"}),
             '{"prompt": "What is 5+5?", "ans', json.dumps(GOOD[1])]
    code, err = stop(monkeypatch, capfd, tmp_path, lines)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.strip() == (
        "posttrain: error: problems.jsonl: 3 bad rows (all of them in outputs/data.bad_rows.txt): line 2 field 'answer' is missing; "
        "line 3 field 'prompt' must be a string, got number; line 4 not valid JSON (Invalid control character at)"), err
    report = (tmp_path / "outputs" / "data.bad_rows.txt").read_text().splitlines()
    assert [line.split(": ")[0] for line in report] == ["problems.jsonl:2", "problems.jsonl:3", "problems.jsonl:4"]
    assert not (tmp_path / "outputs" / "data").exists() and not (tmp_path / "outputs" / ".data.partial").exists()


def test_more_bad_rows_than_the_line_shows_are_all_in_the_report(tmp_path, monkeypatch, capfd):
    lines = [json.dumps(GOOD[0]), *["not json"] * 2, json.dumps(GOOD[1]), *[json.dumps({"prompt": "x", "answer": ""})] * 3]
    code, err = stop(monkeypatch, capfd, tmp_path, lines)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "problems.jsonl: 5 bad rows" in err and "line 2 not valid JSON" in err and err.rstrip().endswith("; and 2 more"), err
    report = (tmp_path / "outputs" / "data.bad_rows.txt").read_text().splitlines()
    assert [line.split(": ")[0].rsplit(":", 1)[1] for line in report] == ["2", "3", "5", "6", "7"]
    assert report[-1] == "problems.jsonl:7: field 'answer' is empty"


def test_a_bad_data_stop_leaves_no_mlflow_run(tmp_path, monkeypatch, capfd):
    """Issue 38, item 6: the stop happens inside the stage, after its MLflow run opened; the run is deleted."""
    import os

    from mlflow.tracking import MlflowClient

    saved = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        code, err = stop(monkeypatch, capfd, tmp_path, [json.dumps(GOOD[0]), "not json", "{}"], tracking=True)
    finally:  # MLflow's set_tracking_uri exports it; later tests in this worker must not log into this store
        os.environ.pop("MLFLOW_TRACKING_URI", None) if saved is None else os.environ.update(MLFLOW_TRACKING_URI=saved)
    assert code == 2 and "2 bad rows" in err, err
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiments = client.search_experiments()
    assert [run for e in experiments for run in client.search_runs([e.experiment_id])] == []
    deleted = [run for e in experiments for run in client.search_runs([e.experiment_id], run_view_type=2)]
    assert len(deleted) == 1 and deleted[0].info.lifecycle_stage == "deleted"
