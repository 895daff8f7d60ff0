"""`posttrain summary`: held-out accuracy of the start, the models in between (`--via`) and the result, per eval output."""

from __future__ import annotations

import json

from helpers import REPO, posttrain_in_process, posttrain_main


def _evals(root, accuracies: dict[str, float]) -> None:
    for name, accuracy in accuracies.items():
        (root / name).mkdir(parents=True)
        metrics = {"greedy_accuracy": accuracy, "sampled_accuracy": accuracy / 2, "greedy_accuracy_steps_2": accuracy / 4}
        (root / name / "metrics.json").write_text(json.dumps(metrics))


def test_the_summary_reads_start_via_and_result(tmp_path):
    _evals(tmp_path / "eval", {"import": 0.11, "sft": 0.62, "rl": 0.58})
    out = tmp_path / "summary.json"
    text = posttrain_in_process("summary", "--params", str(REPO / "params.yaml"), "--eval-dir", str(tmp_path / "eval"), "--start", "import",
                                "--via", "sft", "--out", str(out))
    assert "held-out greedy accuracy: IMPORT 11.0% -> SFT 62.0% -> RL 58.0% (+47.0 points); steps_2: 2.8% -> 14.5%" in text
    summary = json.loads(out.read_text())
    assert (summary["import_accuracy"], summary["sft_accuracy"], summary["rl_sampled_accuracy"]) == (0.11, 0.62, 0.29)


def test_a_missing_intermediate_evaluation_is_one_clear_error(tmp_path, monkeypatch, capsys):
    _evals(tmp_path / "eval", {"import": 0.11, "rl": 0.58})
    code, out, err = posttrain_main(monkeypatch, capsys, "summary", "--params", str(REPO / "params.yaml"), "--eval-dir", str(tmp_path / "eval"),
                                    "--start", "import", "--via", "sft", "--out", str(tmp_path / "summary.json"))
    assert code != 0 and "held-out" not in out
    assert err.strip().splitlines() == [f"posttrain: error: missing {tmp_path}/eval/sft/metrics.json: run the pipeline first (dvc repro)"]
    assert not (tmp_path / "summary.json").exists()
