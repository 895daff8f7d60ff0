"""Stage `flow_sft`: flow-matching SFT of the conditional image model on the curated training quadruplets.

Input `data` (curate's output). Output: model/ (a saved flow model), history.json. `flow.kind` picks the model
family (`unet`: a tiny new model, or a saved one from `flow.path`; `flux`: the diffusers FLUX checkpoint at
`flow.path`); `flow.lora.r > 0` trains LoRA adapters (merged on save for the UNet, saved as adapters for FLUX).
With `--resume` a stopped run continues from its last checkpoint (`flow_sft.checkpoint_every`).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.stages import stages


def starting_model(cfg: Config, image_size: int):
    from posttrain.recipes.image.flow import start_flow_model

    model = start_flow_model(cfg.flow, image_size)
    if model.image_size != image_size:
        raise UserError(f"flow.path holds a {model.image_size}px model but flow.image_size is {image_size}")
    return model


@stages.register("flow_sft", sections=("flow", "flow_sft"), inputs={"data": "outputs/images/curate"}, requires={"data": ["quadruplets.parquet", "images.npz"]}, resumable=True)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.recipes.image.vigor.edits import load_edits
    from posttrain.recipes.image.flow import save_flow_model
    from posttrain.runtime import seed_everything
    from posttrain.recipes.image.sft import train_flow_sft
    from posttrain.trainers.loop import TrainLoop

    seed_everything(cfg.pipeline.seed)
    edits = load_edits(inputs["data"], "train", cfg.flow.image_size)
    model = starting_model(cfg, cfg.flow.image_size)
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "flow", "flow_sft"), cfg.flow_sft.checkpoint_every, resume, "flow_sft")
    history = train_flow_sft(model, edits, cfg.flow_sft, cfg.pipeline.seed, on_log=lambda step, m: tracker.log_metrics(m, step), loop=loop)
    save_flow_model(model, out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    tracker.log_artifacts(out_dir / "model", "model")
    return {"final_loss": history[-1]["loss"], "n_train": float(len(edits)), "steps": float(cfg.flow_sft.steps),
            "nonfinite_steps": history[-1]["nonfinite_steps"]}
