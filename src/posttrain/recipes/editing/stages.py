"""Stages `knowledge` and `edit`: lifelong knowledge editing (as in GLIME, 2026) on a synthetic fact set (recipes/editing/facts.py).

`knowledge`: a base model that knows the synthetic fact set (`edit.facts`), the start of lifelong editing.
A tiny model (`model.*` sizes, a character tokenizer over the fact set's alphabet) or `model.path` is fine-tuned
with `edit.pretrain` (SFT settings) on every fact under every paraphrase template. Outputs: `model/`, `facts.json`
(the fact set the `edit` stage reads); metrics: greedy accuracy on each template role.

`edit`: a stream of edits (new objects for chosen facts) is applied one by one to the `knowledge` stage's base model
with `edit.method` (naive sequential fine-tuning, or GLIME).
Inputs: `base` (`model/`, `facts.json`). The stream is `edit.edits` (a JSON-lines file, checked before any model is
loaded) or `edit.n_edits` seeded edits. Outputs: `model/`, `edits.jsonl`, `history.json` (one row per edit);
metrics: edit success, retention of earlier edits, paraphrase generalisation, locality and unedited-fact accuracy
(each with its `base_` value before the first edit) and `nonfinite_steps`. With `--resume` a stopped run continues from
its last checkpoint (`edit.checkpoint_every` edits).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.stages import stages


@stages.register("knowledge", sections=("edit",), inputs={}, resumable=True)
def run_knowledge(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `knowledge`: a base model that knows the synthetic fact set (`edit.facts`), the start of lifelong editing."""
    from posttrain.recipes.editing.facts import ROLES, build_fact_set
    from posttrain.models import (build_tiny, check_vocabulary, load_pretrained, prepare_model, save_pretrained, select_device,
                                  train_char_tokenizer)
    from posttrain.runtime import seed_everything
    from posttrain.recipes.editing.trainer import accuracy
    from posttrain.trainers.loop import TrainLoop
    from posttrain.trainers.sft import train_sft

    facts = build_fact_set(cfg.edit.facts)
    examples = facts.pretraining_examples()
    seed_everything(cfg.pipeline.seed)
    if cfg.model.path is None:
        tokenizer = train_char_tokenizer([facts.alphabet()])
        model = build_tiny(cfg.model, tokenizer)
    else:
        model, tokenizer = load_pretrained(cfg.model.path, cfg.model.dtype)
        check_vocabulary(tokenizer, [facts.alphabet()], "the fact set")
    model = prepare_model(model, tokenizer, cfg.model, select_device(cfg.pipeline.device))  # chat template, LoRA, checkpointing, autocast
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "model", "edit"), cfg.edit.pretrain.checkpoint_every, resume,
                               "edit.pretrain")
    metrics = train_sft(model, tokenizer, examples[: cfg.edit.pretrain.n_examples or None], cfg.edit.pretrain, cfg.pipeline.seed,
                        on_log=lambda step, m: tracker.log_metrics(m, step), loop=loop)
    max_new = max(len(o) for objs in facts.objects.values() for o in objs) + 1
    for role in ROLES:
        prompts = [p for s, r in facts.facts for p in facts.prompts(s, r, role)]
        truth = [facts.facts[s, r] for s, r in facts.facts for _ in ROLES[role]]
        metrics[f"{role}_template_accuracy"] = accuracy(model, tokenizer, prompts, truth, max_new)
    save_pretrained(model, tokenizer, out_dir / "model")
    (out_dir / "facts.json").write_text(facts.to_json() + "\n")
    tracker.log_artifacts(out_dir / "model", "model")
    metrics.update(n_facts=float(len(facts.facts)), n_examples=float(len(examples)))
    tracker.log_metrics(metrics)
    return metrics


@stages.register("edit", sections=("edit",), inputs={"base": "outputs/knowledge"}, requires={"base": ["model/config.json", "facts.json"]}, resumable=True)
def run_edit(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `edit`: lifelong knowledge editing (as in GLIME, 2026). A stream of edits (new objects for chosen facts) is applied
    one by one to the `knowledge` stage's base model with `edit.method` (naive sequential fine-tuning, or GLIME)."""
    from posttrain.recipes.editing.facts import FactSet, edit_stream, read_edits, write_edits
    from posttrain.models import load_pretrained, prepare_model, save_pretrained, select_device
    from posttrain.runtime import seed_everything
    from posttrain.recipes.editing.trainer import apply_edits
    from posttrain.trainers.loop import TrainLoop

    facts = FactSet.from_json((inputs["base"] / "facts.json").read_text())
    edits = read_edits(Path(cfg.edit.edits), facts) if cfg.edit.edits else edit_stream(facts, cfg.edit.n_edits, cfg.pipeline.seed)
    seed_everything(cfg.pipeline.seed)
    model, tokenizer = load_pretrained(inputs["base"] / "model", cfg.model.dtype)
    # the prompt format and autocast of model.*; no LoRA or activation checkpointing: an edit method changes the
    # model's own weights, which adapters would hide
    model = prepare_model(model, tokenizer, cfg.model, select_device(cfg.pipeline.device), train=False)
    log = lambda index, m: tracker.log_metrics(m, index)  # noqa: E731
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "model", "edit"), cfg.edit.checkpoint_every, resume,
                               "edit")
    history, metrics = apply_edits(model, tokenizer, facts, edits, cfg.edit, cfg.pipeline.seed, on_log=log, loop=loop)
    save_pretrained(model, tokenizer, out_dir / "model")
    write_edits(out_dir / "edits.jsonl", edits)
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    rows = [{"edit": i + 1, **asdict(e), "success": h["edit_success"]} for i, (e, h) in enumerate(zip(edits, history))]
    tracker.log_table(rows, "edits.json")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics
