"""Stage `data`: generate the task's train / held-out examples (or read them: task.name dataset), then validate
them with Great Expectations.

Outputs: train.jsonl, heldout.jsonl, validation.json. A failing suite stops the stage with its report, and
nothing is written. A task that reads user files (dataset) has their rows checked first by the row suite
(each mapped field present, of its type, not empty; a bad row is one line naming file and row), and reports
what it dropped (`n_duplicates_dropped`, `n_too_long_dropped`, ...) with the stage's metrics.
The suite checks what the task defines (non-empty prompts in the task's alphabet, verified completions,
disjoint splits); whether rows fit a model (its tokenizer's vocabulary, its positions) is checked where a
model meets the data, by the stages that load one (data.check_examples): only they know the tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.data import write_examples
from posttrain.stages import stages
from posttrain.tasks import build_task


@stages.register("data", inputs={}, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.data.validation import examples_frame, raise_if_bad_row, raise_if_failed, validate_examples, validate_rows

    task = build_task(cfg.task)
    bad_rows_file = out_dir.parent / f"{out_dir.name.removeprefix('.').removesuffix('.partial')}.bad_rows.txt"
    bad_rows_file.unlink(missing_ok=True)  # an earlier run's list
    row_reports = {rows.source: validate_rows(rows) for rows in task.source_rows()}
    for source, row_report in row_reports.items():  # every bad row at once, in file order; the full list next to the output
        raise_if_bad_row(row_report, source, bad_rows_file)
    splits = task.splits(cfg.pipeline.seed)
    report = validate_examples(examples_frame(task, splits), task, task.expected_sizes())
    if row_reports:
        report["sources"] = row_reports  # the row suite's report per file read
    (out_dir / "validation.json").write_text(strict_json(report, indent=2) + "\n")
    raise_if_failed(report, "data")
    for name, rows in splits.items():
        write_examples(out_dir / f"{name}.jsonl", rows)
    tracker.log_artifacts(out_dir, "data")
    metrics = {f"n_{name}": float(len(rows)) for name, rows in splits.items()}
    metrics["checks_passed"] = float(sum(c["success"] for c in report["checks"]))
    metrics.update(task.data_metrics())
    tracker.log_metrics(metrics)
    return metrics
