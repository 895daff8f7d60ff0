"""A researcher's own problems (task.name dataset, a JSON-lines file) through data -> sft -> rl -> eval, in process."""

from __future__ import annotations

import json

from helpers import posttrain_in_process, tiny_params


def test_your_problems_run_through_data_sft_rl_eval(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path, tracking={"enabled": False})
    rows = [{"problem": f"{a}+{b}=", "answer": a + b, "level": a % 3} for a in range(10) for b in range(10)]
    (tmp_path / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:3]))
    mine = ["--set", "task.name=dataset", "--set", "task.options.dataset.path=problems.jsonl",
            "--set", "task.options.dataset.fields.prompt=problem", "--set", "task.options.dataset.fields.metadata=all"]
    for stage in ("data", "sft", "rl", "eval"):
        posttrain_in_process(stage, *mine)
    metrics = {stage: json.loads((tmp_path / "outputs" / stage / "metrics.json").read_text()) for stage in ("data", "eval")}
    assert (metrics["data"]["n_train"], metrics["data"]["n_heldout"], metrics["data"]["n_duplicates_dropped"]) == (90, 10, 3)
    assert metrics["eval"]["n_prompts"] == 10
    first = json.loads((tmp_path / "outputs" / "data" / "train.jsonl").read_text().splitlines()[0])
    assert first["metadata"] == {"level": first["metadata"]["level"]} and first["completion"] == first["answer"]
