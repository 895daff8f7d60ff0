"""Stages `viskg_sft` and `viskg_rl`: VisKG (specs §29) on the synthetic VQA set (recipes/viskg/data.py).

`viskg_sft` builds the vision-language model of `viskg.model` (tiny from the config, or loaded by path) and trains it
by SFT with negative rationales; `viskg_rl` reads it (`--in model=outputs/viskg_sft`, or any VisionLanguageModel
directory or native image-text-to-text checkpoint: recipes/viskg/vlm.py's `load_vlm`) and trains it by RL with
`viskg.rl.advantage` (gdpo or grpo) over accuracy, format and compactness. Each writes `model/` (in the model's own
format: a VisionLanguageModel directory, or a native checkpoint with its processor), `history.json`, `samples.json`
(held-out greedy outputs) and `scenes/scenes.png` (held-out scenes with the question, the model's answer and the truth); MLflow gets the per-step
figures, the samples as a table, the scene grid as an image and the model. Metrics: held-out greedy accuracy
(overall and by hops), format rate, tokens per completion and per representation, the reference graph vs caption
token counts. With `--resume` a stopped run continues from its last checkpoint (`viskg.sft` / `viskg.rl`
`.checkpoint_every`). Settings: viskg.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.config import Config
from posttrain.runtime import strict_json
from posttrain.stages import stages


def _finish(cfg: Config, vlm, history: list[dict], extra: dict[str, float], out_dir: Path, tracker, prefix: str) -> dict[str, float]:
    from posttrain.recipes.viskg.trainer import evaluate

    figures, rows, qs, images = evaluate(cfg.viskg, vlm, cfg.pipeline.seed)
    vlm.save(out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    (out_dir / "samples.json").write_text(json.dumps(rows[: cfg.viskg.eval.n_table], indent=1) + "\n")
    n = min(cfg.viskg.eval.n_images, len(rows))
    if n:
        scene_grid(images[:n].numpy(), rows[:n], out_dir / "scenes" / "scenes.png")
        tracker.log_artifacts(out_dir / "scenes", "scenes")
    tracker.log_table(rows[: cfg.viskg.eval.n_table], f"{prefix}_samples.json")
    tracker.log_artifacts(out_dir / "model", "model")
    metrics = {**figures, **extra}
    tracker.log_metrics(metrics)
    return metrics


@stages.register("viskg_sft", sections=("viskg",), inputs={}, resumable=True, gpu=False)
def run_sft(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `viskg_sft`: SFT with negative rationales of the vision-language model on the VQA set (VisKG)."""
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.viskg.trainer import build_model, train_sft

    vlm = build_model(cfg.viskg, cfg.pipeline.seed)
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "viskg"), cfg.viskg.sft.checkpoint_every, resume, "viskg.sft")
    history, extra = train_sft(cfg.viskg, vlm, cfg.pipeline.seed, loop, on_log=lambda step, m: tracker.log_metrics(m, step))
    return _finish(cfg, vlm, history, extra, out_dir, tracker, "sft")


@stages.register("viskg_rl", sections=("viskg",), inputs={"model": "outputs/viskg_sft"}, resumable=True, gpu=False)
def run_rl(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `viskg_rl`: GDPO (or GRPO) over accuracy, format and compactness rewards (VisKG)."""
    from posttrain.recipes.viskg.vlm import load_vlm
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.viskg.trainer import train_rl

    trained = inputs["model"] / "model"
    vlm = load_vlm(trained if trained.is_dir() else inputs["model"])
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "viskg"), cfg.viskg.rl.checkpoint_every, resume, "viskg.rl")
    history = train_rl(cfg.viskg, vlm, cfg.pipeline.seed, loop, on_log=lambda step, m: tracker.log_metrics(m, step))
    last = {f"train_{k}": v for k, v in history[-1].items() if k.startswith("reward_")}
    return _finish(cfg, vlm, history, {**last, **loop.metrics()}, out_dir, tracker, "rl")


def scene_grid(images, rows: list[dict], path: Path) -> None:
    """A PNG of the scenes, each titled with its question, the model's answer and the truth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posttrain.recipes.viskg.rewards import parse_output

    path.parent.mkdir(parents=True, exist_ok=True)
    cols = min(4, len(images))
    fig, axes = plt.subplots((len(images) + cols - 1) // cols, cols, figsize=(3.2 * cols, 3.4 * ((len(images) + cols - 1) // cols)), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, row in zip(axes.flat, images, rows):
        ax.imshow(image, interpolation="nearest")
        said = parse_output(row["output"]).answer
        words = row["question"].split()
        title = "\n".join(" ".join(words[i: i + 6]) for i in range(0, len(words), 6))
        ax.set_title(f"{title}\nmodel: {said} | truth: {row['answer']}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)
