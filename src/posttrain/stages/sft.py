"""Stage `sft`: supervised fine-tuning on solved training examples.

With `model.path` unset the policy is a tiny model built from `model.*` sizes, with a character
tokenizer trained on the task's alphabet; otherwise the model at `model.path` is fine-tuned (optionally
with LoRA). Output: `model/` (a `from_pretrained` directory). A training row the model cannot take stops the
stage before any step: a character outside the tokenizer (the task's alphabet for a tiny model; it is not
grown from the data, so a typo or another task's data cannot slip in as `<unk>`), or prompt + completion + EOS
longer than the model's positions (data.check_examples). With `--resume` a stopped run continues from its last
checkpoint (`sft.checkpoint_every`).

`sft.steps: 0` skips fine-tuning: the checkpoint at `model.path` becomes the stage's output as it is, so a pipeline
whose RL starts from a pretrained model needs no other graph (every launcher runs the same stages).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import Config
from posttrain.data import check_examples, read_examples
from posttrain.stages import check_sharding, stages
from posttrain.tasks import build_task


@stages.register("sft", inputs={"data": "outputs/data"}, requires={"data": ["train.jsonl"]}, resumable=True,
                 shardable=True)  # training.sharding=fsdp (trainers/distributed.py); rl too, every other stage refuses it
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.models import build_tiny, load_pretrained, prepare_model, save_pretrained, select_device, train_char_tokenizer
    from posttrain.runtime import seed_everything
    from posttrain.trainers.loop import TrainLoop
    from posttrain.trainers.sft import train_sft

    if cfg.sft.steps == 0:
        return pass_through(cfg, out_dir, tracker)
    train = inputs["data"] / "train.jsonl"
    examples = read_examples(train)
    seed_everything(cfg.pipeline.seed)
    device = select_device(cfg.pipeline.device)
    if cfg.model.path is None:
        tokenizer = train_char_tokenizer([build_task(cfg.task).alphabet()])
        model = build_tiny(cfg.model, tokenizer)
    else:
        model, tokenizer = load_pretrained(cfg.model.path, cfg.model.dtype)
    model = prepare_model(model, tokenizer, cfg.model, device)  # chat template, LoRA, checkpointing, autocast
    if cfg.training.sharding == "fsdp":
        model = shard_for_sft(cfg, model)
    check_examples(train, examples, model, tokenizer, 0, "", supervised=True)
    examples = examples[: cfg.sft.n_examples or None]
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "task", "model", "sft"), cfg.sft.checkpoint_every, resume, "sft")
    metrics = train_sft(model, tokenizer, examples, cfg.sft, cfg.pipeline.seed, on_log=lambda step, m: tracker.log_metrics(m, step), loop=loop)
    save_pretrained(model, tokenizer, out_dir / "model")
    tracker.log_artifacts(out_dir / "model", "model")
    metrics["n_examples"] = float(len(examples))
    metrics["parameters"] = float(sum(p.numel() for p in model.parameters()))
    if cfg.training.sharding == "fsdp":  # what each rank holds (its shards)
        from posttrain.trainers import distributed

        metrics.update(distributed.shard_sizes(model))
    return metrics


def shard_for_sft(cfg: Config, model):
    """training.sharding=fsdp: the policy's parameters sharded over torchrun's ranks (trainers/distributed.py)."""
    from posttrain.trainers import distributed

    check_sharding(cfg)
    return distributed.shard_model(model)


def pass_through(cfg: Config, out_dir: Path, tracker) -> dict[str, float]:
    """`sft.steps: 0`: the checkpoint at `model.path`, saved unchanged as the stage's `model/`."""
    from posttrain.errors import UserError
    from posttrain.models import load_pretrained, save_pretrained

    if cfg.model.path is None:
        raise UserError("sft.steps=0 passes model.path through untrained, but model.path is null (a model built from scratch needs SFT steps)")
    model, tokenizer = load_pretrained(cfg.model.path, cfg.model.dtype)
    save_pretrained(model, tokenizer, out_dir / "model")
    tracker.log_artifacts(out_dir / "model", "model")
    return {"steps": 0.0, "n_examples": 0.0, "parameters": float(sum(p.numel() for p in model.parameters()))}
