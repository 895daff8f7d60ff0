"""Stage `flow_rl`: Flow-GRPO from the SFT flow model, rewarded by IA / BP / QP and aggregated by GDPO.

Inputs `data` (curate's output) and `policy` (flow_sft's output). Output: model/, history.json,
reward_curve.png (one line per judge). With `--resume` a stopped run continues from its last checkpoint
(`flow_rl.checkpoint_every`) to the same result as an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.stages import stages


@stages.register(
    "flow_rl",
    sections=("flow", "flow_rl"),
    inputs={"data": "outputs/images/curate", "policy": "outputs/images/flow_sft"},
    requires={"data": ["quadruplets.parquet", "images.npz"], "policy": ["model/flow_config.json"]},
    resumable=True,
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.recipes.image.vigor.edits import load_edits
    from posttrain.recipes.image.flow import load_flow_model, maybe_flow_lora, save_flow_model
    from posttrain.stages.rl import reward_curve
    from posttrain.runtime import seed_everything
    from posttrain.recipes.image.grpo import train_flow_rl
    from posttrain.trainers.loop import TrainLoop

    seed_everything(cfg.pipeline.seed)
    edits = load_edits(inputs["data"], "train", cfg.flow.image_size)
    model = maybe_flow_lora(load_flow_model(inputs["policy"] / "model"), cfg.flow.lora)
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "flow", "flow_rl"), cfg.flow_rl.checkpoint_every, resume, "flow_rl")
    history = train_flow_rl(model, edits, cfg.flow_rl, cfg.pipeline.seed, on_log=lambda step, m: tracker.log_metrics(m, step), loop=loop,
                            max_unscored_steps=cfg.training.max_unscored_steps)
    save_flow_model(model, out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    figure = reward_curve(history)
    figure.savefig(out_dir / "reward_curve.png", dpi=100)
    tracker.log_figure(figure, "reward_curve.png")
    tracker.log_artifacts(out_dir / "model", "model")
    first, last = history[: max(1, len(history) // 5)], history[-max(1, len(history) // 5) :]
    mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    return {
        "first_overall_reward": mean(first, "reward/overall_mean"),
        "final_overall_reward": mean(last, "reward/overall_mean"),
        "steps": float(len(history)),
        "seconds_per_step": mean(history, "step_seconds"),
        "nonfinite_steps": history[-1]["nonfinite_steps"],
    }
