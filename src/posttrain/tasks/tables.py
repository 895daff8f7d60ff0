"""Reading the data files a user brings: JSON lines, Parquet, CSV or a `datasets.save_to_disk` directory (a
Dataset or a DatasetDict), local or `s3://` (an object or a prefix, fetched once into the input cache).

One loader serves the dataset task (tasks/dataset.py) and preference pairs (data/preferences.py); it lives in
tasks/ because data/ imports tasks, not the reverse. Every row keeps its place for messages: `file:line` for JSON
lines (the line number, blank lines counted), `file row N` (from 1, the header not counted) for the others.
A file that cannot be read is one `UserError` line naming it. CSV cells are read as text (an empty cell is "").
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import UserError
from posttrain.storage import local_data

FORMATS = ".jsonl, .ndjson, .json (JSON lines), .parquet, .csv, or a datasets.save_to_disk directory"


@dataclass(frozen=True)
class Table:
    source: str  # the location as given (with `[split]` for a split of a DatasetDict)
    split: str | None  # the DatasetDict split it is; None for a file or a single Dataset
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    wheres: list[str]  # each row's place, for messages
    unreadable: tuple[tuple[int, str, str], ...] = ()  # (rows read before it, where, problem): JSON lines that are no row


@dataclass(frozen=True)
class SourceRows:
    """What the data stage's row suite checks (data/validation.py `validate_rows`): per row of one table its
    place (`where`) and, per mapped field, the kind of its value (`value_kind`), against the kinds allowed."""

    source: str
    frame: Any  # pandas DataFrame: `where`, then one column per field key holding value kinds
    columns: dict[str, str]  # field key -> the column it maps to (for messages)
    allowed: dict[str, tuple[str, ...]]  # field key -> accepted kinds
    unreadable: tuple[tuple[int, str, str], ...] = ()  # Table.unreadable: lines that are no row at all


def json_lines(path: Path, what: str, label: str | None = None, unreadable: list[tuple[str, str]] | None = None
               ) -> Iterator[tuple[str, object]]:
    """(`file:line`, parsed record) for each non-blank line; a missing file, bytes that are not UTF-8 or bad JSON
    is a `UserError` naming the line (lines are split as bytes and decoded one by one, so the line is exact).
    `label` names the file in messages (default: the path). Given an `unreadable` list, a bad line is appended to
    it as (`file:line`, problem) and skipped instead, so a caller can report every bad line at once."""
    label = str(path) if label is None else label
    if not path.is_file():
        raise UserError(f"{what} file not found: {label}")
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = raw[e.start : e.start + 1]
                problem = f"not UTF-8 text (byte {e.start + 1} of the line is {bad!r})"
                if unreadable is None:
                    raise UserError(f"{label}:{number}: {problem}") from None
                unreadable.append((f"{label}:{number}", problem))
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                if unreadable is None:
                    raise UserError(f"{label}:{number}: not valid JSON ({e.msg})") from None
                unreadable.append((f"{label}:{number}", f"not valid JSON ({e.msg})"))
                continue
            yield f"{label}:{number}", record


def read_tables(location: str | Path, what: str, every_bad_line: bool = False) -> list[Table]:
    """The table(s) at `location`: one for a file or a Dataset, one per split for a DatasetDict. With
    `every_bad_line`, JSON lines that are no row are kept in `Table.unreadable` (reported with the bad rows by
    `bad_rows`) instead of stopping at the first."""
    location = str(location)
    path = local_data(location)
    if path.is_dir():
        return _saved(path, location, what)
    if not path.is_file():
        raise UserError(f"{what} file not found: {location}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return [_json_lines_table(path, location, what, every_bad_line)]
    if suffix in (".parquet", ".pq"):
        return [_parquet(path, location, what)]
    if suffix == ".csv":
        return [_csv(path, location, what)]
    raise UserError(f"{what} {location}: unknown format {suffix or '(no suffix)'}; use {FORMATS}")


def _table(source: str, split: str | None, rows: list[dict], wheres: list[str], what: str, columns=None, unreadable=()) -> Table:
    if not rows and not unreadable:
        raise UserError(f"{source}: no rows in the {what} file")
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    return Table(source, split, tuple(columns), rows, wheres, tuple(unreadable))


def _json_lines_table(path: Path, location: str, what: str, every_bad_line: bool = False) -> Table:
    rows, wheres, unreadable = [], [], []
    lines: list[tuple[str, str]] | None = [] if every_bad_line else None
    for where, record in json_lines(path, what, location, lines):
        unreadable += [(len(rows), w, problem) for w, problem in lines or ()]
        if lines:
            lines.clear()
        if not isinstance(record, dict):
            problem = f"expected an object (one row), got {type(record).__name__}"
            if not every_bad_line:
                raise UserError(f"{where}: {problem}")
            unreadable.append((len(rows), where, problem))
            continue
        rows.append(record)
        wheres.append(where)
    unreadable += [(len(rows), w, problem) for w, problem in lines or ()]
    return _table(location, None, rows, wheres, what, unreadable=unreadable)


def _numbered(location: str, n: int) -> list[str]:
    return [f"{location} row {i}" for i in range(1, n + 1)]


def _parquet(path: Path, location: str, what: str) -> Table:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pyarrow.ArrowException, OSError) as e:
        raise UserError(f"{what}: cannot read {location}: {str(e).splitlines()[0][:200]}") from None
    rows = table.to_pylist()
    return _table(location, None, rows, _numbered(location, len(rows)), what, table.column_names)


def _csv(path: Path, location: str, what: str) -> Table:
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise UserError(f"{what}: cannot read {location}: {str(e).splitlines()[0][:200]}") from None
    rows = frame.to_dict("records")
    return _table(location, None, rows, _numbered(location, len(rows)), what, list(frame.columns))


def _saved(path: Path, location: str, what: str) -> list[Table]:
    if not ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        raise UserError(f"{what} {location}: a directory that is not a datasets.save_to_disk dataset "
                        f"(no dataset_dict.json or state.json); use {FORMATS}")
    import datasets

    datasets.disable_progress_bars()
    try:
        saved = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise UserError(f"{what}: cannot read {location}: {str(e).splitlines()[0][:200]}") from None
    parts = saved.items() if isinstance(saved, datasets.DatasetDict) else [(None, saved)]
    tables = []
    for split, part in parts:
        source = location if split is None else f"{location}[{split}]"
        rows = part.to_list()
        tables.append(_table(source, split, rows, _numbered(source, len(rows)), what, part.column_names))
    return tables


# --- value kinds: what a row suite checks ---------------------------------------------------------------

ROLES = ("system", "user", "assistant")


def value_kind(value: Any) -> str:
    """`missing`, `empty` (blank text or an empty list), `text`, `number`, `conversation` (a list of {role,
    content} messages with a user turn), `malformed messages` (a list of other objects), or the type's name."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "missing"
    if isinstance(value, str):
        return "text" if value.strip() else "empty"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, (list, tuple)):
        if not value:
            return "empty"
        if not all(isinstance(m, dict) for m in value):
            return "list"
        well_formed = all(set(m) >= {"role", "content"} and m["role"] in ROLES and isinstance(m["content"], str) for m in value)
        return "conversation" if well_formed and any(m["role"] == "user" for m in value) else "malformed messages"
    return type(value).__name__


KIND_WANTED = {"text": "a string", "number": "a number", "conversation": "a list of {role, content} messages with a user turn"}


def kind_problem(kind: str, allowed: tuple[str, ...]) -> str:
    """What is wrong with a value of `kind` where `allowed` kinds are wanted, as words."""
    if kind in ("missing", "empty"):
        return f"is {kind}"
    return f"must be {' or '.join(KIND_WANTED[k] for k in allowed)}, got {kind}"


def source_rows(table: Table, columns: dict[str, str], allowed: dict[str, tuple[str, ...]]) -> SourceRows:
    """The kinds of the mapped `columns` (field key -> column) of `table`, for the row suite."""
    import pandas as pd

    frame = pd.DataFrame({"where": table.wheres, **{key: [value_kind(row.get(column)) for row in table.rows]
                                                     for key, column in columns.items()}})
    return SourceRows(table.source, frame, dict(columns), {key: allowed[key] for key in columns}, table.unreadable)


def bad_rows(rows: SourceRows) -> list[tuple[str, str]]:
    """Every bad row in file order as (where, problem): lines that are no row (bad JSON, not an object) and values
    of a kind their field does not allow (one entry per row, its bad fields joined)."""
    out = []
    unreadable = sorted(rows.unreadable, key=lambda u: u[0])
    for i, where in enumerate([*rows.frame["where"], None]):
        out += [(w, problem) for before, w, problem in unreadable if before == i]
        if where is None:
            break
        problems = [bad_row_problem(key, column, rows.frame[key].iat[i], rows.allowed[key]) for key, column in rows.columns.items()
                    if rows.frame[key].iat[i] not in rows.allowed[key]]
        if problems:
            out.append((where, ", ".join(problems)))
    return out


def first_bad_row(rows: SourceRows) -> str | None:
    """The first row (in file order) that is bad, as one line; None if none."""
    found = bad_rows(rows)
    return f"{found[0][0]}: {found[0][1]}" if found else None


def bad_row_problem(key: str, column: str, kind: str, allowed: tuple[str, ...]) -> str:
    named = f"field {key!r}" if key == column else f"field {key!r} (column {column!r})"
    return f"{named} {kind_problem(kind, allowed)}"


def bad_row_line(where: str, key: str, column: str, kind: str, allowed: tuple[str, ...]) -> str:
    return f"{where}: {bad_row_problem(key, column, kind, allowed)}"
