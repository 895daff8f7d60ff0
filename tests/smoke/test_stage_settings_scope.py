"""A stage validates only the sections it reads: a bad value in a recipe's section it does not read leaves the `data`
stage's run alone, and stops a stage that reads it (`maze_data`, the DSP recipe's) with one line and nothing written."""

from __future__ import annotations

from helpers import REPO, posttrain_main

QUIET = ["--set", "tracking.enabled=false", "--set", "task.n_train=20", "--set", "task.n_heldout=5"]


def test_a_bad_unrelated_section_stops_only_the_stages_that_read_it(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {REPO / 'params.yaml'}\ndsp: {{steps: -1}}\n")
    code, _, err = posttrain_main(monkeypatch, capsys, "data", "--params", str(bad), "--out", str(tmp_path / "data"), *QUIET)
    assert code == 0, err
    assert (tmp_path / "data" / "train.jsonl").is_file()
    code, _, err = posttrain_main(monkeypatch, capsys, "maze_data", "--params", str(bad), "--out", str(tmp_path / "maze"), *QUIET)
    assert code == 2 and err.strip().splitlines() == ["posttrain: error: dsp.steps: Input should be greater than 0 (got -1)"], err
    assert not (tmp_path / "maze").exists()
