"""Stage `knowledge`: a base model that knows the synthetic fact set (`edit.facts`), the start of lifelong editing.

A tiny model (`model.*` sizes, a character tokenizer over the fact set's alphabet) or `model.path` is fine-tuned
with `edit.pretrain` (SFT settings) on every fact under every paraphrase template. Outputs: `model/`, `facts.json`
(the fact set the `edit` stage reads); metrics: greedy accuracy on each template role.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import Config
from posttrain.stages import stages


@stages.register("knowledge", inputs={}, resumable=True)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.data.facts import ROLES, build_fact_set
    from posttrain.models import (build_tiny, check_vocabulary, load_pretrained, prepare_model, save_pretrained, select_device,
                                  train_char_tokenizer)
    from posttrain.runtime import seed_everything
    from posttrain.trainers.editing import accuracy
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
