"""Stage `preference`: offline preference training (DPO, GM-DPO, ABC-Align) of the SFT policy.

Inputs: `data` (train.jsonl, heldout.jsonl) and `policy` (a directory with `model/`). Pairs are built by the
`preference.data` builder from the training prompts (held-out pairs from the held-out prompts), or read from
`preference.pairs` (a JSON-lines file; its last tenth is held out). Outputs: `model/`, `pairs_train.jsonl`,
`pairs_heldout.jsonl`, `history.json`; metrics: held-out pair accuracy and held-out task accuracy, before and after,
and `nonfinite_steps`. With `--resume` a stopped run continues from its last checkpoint (`preference.checkpoint_every`).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.data import check_examples, read_examples
from posttrain.data.preferences import PreferencePair, preference_data, read_pairs, write_pairs
from posttrain.errors import UserError
from posttrain.stages import model_dir, stages
from posttrain.tasks import build_task


def load_pairs(cfg: Config, section, task, train_examples, heldout_examples, policy=None) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held-out) pairs for a `reward_model` or `preference` section; `policy` (model, tokenizer) serves
    builders that sample from it (`needs_policy`)."""
    if section.pairs is not None:
        pairs = read_pairs(section.pairs)
        if len(pairs) < 2:
            raise UserError(f"{section.pairs}: needs at least 2 pairs (one to train on, one to hold out)")
        cut = len(pairs) - max(1, len(pairs) // 10)
        return pairs[:cut], pairs[cut:]
    entry, seed = preference_data.entry(section.data), cfg.pipeline.seed
    extra = {"policy": (*policy, section.sample_tokens)} if entry.meta.get("needs_policy") else {}
    return entry.obj(task, train_examples, section.n_pairs, seed, **extra), entry.obj(task, heldout_examples, section.n_heldout_pairs, seed + 1, **extra)


@stages.register(
    "preference",
    inputs={"data": "outputs/data", "policy": "outputs/sft"},
    requires={"data": ["train.jsonl", "heldout.jsonl"], "policy": ["model/config.json"]},
    resumable=True,
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.eval.harness import evaluate
    from posttrain.models import load_pretrained, prepare_model, save_pretrained, select_device
    from posttrain.runtime import seed_everything
    from posttrain.trainers.loop import TrainLoop
    from posttrain.trainers.preference import train_preference

    task = build_task(cfg.task)
    train_examples, heldout_examples = read_examples(inputs["data"] / "train.jsonl"), read_examples(inputs["data"] / "heldout.jsonl")
    samples_policy = cfg.preference.pairs is None and preference_data.entry(cfg.preference.data).meta.get("needs_policy")
    if not samples_policy:  # a bad pair file fails before any model is loaded
        train, heldout = load_pairs(cfg, cfg.preference, task, train_examples, heldout_examples)
    seed_everything(cfg.pipeline.seed)
    policy, tokenizer = load_pretrained(model_dir(inputs["policy"]), cfg.model.dtype)
    policy = prepare_model(policy, tokenizer, cfg.model, select_device(cfg.pipeline.device), train=False)
    check_examples(inputs["data"] / "heldout.jsonl", heldout_examples, policy, tokenizer, cfg.eval.max_new_tokens, "eval.max_new_tokens")
    if samples_policy:
        train, heldout = load_pairs(cfg, cfg.preference, task, train_examples, heldout_examples, (policy, tokenizer))
    policy = prepare_model(policy, tokenizer, cfg.model, select_device(cfg.pipeline.device))
    before, _ = evaluate(policy, tokenizer, task, heldout_examples, cfg.eval, cfg.pipeline.seed)
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "task", "model", "preference"),
                               cfg.preference.checkpoint_every, resume, "preference")
    history, pair_metrics = train_preference(
        policy, tokenizer, train, heldout, cfg.preference, cfg.pipeline.seed, on_log=lambda step, m: tracker.log_metrics(m, step), loop=loop
    )
    after, table = evaluate(policy, tokenizer, task, heldout_examples, cfg.eval, cfg.pipeline.seed)
    save_pretrained(policy, tokenizer, out_dir / "model")
    write_pairs(out_dir / "pairs_train.jsonl", train)
    write_pairs(out_dir / "pairs_heldout.jsonl", heldout)
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    tracker.log_table(table, "heldout_samples.json")
    tracker.log_artifacts(out_dir / "model", "model")
    metrics = {**pair_metrics, "greedy_accuracy_before": before["greedy_accuracy"], "greedy_accuracy": after["greedy_accuracy"],
               "sampled_accuracy": after["sampled_accuracy"], "n_pairs": float(len(train)), "n_heldout_pairs": float(len(heldout))}
    tracker.log_metrics(metrics)
    return metrics
