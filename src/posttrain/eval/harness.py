"""Held-out evaluation: greedy accuracy, sampled accuracy (k samples per prompt), format rate."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import EvalConfig
from posttrain.models.sampling import generate
from posttrain.runtime import progress
from posttrain.tasks import Example, Task


_COUNTED = ("greedy_correct", "greedy_format", "sampled_correct", "sampled_format")


def evaluate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, examples: Sequence[Example], cfg: EvalConfig, seed: int
) -> tuple[dict[str, float], list[dict[str, object]]]:
    examples = list(examples)[: cfg.n_prompts]
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    totals = {"greedy_correct": 0.0, "greedy_format": 0.0, "sampled_correct": 0.0, "sampled_format": 0.0}
    rows: list[dict[str, object]] = []
    bar = progress(len(examples), "eval")
    for start in range(0, len(examples), cfg.batch_size):
        chunk = examples[start : start + cfg.batch_size]
        for mode, k in (("greedy", 1), ("sampled", cfg.samples_per_prompt)):
            samples, texts = generate(model, tokenizer, [e.prompt for e in chunk], cfg.max_new_tokens, group_size=k,
                                      temperature=cfg.temperature, greedy=mode == "greedy", generator=generator)
            finished = samples.finished.tolist()
            for i, text in enumerate(texts):
                example = chunk[i // k]
                correct = task.correctness_reward(text, finished[i], example)
                totals[f"{mode}_correct"] += correct / k
                totals[f"{mode}_format"] += task.format_reward(text, finished[i]) / k
                if mode == "greedy":
                    for key, value in task.sample_metrics(text, example).items():
                        totals[f"greedy_{key}"] = totals.get(f"greedy_{key}", 0.0) + value
                if mode == "greedy" and len(rows) < cfg.n_table:
                    rows.append({"prompt": example.prompt, "answer": example.answer, "completion": text, "correct": correct})
        bar.update(len(chunk))
    bar.close()
    n = max(len(examples), 1)
    metrics = {
        "greedy_accuracy": totals["greedy_correct"] / n,
        "sampled_accuracy": totals["sampled_correct"] / n,
        "greedy_format_rate": totals["greedy_format"] / n,
        "sampled_format_rate": totals["sampled_format"] / n,
        "n_prompts": float(len(examples)),
        **{key: value / n for key, value in totals.items() if key not in _COUNTED},
    }
    return metrics, rows
