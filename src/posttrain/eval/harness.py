"""Held-out evaluation: greedy accuracy, sampled accuracy (k samples per prompt), format rate, and over the k
samples pass@1, pass@k and majority@k (eval/sampling.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import EvalConfig
from posttrain.eval.sampling import sample_metrics as over_samples
from posttrain.models.sampling import generate
from posttrain.tasks import Example, Task


_COUNTED = ("greedy_correct", "greedy_format", "sampled_correct", "sampled_format")


def evaluate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, examples: Sequence[Example], cfg: EvalConfig, seed: int
) -> tuple[dict[str, float], list[dict[str, object]]]:
    examples = list(examples)[: cfg.n_prompts]
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    totals = {"greedy_correct": 0.0, "greedy_format": 0.0, "sampled_correct": 0.0, "sampled_format": 0.0}
    rows: list[dict[str, object]] = []
    prompts = examples  # with their system prompts, for a chat template
    votes: list[list[tuple[str | None, float]]] = [[] for _ in examples]  # per prompt: (parsed answer, correctness) per sample
    for mode, k in (("greedy", 1), ("sampled", cfg.samples_per_prompt)) if examples else ():
        # `batch_size` prompts at a time (bounded memory); greedy decoding draws no random numbers from `generator`
        samples, texts = generate(model, tokenizer, prompts, cfg.max_new_tokens, group_size=k, temperature=cfg.temperature,
                                  greedy=mode == "greedy", generator=generator, chunk=cfg.batch_size, stop=cfg.stop)
        finished = samples.finished.tolist()
        for i, text in enumerate(texts):
            example = examples[i // k]
            correct = task.correctness_reward(text, finished[i], example)
            totals[f"{mode}_correct"] += correct / k
            totals[f"{mode}_format"] += task.format_reward(text, finished[i]) / k
            if mode == "sampled":
                votes[i // k].append((task.parse(text), correct))
            if mode == "greedy":
                for key, value in task.sample_metrics(text, example).items():
                    totals[f"greedy_{key}"] = totals.get(f"greedy_{key}", 0.0) + value
            if mode == "greedy" and len(rows) < cfg.n_table:
                rows.append({"prompt": example.prompt, "answer": example.answer, "completion": text, "correct": correct})
    n = max(len(examples), 1)
    metrics = {
        "greedy_accuracy": totals["greedy_correct"] / n,
        "sampled_accuracy": totals["sampled_correct"] / n,
        "greedy_format_rate": totals["greedy_format"] / n,
        "sampled_format_rate": totals["sampled_format"] / n,
        "n_prompts": float(len(examples)),
        **{key: value / n for key, value in totals.items() if key not in _COUNTED},
        **over_samples(votes),
    }
    return metrics, rows
