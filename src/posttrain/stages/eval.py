"""Stage `eval`: held-out greedy and sampled accuracy of any checkpoint, the `eval.sampler` pass and best-of-N
(`eval.best_of_n`, eval/harness.py), plus a table of completions.

Inputs: `data` (heldout.jsonl) and `model` (a stage output with `model/`, or a plain checkpoint directory). Outputs: metrics.json,
samples.jsonl.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.data import check_examples, read_examples
from posttrain.stages import model_dir, stages
from posttrain.tasks import build_task


@stages.register(
    "eval", inputs={"data": "outputs/data", "model": "outputs/rl"}, requires={"data": ["heldout.jsonl"], "model": ["model/config.json"]}
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.eval.harness import evaluate
    from posttrain.models import load_pretrained, prepare_model, select_device

    heldout = inputs["data"] / "heldout.jsonl"
    examples = read_examples(heldout)
    model, tokenizer = load_pretrained(model_dir(inputs["model"]), cfg.model.dtype)
    model = prepare_model(model, tokenizer, cfg.model, select_device(cfg.pipeline.device), train=False)
    check_examples(heldout, examples, model, tokenizer, cfg.eval.max_new_tokens, "eval.max_new_tokens")
    metrics, rows = evaluate(model, tokenizer, build_task(cfg.task), examples, cfg.eval, cfg.pipeline.seed)
    with (out_dir / "samples.jsonl").open("w") as f:
        for row in rows:
            f.write(strict_json(row) + "\n")
    tracker.log_metrics(metrics)
    tracker.log_table(rows, "heldout_samples.json")
    return metrics
