"""Stage `care`: train CARE's rubric generator (Context-Adaptive Rubric Evolution, 2026) for the `dialogue` task: SFT on turn-level rubric
labels, then preference RL (the rl section's objective) on human preference pairs; the data are simulated from
the task's known truth (recipes/care/rubric.py). Settings: the `care` section, model sizes from `model`.

Output: `model/` (what `rl.options.care.path` points the `care` reward at), `history.json` (preference-RL steps);
metrics: held-out weight error, pair accuracy, top-two agreement and parse rate after SFT (`*_sft`) and after
preference RL, with the SFT labels' own weight error and the uniform rubric's as references, and `nonfinite_steps`.
With `--resume` a stopped run continues from its last checkpoint (`care.checkpoint_every`, in SFT and in RL).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.stages import stages


@stages.register("care", sections=("care",), inputs={}, resumable=True)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.care.trainer import train_rubric_generator

    config_hash = cfg.section_hash("pipeline", "model", "rl", "care")
    loop = TrainLoop.for_stage(cfg.training, out_dir, config_hash, cfg.care.checkpoint_every, resume, "care")
    metrics, history, table = train_rubric_generator(cfg, out_dir, on_log=lambda step, m: tracker.log_metrics(m, step), loop=loop)
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    tracker.log_table(table, "heldout_rubrics.json")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics
