"""The knowledge and edit stages on a micro config (lifelong editing, GLIME), and a bad edit file's one-line error.
Both run through the `posttrain` CLI entry point (`posttrain.cli.main`, what the installed script calls) in this
process, so the imports are paid once; MLflow logging included."""

from __future__ import annotations

import json

from helpers import MICRO_EDIT, micro_params, posttrain_main as cli


def test_knowledge_then_edit_then_a_bad_edit_file(tmp_path, monkeypatch, capsys):
    micro_params(tmp_path, edit=MICRO_EDIT)
    monkeypatch.chdir(tmp_path)
    code, stdout, _ = cli(monkeypatch, capsys, "knowledge")
    knowledge = json.loads(stdout.strip().splitlines()[-1])
    assert code == 0 and knowledge["n_facts"] == 8 and 0.0 <= knowledge["heldout_template_accuracy"] <= 1.0
    assert (tmp_path / "outputs" / "knowledge" / "facts.json").is_file()

    code, stdout, _ = cli(monkeypatch, capsys, "edit")
    metrics = json.loads(stdout.strip().splitlines()[-1])
    assert code == 0 and {"edit_success", "retention", "generalization", "locality", "unedited_accuracy", "base_unedited_accuracy"} <= set(metrics)
    out = tmp_path / "outputs" / "edit"
    assert (out / "model" / "config.json").is_file() and len((out / "edits.jsonl").read_text().splitlines()) == 2
    assert [h["edit"] for h in json.loads((out / "history.json").read_text())] == [1.0, 2.0]
    assert json.loads((out / "mlflow_run.json").read_text())["run_id"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"subject": "nobody", "relation": "color", "new": "red"}) + "\n")
    code, _, stderr = cli(monkeypatch, capsys, "edit", "--set", f"edit.edits={bad}", "--out", "outputs/edit_bad")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    assert f"{bad}:1" in lines[0] and "no fact ('nobody', 'color')" in lines[0]
    assert not (tmp_path / "outputs" / "edit_bad").exists() and not (tmp_path / "outputs" / ".edit_bad.partial").exists()
