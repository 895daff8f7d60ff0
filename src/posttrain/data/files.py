"""Data files: examples as JSON lines (one `{"prompt", "completion", "answer"}` object per line, plus the optional
`system`, `messages` and `metadata` where an example has them), and parquet tables.

Every reader here ends a bad file with one `UserError` line naming the file and, for JSON lines, the line.
`check_examples` is the second half of reading examples: whether they fit the model a stage loaded (its
vocabulary and its positions), which only that stage knows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.errors import UserError
from posttrain.tasks import Example
from posttrain.tasks.tables import json_lines, value_kind

__all__ = ["check_examples", "json_lines", "read_examples", "read_parquet", "write_examples"]

_REQUIRED = ("prompt", "completion", "answer")
_OPTIONAL = ("system", "messages", "metadata")  # written only where set, so files of generated tasks keep three fields


def write_examples(path: Path, examples: list[Example]) -> None:
    with path.open("w") as f:
        for e in examples:
            record: dict[str, Any] = {"prompt": e.prompt, "completion": e.completion, "answer": e.answer}
            if e.system is not None:
                record["system"] = e.system
            if e.messages is not None:
                record["messages"] = [dict(m) for m in e.messages]
            if e.metadata:
                record["metadata"] = dict(e.metadata)
            f.write(json.dumps(record, default=str) + "\n")  # default: a dataset's dates and the like as text


def _record_problem(record: object) -> str | None:
    """What is wrong with one parsed line of an examples file, or None."""
    if not isinstance(record, dict):
        return f"got {type(record).__name__}"
    missing = [k for k in _REQUIRED if k not in record]
    unknown = sorted(set(record) - set(_REQUIRED) - set(_OPTIONAL))
    if missing or unknown:
        return f"missing field {missing[0]!r}" if missing else f"unknown field {unknown[0]!r}"
    wrong = [k for k in _REQUIRED if not isinstance(record[k], str)]
    if record.get("system") is not None and not isinstance(record["system"], str):
        wrong.append("system")
    if wrong:
        return f"field {wrong[0]!r} must be a string, got {type(record[wrong[0]]).__name__}"
    if record.get("messages") is not None and value_kind(record["messages"]) != "conversation":
        return "field 'messages' must be a list of {role, content} messages with a user turn"
    if not isinstance(record.get("metadata", {}), dict):
        return f"field 'metadata' must be an object, got {type(record['metadata']).__name__}"
    return None


def read_examples(path: Path) -> list[Example]:
    """Read and check a JSON-lines file; a malformed line or an empty prompt (nothing to condition on: the
    model would learn the answers unprompted) is a `UserError` naming file and line."""
    examples = []
    for where, record in json_lines(path, "dataset"):
        problem = _record_problem(record)
        if problem is not None:
            raise UserError(f"{where}: expected an object with string fields {list(_REQUIRED)} (optional {list(_OPTIONAL)}); {problem}")
        if not record["prompt"].strip():
            raise UserError(f"{where}: empty prompt")
        messages = record.get("messages")
        examples.append(Example(record["prompt"], record["completion"], record["answer"], record.get("system"),
                                None if messages is None else tuple({"role": m["role"], "content": m["content"]} for m in messages),
                                record.get("metadata", {})))
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples


def check_examples(path: Path, examples: Sequence[Example], model, tokenizer, reserved: int, reserved_for: str,
                   supervised: bool = False) -> None:
    """Refuse examples that do not fit the model a stage is about to use, naming file, row and problem.

    - Characters outside the tokenizer's vocabulary are refused, not trained on: `<unk>` would silently stand
      for all of them. This holds for the character tokenizer SFT builds from the task's alphabet (data of
      another task, or a typo, fails here) and for a pretrained tokenizer alike; a byte-level tokenizer has no
      unknown token and accepts any text.
    - The tokens the model reads plus `reserved` positions (`reserved_for`: the generation budget of a sampling
      stage) must fit in the model's max_position_embeddings (`model.max_positions` for a tiny model): past it a
      rotary model does not fail, it degrades silently. What the model reads is the prompt as encoded
      (models/chat.py: the chat template with its system turn and generation prompt, `model.max_prompt_tokens`'s
      truncation), or with `supervised` the whole SFT row (conversation or prompt + completion + EOS). The
      tokenizer must carry the stage's prompt format already (`prepare_model` attaches it).

    `row` counts examples from 1: it is the line number unless the file holds blank lines."""
    from posttrain.models.chat import prompt_ids, supervised_row
    from posttrain.models.tokenizer import check_vocabulary

    positions = getattr(model.config, "max_position_embeddings", None)
    what = "the SFT row" if supervised else "the prompt"
    for row, example in enumerate(examples, start=1):
        texts = [example.prompt, *([example.completion] if supervised else []), *([example.system] if example.system else []),
                 *(m["content"] for m in example.messages or ())]
        check_vocabulary(tokenizer, texts, f"{path} row {row}")
        used = len(supervised_row(tokenizer, example)[0] if supervised else prompt_ids(tokenizer, [example])[0])
        if positions is not None and used + reserved > positions:
            budget = f"; with {reserved} for {reserved_for} that is {used + reserved}" if reserved else ""
            raise UserError(f"{path} row {row}: {what} is {used} tokens as the model reads it{budget}, more than the model's "
                            f"{positions} positions")


def read_parquet(path: Path, what: str):
    """A parquet table as a DataFrame; a missing or damaged file is a `UserError` (pyarrow raises its own
    ArrowInvalid for a truncated, empty or foreign file, OSError for an unreadable one)."""
    import pandas as pd
    import pyarrow

    if not path.is_file():
        raise UserError(f"{what}: missing table {path}")
    try:
        return pd.read_parquet(path)
    except (pyarrow.ArrowException, OSError) as e:
        raise UserError(f"{what}: cannot read {path}: {str(e).splitlines()[0][:200]}") from None
