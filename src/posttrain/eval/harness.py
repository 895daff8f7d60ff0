"""Held-out evaluation: greedy accuracy, sampled accuracy (k samples per prompt), format rate, and over the k
samples pass@1, pass@k and majority@k (eval/sampling.py); then the inference-time sampler `eval.sampler`
(rollout/samplers.py) as `sampler_*`: accuracy, format rate, pass@k over its answers where it draws several,
tokens per answer and forward tokens per answer (all, prompt, generated and per context), so samplers compare
at matched compute. Greedy and sampled passes report their forward tokens per answer too. A multi-turn task (one
with a `sampler`: the text world, the market sandbox) is evaluated on its episodes, greedy or sampled turn by turn.
With `eval.best_of_n.n` > 0, best-of-N over that many answers per prompt from `eval.sampler` (eval/best_of_n.py) as `bon_*`: one accuracy
per pick (`bon_oracle_accuracy`, `bon_vote_accuracy`, `bon_likelihood_accuracy`) and the forward tokens per prompt
the N draws cost. With `eval.group_by` keys, greedy and sampled accuracy also per value of each metadata key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import EvalConfig
from posttrain.errors import UserError
from posttrain.eval.best_of_n import best_of_n_metrics
from posttrain.eval.sampling import sample_metrics as over_samples
from posttrain.rollout.samplers import Sampled, SampleRequest, draw, samplers
from posttrain.tasks import Example, Task


def evaluate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, examples: Sequence[Example], cfg: EvalConfig, seed: int
) -> tuple[dict[str, float], list[dict[str, object]]]:
    episodes = task.sampler(tokenizer) if hasattr(task, "sampler") else None  # a multi-turn environment plays its episodes
    if episodes is not None and not samplers.entry(cfg.sampler).meta.get("episodes", False):
        players = ", ".join(e.name for e in samplers if e.meta.get("episodes", False))
        raise UserError(f"eval.sampler {cfg.sampler} cannot play the episodes of a multi-turn task; use one that can: {players}")
    examples = list(examples)[: cfg.n_prompts]
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    request = SampleRequest(cfg.max_new_tokens, cfg.samples_per_prompt, cfg.temperature, tuple(cfg.stop), cfg.batch_size, episodes)
    metrics: dict[str, float] = {"n_prompts": float(len(examples))}
    rows: list[dict[str, object]] = []
    if not examples:
        return {"greedy_accuracy": 0.0, "sampled_accuracy": 0.0, "greedy_format_rate": 0.0, "sampled_format_rate": 0.0,
                "n_prompts": 0.0}, rows
    # greedy decoding draws no random numbers from `generator`
    greedy = draw("greedy", model, tokenizer, examples, request, None, generator)
    metrics.update(answer_metrics("greedy", greedy, task, examples, with_task_metrics=True))
    rows = [{"prompt": examples[i].prompt, "answer": examples[i].answer, "completion": text,
             "correct": task.correctness_reward(text, bool(greedy.samples.finished[i]), examples[i])}
            for i, text in enumerate(greedy.texts[: cfg.n_table])]
    sampled = draw("temperature", model, tokenizer, examples, request, None, generator)
    for key in cfg.group_by:
        metrics.update(group_accuracy("greedy", greedy, task, examples, key))
        metrics.update(group_accuracy("sampled", sampled, task, examples, key))
    sampled_metrics = answer_metrics("sampled", sampled, task, examples, votes=True)
    metrics.update({k: v for k, v in sampled_metrics.items() if not k.startswith(("sampled_pass_at", "sampled_majority_at"))})
    metrics.update({k.removeprefix("sampled_"): v for k, v in sampled_metrics.items() if k.startswith(("sampled_pass_at", "sampled_majority_at"))})
    if cfg.sampler in ("greedy", "temperature"):  # the pass above is that sampler's
        chosen = greedy if cfg.sampler == "greedy" else sampled
    else:
        chosen = draw(cfg.sampler, model, tokenizer, examples, request, cfg.options_for(cfg.sampler), generator)
    metrics.update(answer_metrics("sampler", chosen, task, examples))
    metrics.update({f"sampler_{k}": float(v) for k, v in chosen.stats.items()})
    best = getattr(cfg, "best_of_n", None)
    if best is not None and best.n > 0:
        bon_request = replace(request, n=best.n)
        drawn = draw(cfg.sampler, model, tokenizer, examples, bon_request, cfg.options_for(cfg.sampler), generator)
        metrics.update(best_of_n_metrics("bon", drawn, task, examples, best.picks))
    return metrics, rows


def greedy_metrics(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, examples: Sequence[Example],
                   max_new_tokens: int, stop: Sequence[str], batch_size: int) -> dict[str, float]:
    """Greedy decoding only: `greedy_accuracy`, `greedy_format_rate`, tokens per answer (the periodic held-out check
    of a training run; it draws no random numbers, so the run's own sampling is unchanged)."""
    request = SampleRequest(max_new_tokens, 1, 1.0, tuple(stop), batch_size, None)
    greedy = draw("greedy", model, tokenizer, list(examples), request, None, torch.Generator(device=next(model.parameters()).device))
    return answer_metrics("greedy", greedy, task, examples)


def group_accuracy(prefix: str, sampled: Sampled, task: Task, examples: Sequence[Example], key: str) -> dict[str, float]:
    """`<prefix>_accuracy_<key>_<value>`: the accuracy over the examples whose metadata `key` is `value` (e.g. the word
    problems' `steps`: one-step and two-step problems apart); examples without the key are left out."""
    k = sampled.per_prompt
    finished = sampled.samples.finished.tolist()
    scores: dict[str, list[float]] = {}
    for i, text in enumerate(sampled.texts):
        value = examples[i // k].metadata.get(key)
        if value is not None:
            scores.setdefault(re.sub(r"[^\w.-]", "_", str(value)), []).append(task.correctness_reward(text, finished[i], examples[i // k]))
    return {f"{prefix}_accuracy_{key}_{value}": sum(v) / len(v) for value, v in sorted(scores.items())}


def answer_metrics(prefix: str, sampled: Sampled, task: Task, examples: Sequence[Example], with_task_metrics: bool = False,
                   votes: bool = False) -> dict[str, float]:
    """`<prefix>_accuracy`, `_format_rate`, `_tokens_per_answer`, `_forward_tokens_per_answer` (and one per kind
    of forward token), and with several answers per prompt (or `votes`) `_pass_at_<k>`, `_majority_at_<n>`."""
    k = sampled.per_prompt
    answers = len(sampled.texts)
    finished = sampled.samples.finished.tolist()
    correct = fmt = 0.0
    extra: dict[str, float] = {}
    ballots: list[list[tuple[str | None, float]]] = [[] for _ in examples]
    for i, text in enumerate(sampled.texts):
        example = examples[i // k]
        score = task.correctness_reward(text, finished[i], example)
        correct += score
        fmt += task.format_reward(text, finished[i])
        ballots[i // k].append((task.parse(text), score))
        if with_task_metrics:
            for key, value in task.sample_metrics(text, example).items():
                extra[f"{prefix}_{key}"] = extra.get(f"{prefix}_{key}", 0.0) + value / answers
    out = {
        f"{prefix}_accuracy": correct / answers,
        f"{prefix}_format_rate": fmt / answers,
        f"{prefix}_tokens_per_answer": float(sampled.samples.completion_mask.sum()) / answers,
        f"{prefix}_forward_tokens_per_answer": sampled.total_forward_tokens / answers,
        **{f"{prefix}_forward_tokens_{kind}_per_answer": value / answers for kind, value in sampled.forward_tokens.items()},
        **extra,
    }
    if k > 1 or votes:
        out.update({f"{prefix}_{key}": value for key, value in over_samples(ballots).items()})
    return out


__all__ = ["answer_metrics", "evaluate", "samplers"]
