"""Data files: examples as JSON lines (one `{"prompt", "completion", "answer"}` object per line), and parquet tables.

Every reader here ends a bad file with one `UserError` line naming the file and, for JSON lines, the line.
`check_examples` is the second half of reading examples: whether they fit the model a stage loaded (its
vocabulary and its positions), which only that stage knows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import MISSING, asdict, fields
from pathlib import Path

from posttrain.errors import UserError
from posttrain.tasks import Example

_FIELDS = {"prompt", "completion", "answer"}  # required; `system`, `messages` and `metadata` are optional
_OPTIONAL = {f.name: f.default if f.default_factory is MISSING else f.default_factory() for f in fields(Example) if f.name not in _FIELDS}


def write_examples(path: Path, examples: list[Example]) -> None:
    """One JSON object per example; optional fields only where they are set (plain task data keeps three keys)."""
    with path.open("w") as f:
        for example in examples:
            record = {k: v for k, v in asdict(example).items() if k in _FIELDS or v != _OPTIONAL[k]}
            f.write(json.dumps(record) + "\n")


def _valid_optional(record: dict) -> bool:
    system, messages, metadata = record.get("system"), record.get("messages"), record.get("metadata", {})
    turns_ok = messages is None or (isinstance(messages, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages))
    return (system is None or isinstance(system, str)) and turns_ok and isinstance(metadata, dict)


def json_lines(path: Path, what: str) -> Iterator[tuple[str, object]]:
    """(`file:line`, parsed record) for each non-blank line; a missing file, bytes that are not UTF-8 or bad JSON
    is a `UserError` naming the line (lines are split as bytes and decoded one by one, so the line is exact)."""
    if not path.is_file():
        raise UserError(f"{what} file not found: {path}")
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = raw[e.start : e.start + 1]
                raise UserError(f"{path}:{number}: not UTF-8 text (byte {e.start + 1} of the line is {bad!r})") from None
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{number}: not valid JSON ({e.msg})") from None


def read_examples(path: Path) -> list[Example]:
    """Read and check a JSON-lines file; a malformed line or an empty prompt (nothing to condition on: the
    model would learn the answers unprompted) is a `UserError` naming file and line."""
    examples = []
    for where, record in json_lines(path, "dataset"):
        if (not isinstance(record, dict) or not _FIELDS <= set(record) <= _FIELDS | set(_OPTIONAL)
                or not all(isinstance(record[k], str) for k in _FIELDS) or not _valid_optional(record)):
            raise UserError(f"{where}: expected an object with string fields {sorted(_FIELDS)} (and optional {sorted(_OPTIONAL)})")
        if not record["prompt"].strip():
            raise UserError(f"{where}: empty prompt")
        if record.get("messages") is not None:
            record["messages"] = tuple(record["messages"])
        examples.append(Example(**record))
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples


def check_examples(path: Path, examples: Sequence[Example], model, tokenizer, reserved: int, reserved_for: str,
                   columns: tuple[str, ...] = ("prompt",)) -> None:
    """Refuse examples that do not fit the model a stage is about to use, naming file, row and problem.

    - Characters outside the tokenizer's vocabulary are refused, not trained on: `<unk>` would silently stand
      for all of them. This holds for the character tokenizer SFT builds from the task's alphabet (data of
      another task, or a typo, fails here) and for a pretrained tokenizer alike; a byte-level tokenizer has no
      unknown token and accepts any text.
    - `columns` (tokenized, no special tokens) plus `reserved` positions (`reserved_for`: EOS for SFT, the
      generation budget of a sampling stage) must fit in the model's max_position_embeddings
      (`model.max_positions` for a tiny model): past it a rotary model does not fail, it degrades silently.

    `row` counts examples from 1: it is the line number unless the file holds blank lines."""
    from posttrain.models.tokenizer import check_vocabulary

    positions = getattr(model.config, "max_position_embeddings", None)
    for row, example in enumerate(examples, start=1):
        texts = [getattr(example, name) for name in columns]
        check_vocabulary(tokenizer, texts, f"{path} row {row}")
        used = sum(len(tokenizer.encode(text, add_special_tokens=False)) for text in texts)
        if positions is not None and used + reserved > positions:
            raise UserError(f"{path} row {row}: {' + '.join(columns)} is {used} tokens; with {reserved} for {reserved_for} that is "
                            f"{used + reserved}, more than the model's {positions} positions")


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
