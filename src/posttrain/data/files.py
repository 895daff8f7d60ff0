"""Examples as JSON lines: one `{"prompt", "completion", "answer"}` object per line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path

from posttrain.errors import UserError
from posttrain.tasks import Example

_FIELDS = {f.name for f in fields(Example)}


def write_examples(path: Path, examples: list[Example]) -> None:
    with path.open("w") as f:
        for example in examples:
            f.write(json.dumps(asdict(example)) + "\n")


def json_lines(path: Path, what: str) -> Iterator[tuple[str, object]]:
    """(`file:line`, parsed record) for each non-blank line; a missing file or bad JSON is a `UserError`."""
    if not path.is_file():
        raise UserError(f"{what} file not found: {path}")
    with path.open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{number}: not valid JSON ({e.msg})") from None


def read_examples(path: Path) -> list[Example]:
    """Read and check a JSON-lines file; a malformed line is a `UserError` naming file and line."""
    examples = []
    for where, record in json_lines(path, "dataset"):
        if not isinstance(record, dict) or set(record) != _FIELDS or not all(isinstance(v, str) for v in record.values()):
            raise UserError(f"{where}: expected an object with string fields {sorted(_FIELDS)}")
        examples.append(Example(**record))
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples
