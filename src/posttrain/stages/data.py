"""Stage `data`: generate the task's train / held-out examples, then validate them with Great Expectations.

Outputs: train.jsonl, heldout.jsonl, validation.json. A failing suite stops the stage with its report.
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


def verified(task, example) -> bool:
    return task.format_reward(example.completion, True) == 1.0 and task.correctness_reward(example.completion, True, example) == 1.0


@stages.register("data", inputs={}, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    import pandas as pd

    from posttrain.data.validation import raise_if_failed, validate_examples

    task = build_task(cfg.task)
    splits = task.splits(cfg.pipeline.seed)
    frame = pd.DataFrame(
        [
            {"prompt": e.prompt, "completion": e.completion, "answer": e.answer, "split": name, "completion_verified": verified(task, e)}
            for name, rows in splits.items()
            for e in rows
        ]
    )
    report = validate_examples(frame, task, {"train": cfg.task.n_train, "heldout": cfg.task.n_heldout})
    (out_dir / "validation.json").write_text(strict_json(report, indent=2) + "\n")
    raise_if_failed(report, "data")
    for name, rows in splits.items():
        write_examples(out_dir / f"{name}.jsonl", rows)
    tracker.log_artifacts(out_dir, "data")
    metrics = {f"n_{name}": float(len(rows)) for name, rows in splits.items()}
    metrics["checks_passed"] = float(sum(c["success"] for c in report["checks"]))
    tracker.log_metrics(metrics)
    return metrics
