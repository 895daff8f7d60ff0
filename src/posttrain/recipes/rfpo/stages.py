"""Stage `critic`: pretrain RFPO's success critic (recipes/rfpo/trainer.py) on the SFT policy's labelled rollouts.

Inputs: `data` (train.jsonl, heldout.jsonl) and `policy` (the SFT model: the critic's backbone starts as a copy of
it, and it samples the rollouts). Output: `model/` (a value model: what `rl.critic.path` points at; preset `rfpo`
reads outputs/critic), `history.json`; metrics: held-out Brier score (and the base rate's), AUC, success rates,
`nonfinite_steps`. With `--resume` a stopped run continues from its last checkpoint (`critic.checkpoint_every`).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import Config
from posttrain.data import read_examples
from posttrain.runtime import strict_json
from posttrain.stages import model_dir, stages
from posttrain.tasks import build_task


@stages.register(
    "critic",
    sections=("critic",),
    inputs={"data": "outputs/data", "policy": "outputs/sft"},
    requires={"data": ["train.jsonl", "heldout.jsonl"], "policy": ["model/config.json"]},
    resumable=True,
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.models import load_pretrained, prepare_model, select_device
    from posttrain.models.value import save_critic
    from posttrain.runtime import seed_everything
    from posttrain.recipes.rfpo.trainer import train_critic
    from posttrain.trainers.loop import TrainLoop

    task = build_task(cfg.task)
    train, heldout = read_examples(inputs["data"] / "train.jsonl"), read_examples(inputs["data"] / "heldout.jsonl")
    seed_everything(cfg.pipeline.seed)
    policy, tokenizer = load_pretrained(model_dir(inputs["policy"]), cfg.model.dtype)
    policy = prepare_model(policy, tokenizer, cfg.model, select_device(cfg.pipeline.device))
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "task", "model", "rl", "critic"),
                               cfg.critic.checkpoint_every, resume, "critic")
    critic, history, metrics = train_critic(policy, tokenizer, task, train, heldout, cfg, cfg.pipeline.seed, loop,
                                            on_log=lambda step, m: tracker.log_metrics(m, step))
    save_critic(critic, out_dir / "model")
    tokenizer.save_pretrained(out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics
