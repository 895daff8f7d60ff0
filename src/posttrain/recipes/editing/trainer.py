"""Lifelong knowledge editing: apply a stream of edits one by one with the method named by `edit.method`
(recipes/editing/objective.py), and measure what GLIME reports, each in [0, 1]:

    edit_success       o_new is the greedy answer on p_e right after its edit (mean over edits)
    retention          after the whole stream, o_new is still the greedy answer on p_e, for the earlier edits
                       (all but the last)
    generalization     after the stream, o_new is the greedy answer on the held-out paraphrases of the edited facts
    locality           after the stream, the answer on every prompt of the unedited facts is what the base model said
    unedited_accuracy  after the stream, the true object is the answer on the unedited facts (held-out knowledge)

Only the parameters whose names contain one of `edit.params` are edited; each edit gets a fresh SGD optimiser
(plain SGD keeps GLIME's constraint meaningful: the step is the constrained direction, not a per-coordinate
rescaling of it). Greedy answers come from the shared generation helper (rollout/sampling.py `generate`). Every
optimiser step is guarded (trainers/loop.py: a non-finite step is skipped and counted); in a stage a checkpoint every
`edit.checkpoint_every` edits holds the model, the replay generator, the memory of edit records and the history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.recipes.editing.facts import Edit, FactSet, split_facts
from posttrain.data.preferences import PreferencePair
from posttrain.errors import UserError
from posttrain.recipes.editing.objective import EditRecord, EditStep, edit_methods
from posttrain.rollout.sampling import generate
from posttrain.runtime import progress
from posttrain.trainers.loop import TrainLoop
from posttrain.trainers.preference import all_sequence_logps, encode_pairs, sequence_logps

PROBE_CHUNK = 512  # prompts per greedy-decoding batch


def greedy_answers(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    if not prompts:
        return []
    return generate(model, tokenizer, list(prompts), max_new_tokens, greedy=True, chunk=PROBE_CHUNK)[1]


def accuracy(model, tokenizer, prompts: Sequence[str], targets: Sequence[str], max_new_tokens: int) -> float:
    if not prompts:
        return float("nan")
    answers = greedy_answers(model, tokenizer, prompts, max_new_tokens)
    return sum(a == t for a, t in zip(answers, targets)) / len(prompts)


def edited_parameters(model: PreTrainedModel, patterns: Sequence[str]) -> list[torch.nn.Parameter]:
    """Freeze every parameter except those whose name contains one of `patterns`; return those."""
    chosen = []
    for name, p in model.named_parameters():
        p.requires_grad_(any(pattern in name for pattern in patterns))
        if p.requires_grad:
            chosen.append(p)
    if not chosen:
        raise UserError(f"edit.params {list(patterns)} matches no parameter of the model (names look like {name!r})")
    return chosen


def make_record(model, tokenizer, facts: FactSet, edit: Edit, max_new_tokens: int) -> EditRecord:
    """The edit's prompt and its generation-preference pairs, with reference log-probs from the model as it is now."""
    paraphrases = facts.prompts(edit.subject, edit.relation, "paraphrase")
    own = greedy_answers(model, tokenizer, paraphrases, max_new_tokens)
    pairs = tuple(PreferencePair(p, edit.new, y if y and y != edit.new else edit.old, 0.0, None) for p, y in zip(paraphrases, own))
    ref_chosen, ref_rejected = all_sequence_logps(model, encode_pairs(tokenizer, pairs, next(model.parameters()).device))
    prompt = facts.prompt(edit.subject, edit.relation, 0)
    return EditRecord(edit, prompt, PreferencePair(prompt, edit.new, edit.old, 0.0, None), pairs, ref_chosen, ref_rejected)


def record_state(record: EditRecord) -> dict[str, Any]:
    """`record` as strings, floats and tensors (what a checkpoint holds); `record_from_state` reverses it."""
    return {"edit": asdict(record.edit), "prompt": record.prompt, "edit_pair": asdict(record.edit_pair),
            "pref_pairs": [asdict(p) for p in record.pref_pairs], "ref_chosen": record.ref_chosen, "ref_rejected": record.ref_rejected}


def record_from_state(state: dict[str, Any]) -> EditRecord:
    return EditRecord(Edit(**state["edit"]), state["prompt"], PreferencePair(**state["edit_pair"]),
                      tuple(PreferencePair(**p) for p in state["pref_pairs"]), state["ref_chosen"], state["ref_rejected"])


def pair_scorer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
    """The edit methods' forward pass: pairs -> (chosen, rejected) sequence log-probs [N], with gradient."""
    device = next(model.parameters()).device
    return lambda pairs: sequence_logps(model, encode_pairs(tokenizer, pairs, device))


def apply_edits(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, facts: FactSet, edits: Sequence[Edit], cfg, seed: int,
    on_log: Callable[[int, dict[str, float]], None], loop: TrainLoop | None = None,
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Apply `edits` in order to `model` (in place) with `cfg.method` (an EditConfig); return the per-edit history
    and the final metrics, with `base_*` twins measured before the first edit and `nonfinite_steps`. `loop`'s
    checkpoints count edits; its guard sees every optimiser step (numbered across edits)."""
    loop = loop or TrainLoop()
    entry = edit_methods.entry(cfg.method)
    opts = cfg.options_for(cfg.method)
    max_new = max(len(o) for objs in facts.objects.values() for o in objs) + 1
    params = edited_parameters(model, cfg.params)
    split = split_facts(facts, edits)
    local_prompts = [p for s, r in split["unedited"] for p in facts.all_prompts(s, r)]
    local_truth = [facts.facts[s, r] for s, r in split["unedited"] for _ in facts.all_prompts(s, r)]
    base_local = greedy_answers(model, tokenizer, local_prompts, max_new)
    base = final_metrics(model, tokenizer, facts, edits, local_prompts, local_truth, base_local, max_new)
    generator = torch.Generator().manual_seed(seed)
    scorer = pair_scorer(model, tokenizer)
    start, saved = loop.restore(model, {"generator": generator})  # after the base answers: those are the base model's
    memory: list[EditRecord] = [record_from_state(r) for r in saved.get("memory", [])]
    history: list[dict[str, float]] = saved.get("history", [])
    model.train()
    bar = progress(len(edits), f"edit ({cfg.method})", initial=start)
    for index, edit in enumerate(edits[start:], start=start + 1):
        record = make_record(model, tokenizer, facts, edit, max_new)
        optimizer = torch.optim.SGD(params, lr=cfg.lr)  # fresh per edit: nothing to checkpoint
        for inner in range(1, cfg.steps_per_edit + 1):
            metrics = entry.obj(EditStep(scorer, params, [record], memory, generator), opts)
            loss = sum(v for k, v in metrics.items() if k.startswith("loss/"))  # the method's loss terms, for the guard
            grad_norm = loop.optimizer_step((index - 1) * cfg.steps_per_edit + inner, loss, params, optimizer, cfg.max_grad_norm)
        memory.append(record)
        metrics.update(grad_norm=grad_norm, edit_success=accuracy(model, tokenizer, [record.prompt], [edit.new], max_new))
        if index % cfg.log_every == 0 or index == len(edits):
            metrics["running_retention"] = accuracy(model, tokenizer, [r.prompt for r in memory], [r.edit.new for r in memory], max_new)
        history.append({"edit": float(index), **metrics})
        on_log(index, metrics)
        bar.update()
        loop.checkpoint(index, len(edits), model, {"generator": generator},
                        {"history": history, "memory": [record_state(r) for r in memory]})
    bar.close()
    after = final_metrics(model, tokenizer, facts, edits, local_prompts, local_truth, base_local, max_new)
    after["edit_success"] = sum(h["edit_success"] for h in history) / max(len(history), 1)
    return history, {**{f"base_{k}": v for k, v in base.items()}, **after, "n_edits": float(len(edits)), **loop.metrics()}


def final_metrics(model, tokenizer, facts: FactSet, edits: Sequence[Edit], local_prompts, local_truth, base_local, max_new) -> dict:
    earlier, edit_prompt = edits[:-1], lambda e: facts.prompt(e.subject, e.relation, 0)
    heldout = [(p, e.new) for e in edits for p in facts.prompts(e.subject, e.relation, "heldout")]
    paraphrase = [(p, e.new) for e in edits for p in facts.prompts(e.subject, e.relation, "paraphrase")]
    local_now = greedy_answers(model, tokenizer, local_prompts, max_new)
    return {
        "retention": accuracy(model, tokenizer, [edit_prompt(e) for e in earlier], [e.new for e in earlier], max_new),
        "final_edit_accuracy": accuracy(model, tokenizer, [edit_prompt(e) for e in edits], [e.new for e in edits], max_new),
        "generalization": accuracy(model, tokenizer, [p for p, _ in heldout], [t for _, t in heldout], max_new),
        "paraphrase_accuracy": accuracy(model, tokenizer, [p for p, _ in paraphrase], [t for _, t in paraphrase], max_new),
        "locality": sum(a == b for a, b in zip(local_now, base_local)) / max(len(local_prompts), 1),
        "unedited_accuracy": sum(a == t for a, t in zip(local_now, local_truth)) / max(len(local_prompts), 1),
    }
