"""Preference pairs: (prompt, chosen, rejected) plus how much worse the rejected answer is, as JSON lines.

    {"prompt": "37+48=", "chosen": "85", "rejected": "84", "severity": 0.333, "gold": null}

A pairs file a user brings (`preference.pairs`, `reward_model.pairs`) may also be Parquet or CSV (read by the
dataset task's loader, tasks/tables.py), and its prompt, chosen and rejected may be chat messages
([{role, content}], as TRL's conversational preference data): chosen / rejected then count by their last
assistant turn and the prompt by its last user turn (taken from `chosen` when there is no `prompt`).

`severity` is the normalised severity gap g in [0, 1] between the two answers (GM-DPO's margin and weight);
`gold` is an optional human label for ABC-Align: true when a human agrees that `chosen`
is better, false when the human prefers `rejected`, null when the pair has only the (pseudo) label that
ordered it. Builders registered in `preference_data` make pairs from a task or a synthetic benchmark.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.errors import UserError
from posttrain.registry import Registry
from posttrain.tasks import Example, Task
from posttrain.tasks.base import prompt_key
from posttrain.tasks.tables import read_tables

preference_data: Registry = Registry("preference dataset")

SEVERITY_TIERS = {1: "minor", 2: "moderate", 3: "severe"}


def split_by_prompt(examples: Sequence[Example], seed: int) -> tuple[list[Example], list[Example]]:
    """The examples halved by prompt (`prompt_key`; every copy of a prompt on one side), drawn with `seed`: e.g.
    RL prompts and the disjoint prompts a reward model learns from, so that it never saw the answers RL asks for."""
    keys = sorted({prompt_key(e) for e in examples})
    random.Random(seed).shuffle(keys)
    first = set(keys[: len(keys) // 2])
    return [e for e in examples if prompt_key(e) in first], [e for e in examples if prompt_key(e) not in first]


def reward_model_prompts(examples: Sequence[Example], prompts: str, seed: int) -> tuple[list[Example], list[Example]]:
    """(the examples a reward model's pairs come from, the examples RL against it runs on), by `reward_model.prompts`:
    `disjoint` gives the two halves of `split_by_prompt` (RL the first, as reward_model_rl's arms), `same` every
    example to both."""
    if prompts == "same":
        return list(examples), list(examples)
    rl, rm = split_by_prompt(examples, seed)
    return rm, rl


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    severity: float  # normalised severity gap in [0, 1]; 0: the two answers are equally bad/good in severity
    gold: bool | None  # human label, where one exists (ABC-Align); None: pseudo/ordering label only


_REQUIRED = {"prompt", "chosen", "rejected"}
_OPTIONAL = {"severity", "gold"}


def write_pairs(path: Path, pairs: Sequence[PreferencePair]) -> None:
    with path.open("w") as f:
        for pair in pairs:
            f.write(json.dumps(asdict(pair)) + "\n")


def _pair_from(record: object, where: str) -> PreferencePair:
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected an object with fields {sorted(_REQUIRED)} (optional {sorted(_OPTIONAL)})")
    missing, unknown = _REQUIRED - set(record), set(record) - _REQUIRED - _OPTIONAL
    if missing or unknown:
        problem = f"missing field {sorted(missing)[0]!r}" if missing else f"unknown field {sorted(unknown)[0]!r}"
        raise UserError(f"{where}: {problem}; a pair has {sorted(_REQUIRED)} and optionally {sorted(_OPTIONAL)}")
    for key in _REQUIRED:
        if not isinstance(record[key], str):
            raise UserError(f"{where}: field {key!r} must be a string, got {type(record[key]).__name__}")
    if record["chosen"] == record["rejected"]:
        raise UserError(f"{where}: chosen and rejected are the same text")
    severity = record.get("severity", 0.0)
    if isinstance(severity, bool) or not isinstance(severity, (int, float)) or not math.isfinite(severity) or not 0 <= severity <= 1:
        raise UserError(f"{where}: severity must be a number in [0, 1], got {severity!r}")
    gold = record.get("gold")
    if gold is not None and not isinstance(gold, bool):
        raise UserError(f"{where}: gold must be true, false or null, got {gold!r}")
    return PreferencePair(record["prompt"], record["chosen"], record["rejected"], float(severity), gold)


def _last_turn(value: object, role: str) -> object:
    """The content of the last `role` turn of a list of messages; any other value as it is."""
    return next((m["content"] for m in reversed(value) if m["role"] == role), value) if _is_messages(value) else value


def _is_messages(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in value)


def _flattened(record: object, csv: bool) -> object:
    """A record with chat messages as text (prompt: last user turn; chosen / rejected: last assistant turn), and
    CSV's text cells as the numbers and flags they stand for."""
    if not isinstance(record, dict):
        return record
    record = dict(record)
    if "prompt" not in record and _is_messages(record.get("chosen")):
        record["prompt"] = record["chosen"]
    for key, role in (("prompt", "user"), ("chosen", "assistant"), ("rejected", "assistant")):
        if key in record:
            record[key] = _last_turn(record[key], role)
    for key in _OPTIONAL:
        if record.get(key) is None or (csv and record[key] == ""):
            record.pop(key, None)  # an empty cell or a null: the default
        elif csv:
            text = record[key].strip().lower()
            try:
                record[key] = {"true": True, "false": False}[text] if key == "gold" else float(text)
            except (KeyError, ValueError):
                pass  # left as text: refused below with the field's name
    return record


def read_pairs(location: str | Path) -> list[PreferencePair]:
    """Read and check a file of pairs (JSON lines, Parquet or CSV; local or s3://); a malformed row is a
    `UserError` naming file and line (row)."""
    pairs = []
    for table in read_tables(location, "preference"):
        csv = str(location).lower().endswith(".csv")
        pairs += [_pair_from(_flattened(record, csv), where) for where, record in zip(table.wheres, table.rows)]
    return pairs


def error_tier(task: Task, wrong: str, right: str) -> int:
    """Severity tier of a wrong answer: 3 malformed, 1 a one-character near miss, 2 any other wrong answer."""
    if task.format_reward(wrong, True) == 0.0:
        return 3
    return 1 if len(wrong) == len(right) and sum(a != b for a, b in zip(wrong, right)) == 1 else 2


@preference_data.register("policy_pairs", needs_policy=True)
def policy_pairs(task: Task, examples: Sequence[Example], n: int, seed: int, *, policy) -> list[PreferencePair]:
    """`n` pairs from the policy's own samples labelled by the task's verifier (how RLHF collects reward-model
    data: on-policy samples, judged): per prompt, 8 samples at temperature 1; chosen = a sample the verifier
    accepts (the reference answer when none does), rejected = one it rejects (unfinished samples included, as
    text); at most 2 pairs per prompt; severity = error_tier / 3. `policy` = (model, tokenizer, max_new_tokens)."""
    import torch

    from posttrain.rollout.sampling import generate

    model, tokenizer, max_new_tokens = policy
    rng, generator = random.Random(seed), torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    pairs: list[PreferencePair] = []
    for start in range(0, len(order), 256):
        chunk = [examples[i] for i in order[start : start + 256]]
        _, texts = generate(model, tokenizer, [e.prompt for e in chunk], max_new_tokens, group_size=8, generator=generator)
        for k, example in enumerate(chunk):
            group = list(dict.fromkeys(texts[8 * k : 8 * k + 8]))
            right = [t for t in group if task.correctness_reward(t, True, example) == 1.0] or [example.completion]
            wrong = [t for t in group if task.correctness_reward(t, True, example) == 0.0]
            for rejected in rng.sample(wrong, min(2, len(wrong))):
                chosen = rng.choice(right)
                pairs.append(PreferencePair(example.prompt, chosen, rejected, round(error_tier(task, rejected, chosen) / 3, 6), None))
        if len(pairs) >= n:
            break
    if not pairs:
        raise UserError("policy_pairs: the policy's samples held no wrong answer to reject; use data: task_pairs")
    return pairs[:n]


def corrupt(task: Task, example: Example, tier: int, rng: random.Random) -> str | None:
    """A wrong answer to `example` of the given severity tier, or None if none can be made:
    1 (minor) a near miss in the last character, 2 (moderate) a wrong leading character (a large error),
    3 (severe) a malformed answer the task's format check rejects."""
    answer = example.completion
    digits = [c for c in "0123456789" if c in task.alphabet()]
    for _ in range(20):
        if tier == 3:
            junk = rng.choice([c for c in task.alphabet() if c not in digits] or ["="])
            cut = rng.randrange(len(answer) + 1)
            wrong = answer[:cut] + junk + answer[cut:]
        else:
            at = len(answer) - 1 if tier == 1 else (1 if answer.startswith("-") and len(answer) > 1 else 0)
            if tier == 2 and at == len(answer) - 1:  # a one-digit answer: a large error is an extra leading digit
                wrong = rng.choice(digits[1:]) + answer
            else:
                wrong = answer[:at] + rng.choice([d for d in digits if d != answer[at]] or ["9"]) + answer[at + 1 :]
        well_formed = task.format_reward(wrong, True) == 1.0
        if task.correctness_reward(wrong, True, example) == 0.0 and well_formed == (tier != 3):
            return wrong
    return None


@preference_data.register("task_pairs")
def task_pairs(task: Task, examples: Sequence[Example], n: int, seed: int) -> list[PreferencePair]:
    """`n` pairs (reference answer > corrupted answer) over `examples`, severity tiers 1-3 in equal shares;
    severity = tier / 3. Every chosen answer passes the task's verifier and every rejected one fails it."""
    rng = random.Random(seed)
    pairs: list[PreferencePair] = []
    while len(pairs) < n:
        example = examples[rng.randrange(len(examples))]
        tier = 1 + len(pairs) % 3
        wrong = corrupt(task, example, tier, rng)
        if wrong is not None:
            pairs.append(PreferencePair(example.prompt, example.completion, wrong, round(tier / 3, 6), None))
    return pairs
