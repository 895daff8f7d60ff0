"""Stages `drive_encoder` and `safe_rl`: VLM-Safe-RL (specs §16) in the driving environment (recipes/safe_rl/driving.py).

`drive_encoder` trains the tiny CLIP on a random driver's frames and their captions (recipes/safe_rl/trainer.py) and
writes `model/` (a CLIPModel directory with its tokenizer), `history.json`; metrics: held-out danger-phrase
accuracy and the safety score on safe vs about-to-crash frames (`score_gap`). `safe_rl` reads a frozen encoder,
`--in encoder=outputs/drive_encoder` (its model/) or any CLIP checkpoint directory (e.g. a downloaded
openai/clip-vit-base-patch32), and trains the PPO-Lagrangian agent; it writes `model/` (the agent's weights),
`history.json` (one row per round), `episode/episode.gif` (a greedy held-out episode, also an MLflow artifact);
metrics: the held-out greedy episodes' catastrophe rate, cost, progress (`final_*`) and the last lambda. With
`--resume` a stopped run continues from its last checkpoint (`safe_rl.checkpoint_every`). Settings: safe_rl.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.config import Config
from posttrain.media import write_gif
from posttrain.runtime import strict_json
from posttrain.stages import stages


@stages.register("drive_encoder", sections=("safe_rl",), inputs={}, resumable=True, gpu=False)
def run_encoder(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `drive_encoder`: a tiny CLIP trained by InfoNCE on the driving environment's frames and captions (VLM-Safe-RL);
    checkpointed every safe_rl.encoder.checkpoint_every steps, `--resume` continues from the newest."""
    from posttrain.models.image_text import save_image_text
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.safe_rl.trainer import train_encoder

    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "safe_rl"), cfg.safe_rl.encoder.checkpoint_every, resume,
                               "safe_rl.encoder")
    model, tokenizer, metrics, history = train_encoder(cfg.safe_rl, cfg.pipeline.seed, loop, on_log=lambda step, m: tracker.log_metrics(m, step))
    save_image_text(model, tokenizer, out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics


@stages.register("safe_rl", sections=("safe_rl",), inputs={"encoder": "outputs/drive_encoder"}, resumable=True, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `safe_rl`: PPO-Lagrangian with frozen-CLIP shaping and the augmented multiplier update (VLM-Safe-RL) while driving."""
    from safetensors.torch import save_model

    from posttrain.models.image_text import ImageTextEncoder
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.safe_rl.trainer import train_safe_rl

    trained = inputs["encoder"] / "model"
    encoder = ImageTextEncoder.load(trained if (trained / "config.json").is_file() else inputs["encoder"])
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "safe_rl"), cfg.safe_rl.checkpoint_every, resume, "safe_rl")
    trainer, history, metrics, frames = train_safe_rl(cfg.safe_rl, encoder, cfg.pipeline.seed, loop,
                                                      on_log=lambda step, m: tracker.log_metrics(m, step))
    (out_dir / "model").mkdir()
    save_model(trainer.agent, str(out_dir / "model" / "model.safetensors"))
    (out_dir / "model" / "agent.json").write_text(json.dumps({"inputs": encoder.dim + 3, "hidden_size": cfg.safe_rl.hidden_size}) + "\n")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    if frames is not None:
        write_gif(frames, out_dir / "episode" / "episode.gif")
        tracker.log_artifacts(out_dir / "episode", "episode")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics

