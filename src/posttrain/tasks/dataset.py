"""Your own data as a task: rows of a JSON-lines, Parquet or CSV file or a `datasets.save_to_disk` directory
(local or `s3://`), mapped onto examples, split, de-duplicated and filtered, verified by a small answer extractor.

    {"problem": "What is 6*7?", "solution": "6*7 = 42. Answer: 42", "answer": "42", "level": 1}

Settings: task.options.dataset (params.yaml; docs/tasks.md lists them). `fields` maps the columns: `prompt` (the
user turn) or `messages` (a chat conversation [{role, content}]: the prompt is its last user turn, a system
message its system prompt, an assistant turn after it the reference), `answer`, optional `completion` (a
reference solution for SFT; default: the conversation's answer turn, else the answer written in the answer format),
optional `system` (or one `system_prompt`), and `metadata`: extra columns handed to rewards (`all`: the rest).
The held-out split is a named split (`heldout: split`: a DatasetDict split, or a `split_column` value), a separate
file (`heldout: file`) or a seeded share of the rows (`heldout: fraction`). Repeated prompts are dropped (first
kept; a held-out prompt leaves train), and so are prompts longer than `max_prompt_chars` or, with `tokenizer`,
`max_prompt_tokens`; the data stage reports the counts. Whether the kept rows fit a model is checked where one is
loaded (data.check_examples refuses a row past the model's positions, naming it), so a cap here only drops rows.

The verifier: `answer_pattern` extracts the answer (the last match): `last_number`, `boxed` (\\boxed{...}),
`answer_line` ("Answer: X"), `whole` (the completion), or a regex whose group 1 is the answer; `verifier` compares
it with the reference: `exact`, `normalized` (case, spaces, $, a final period) or `math` (normalized, then numbers,
fractions and \\frac as values). (math-verify is wired in later; this stays dependency-free.)
"""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from posttrain.config import HUB_ID, Section
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task, answer_regex, prompt_key
from posttrain.tasks.tables import SourceRows, Table, first_bad_row, read_tables, source_rows

WHERE = "task.options.dataset"
PATTERNS = {  # a preset answer format: (extractor regex or None for a special one, how a bare answer is written)
    "last_number": (re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?"), "{answer}"),
    "boxed": (None, "\\boxed{{{answer}}}"),
    "answer_line": (re.compile(r"(?im)^[ \t]*(?:final[ \t]+)?answer[ \t]*:[ \t]*(\S.*?)[ \t]*$"), "Answer: {answer}"),
    "whole": (None, "{answer}"),
}
TEXT = ("text",)
ALLOWED = {"prompt": TEXT, "messages": ("conversation",), "answer": ("text", "number"), "completion": TEXT, "system": TEXT}


class DatasetFields(Section):
    prompt: str | None = "prompt"  # the column of the user turn (or `messages`)
    messages: str | None = None  # the column of a chat conversation [{role, content}] (or `prompt`)
    answer: str = "answer"  # the column of the reference answer (text or a number)
    completion: str | None = None  # the column of a reference solution for SFT; null: see the module docstring
    system: str | None = None  # the column of a per-row system prompt
    metadata: Literal["all"] | tuple[str, ...] = ()  # columns handed to rewards as Example.metadata; all: every unmapped one

    @model_validator(mode="after")
    def _one_prompt(self) -> "DatasetFields":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("set exactly one of prompt (a column of text) and messages (a column of chat messages)")
        return self


class DatasetOptions(Section):
    path: str | None = None  # a .jsonl / .parquet / .csv file or a datasets.save_to_disk directory, local or s3://
    fields: DatasetFields = DatasetFields()  # which column holds what
    system_prompt: str | None = None  # one system prompt for every row (instead of fields.system)
    heldout: Literal["fraction", "split", "file"] = "fraction"  # where the held-out rows come from
    heldout_fraction: float = Field(0.1, gt=0, lt=1)  # heldout: fraction: the share of rows held out, drawn with `seed`
    seed: int | None = None  # null: pipeline.seed
    train_split: str = "train"  # heldout: split: the train split's name (a DatasetDict split or a split_column value)
    heldout_split: str = "test"  # heldout: split: the held-out split's name
    split_column: str = "split"  # heldout: split, for a file: the column naming each row's split
    heldout_path: str | None = None  # heldout: file: the held-out rows, in any format, mapped by the same fields
    dedupe: bool = True  # drop repeated prompts (the system prompt and conversation count); a held-out prompt leaves train
    max_prompt_chars: int = Field(0, ge=0)  # drop longer prompts (system + conversation up to the prompt); 0: no cap
    max_prompt_tokens: int = Field(0, ge=0)  # the same in tokens of `tokenizer` (no chat template); 0: no cap
    tokenizer: str | None = None  # a tokenizer directory or hub id (your checkpoint's) for max_prompt_tokens
    answer_pattern: str = "last_number"  # last_number | boxed | answer_line | whole | a regex whose group 1 is the answer
    verifier: Literal["exact", "normalized", "math"] = "normalized"  # exact | normalized | math
    answer_format: str | None = None  # how a bare answer is written ("#### {answer}"); null: answer_pattern's preset, or the bare answer

    @field_validator("answer_format")
    @classmethod
    def _has_slot(cls, v: str | None) -> str | None:
        if v is not None and "{answer}" not in v:
            raise ValueError("needs the {answer} slot")
        return v

    @field_validator("path", "heldout_path")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        from pathlib import Path

        if v is not None and "://" not in v and not Path(v).exists():
            raise ValueError(f"data file not found: {v}")
        return v

    @field_validator("answer_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        if v not in PATTERNS:
            answer_regex(v)  # neither a preset nor a regex with the answer as group 1: a ValueError naming the problem
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "DatasetOptions":
        if self.heldout == "file" and self.heldout_path is None:
            raise ValueError("heldout: file needs heldout_path")
        if self.heldout != "file" and self.heldout_path is not None:
            raise ValueError(f"heldout_path is set but heldout is {self.heldout}; set heldout: file")
        if self.system_prompt is not None and self.fields.system is not None:
            raise ValueError("set one of system_prompt and fields.system")
        if self.max_prompt_tokens and self.tokenizer is None:
            raise ValueError("max_prompt_tokens needs tokenizer (a tokenizer directory or hub id)")
        if self.tokenizer is not None and not HUB_ID.fullmatch(self.tokenizer):
            from pathlib import Path

            if not Path(self.tokenizer).exists():
                raise ValueError(f"tokenizer not found: {self.tokenizer}")
        return self


def normalized(text: str) -> str:
    text = " ".join(text.strip().lower().split())
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text).strip("$ ").rstrip(".").strip()
    return text


def as_number(text: str) -> Fraction | None:
    text = text.replace(",", "").replace(" ", "")
    frac = re.fullmatch(r"(-?)\\d?frac\{(-?\d+)\}\{(-?\d+)\}", text)
    if frac:
        text = f"{frac[1]}{frac[2]}/{frac[3]}"
    try:
        return Fraction(text) if re.fullmatch(r"-?\d+(\.\d+)?(/-?\d+)?", text) else None
    except (ValueError, ZeroDivisionError):
        return None


def last_boxed(text: str) -> str | None:
    """The contents of the last \\boxed{...} (braces balanced)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def answer_text(value: Any) -> str:
    """A reference answer as text: a string stripped, an integral number without a decimal point."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def chars(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(value)
    if isinstance(value, (list, tuple)):
        return set().union(*(chars(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return chars(value.get("content"))
    return set(str(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else set()


@tasks.register("dataset", options=DatasetOptions)
class DatasetTask(Task):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.opts: DatasetOptions = cfg.options_for("dataset")
        if self.opts.path is None:
            raise UserError(f"{WHERE}.path: not set; task.name dataset reads your data file (.jsonl, .parquet, .csv or a save_to_disk directory)")
        self.counts: dict[str, float] = {}
        self.sizes: dict[str, int] = {}

    # --- reading --------------------------------------------------------------------------------------------

    @cached_property
    def tables(self) -> dict[str, list[Table]]:
        """role -> tables: `data` (from path) and, with heldout: file, `heldout` (from heldout_path)."""
        found = {"data": read_tables(self.opts.path, "dataset", every_bad_line=True)}
        if self.opts.heldout == "file":
            found["heldout"] = read_tables(self.opts.heldout_path, "held-out dataset", every_bad_line=True)
        for role, tables in found.items():
            found[role] = self._chosen_splits(tables, role)
            for table in found[role]:
                self._check_columns(table)
        return found

    def _chosen_splits(self, tables: list[Table], role: str) -> list[Table]:
        """A DatasetDict gives its train split (and held-out split: with heldout: split, or as the held-out file)."""
        if tables[0].split is None:
            return tables
        by_name = {t.split: t for t in tables}
        wanted = [self.opts.heldout_split] if role == "heldout" else [self.opts.train_split]
        if role == "data" and self.opts.heldout == "split":
            wanted.append(self.opts.heldout_split)
        for name in wanted:
            if name not in by_name:
                key = "train_split" if name == self.opts.train_split and role == "data" else "heldout_split"
                raise UserError(f"{WHERE}.{key}: no split {name!r} in {self.opts.path if role == 'data' else self.opts.heldout_path} "
                                f"(its splits: {', '.join(by_name)})")
        return [by_name[name] for name in wanted]

    def mapped(self, table: Table) -> dict[str, str]:
        """field key -> column, for the fields that are set (metadata not included)."""
        f = self.opts.fields
        keys = {"prompt": f.prompt, "messages": f.messages, "answer": f.answer, "completion": f.completion, "system": f.system}
        return {key: column for key, column in keys.items() if column is not None}

    def metadata_columns(self, table: Table) -> tuple[str, ...]:
        if self.opts.fields.metadata != "all":
            return self.opts.fields.metadata
        used = set(self.mapped(table).values()) | ({self.opts.split_column} if self._split_by_column(table) else set())
        return tuple(c for c in table.columns if c not in used)

    def _split_by_column(self, table: Table) -> bool:
        return self.opts.heldout == "split" and table.split is None

    def _check_columns(self, table: Table) -> None:
        wanted = [(f"fields.{key}", column) for key, column in self.mapped(table).items()]
        if self.opts.fields.metadata != "all":
            wanted += [("fields.metadata", column) for column in self.opts.fields.metadata]
        if self._split_by_column(table):
            wanted.append(("split_column", self.opts.split_column))
        for key, column in wanted:
            if column not in table.columns:
                raise UserError(f"{WHERE}.{key}: no column {column!r} in {table.source} (its columns: {', '.join(table.columns)})")

    def source_rows(self) -> list[SourceRows]:
        """The kinds of every mapped value of every table, for the data stage's row suite (data/validation.py)."""
        return [source_rows(t, self.mapped(t), ALLOWED) for tables in self.tables.values() for t in tables]

    # --- examples -------------------------------------------------------------------------------------------

    def _example(self, row: dict[str, Any], table: Table) -> Example:
        f = self.opts.fields
        answer = answer_text(row[f.answer])
        system = row[f.system] if f.system is not None else self.opts.system_prompt
        reference = messages = None
        if f.messages is not None:
            messages = tuple({"role": m["role"], "content": m["content"]} for m in row[f.messages])
            if messages[0]["role"] == "system" and system is None:
                system = messages[0]["content"]
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            prompt = messages[last_user]["content"]
            reference = next((m["content"] for m in messages[last_user + 1 :] if m["role"] == "assistant"), None)
        else:
            prompt = row[f.prompt]
        completion = row[f.completion] if f.completion is not None else reference if reference is not None else self.written(answer)
        metadata = {column: row.get(column) for column in self.metadata_columns(table)}
        return Example(prompt, completion, answer, system, messages, metadata)

    def written(self, answer: str) -> str:
        """A bare answer written in the answer format (the reference completion when the data has none)."""
        if self.opts.answer_format is not None:
            return self.opts.answer_format.replace("{answer}", answer)
        template = PATTERNS[self.opts.answer_pattern][1] if self.opts.answer_pattern in PATTERNS else "{answer}"
        return template.format(answer=answer)

    def _rows(self, role: str) -> list[tuple[str, str | None, Example]]:
        """(where, split name, example) of every row of `role`'s tables; split name from a DatasetDict or the split column."""
        out = []
        for table in self.tables[role]:
            problem = first_bad_row(source_rows(table, self.mapped(table), ALLOWED))
            if problem is not None:  # the data stage's suite stops this first; a direct caller gets the same line
                raise UserError(problem)
            by_column = self._split_by_column(table)
            for where, row in zip(table.wheres, table.rows):
                split = str(row.get(self.opts.split_column)) if by_column else table.split
                out.append((where, split, self._example(row, table)))
        return out

    key = staticmethod(prompt_key)

    def prompt_text(self, example: Example) -> str:
        """The text a prompt budget counts: the system prompt and the conversation up to the prompt."""
        if example.messages is None:
            return "\n".join(p for p in (example.system, example.prompt) if p)
        system, context = json.loads(self.key(example))
        own = [] if any(m["role"] == "system" for m in context) else [system]  # a system message is the system prompt
        return "\n".join(p for p in [*own, *(m["content"] for m in context)] if p)

    @cached_property
    def _tokenizer(self):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.opts.tokenizer)
        except (OSError, ValueError) as e:
            raise UserError(f"{WHERE}.tokenizer: cannot load {self.opts.tokenizer}: {str(e).splitlines()[0][:200]}") from None

    def too_long(self, example: Example) -> bool:
        text = self.prompt_text(example)
        if self.opts.max_prompt_chars and len(text) > self.opts.max_prompt_chars:
            return True
        return bool(self.opts.max_prompt_tokens) and len(self._tokenizer.encode(text, add_special_tokens=False)) > self.opts.max_prompt_tokens

    def _kept(self, rows: list[tuple[str, str | None, Example]]) -> list[tuple[str, str | None, Example]]:
        """`rows` without the over-long prompts and the repeats (first kept), counted."""
        kept, seen = [], set()
        for row in rows:
            if self.too_long(row[2]):
                self.counts["n_too_long_dropped"] += 1
            elif self.opts.dedupe and self.key(row[2]) in seen:
                self.counts["n_duplicates_dropped"] += 1
            else:
                seen.add(self.key(row[2]))
                kept.append(row)
        return kept

    def splits(self, seed: int) -> dict[str, list[Example]]:
        self.counts = {"n_rows_read": 0.0, "n_too_long_dropped": 0.0, "n_duplicates_dropped": 0.0,
                       "n_heldout_overlap_dropped": 0.0, "n_other_split_dropped": 0.0}
        rows = self._rows("data")
        self.counts["n_rows_read"] = float(len(rows))
        if self.opts.heldout == "file":
            heldout_rows = self._rows("heldout")
            self.counts["n_rows_read"] += len(heldout_rows)
            train, heldout = self._kept(rows), self._kept(heldout_rows)
        elif self.opts.heldout == "split":
            known = (self.opts.train_split, self.opts.heldout_split)
            self.counts["n_other_split_dropped"] = float(sum(split not in known for _, split, _ in rows))
            train = self._kept([r for r in rows if r[1] == self.opts.train_split])
            heldout = self._kept([r for r in rows if r[1] == self.opts.heldout_split])
        else:
            kept = self._kept(rows)
            n_heldout = max(1, round(self.opts.heldout_fraction * len(kept)))
            if n_heldout >= len(kept):
                raise UserError(f"{WHERE}.heldout_fraction: {self.opts.heldout_fraction} of {len(kept)} usable rows leaves none to train on")
            picked = set(random.Random(seed if self.opts.seed is None else self.opts.seed).sample(range(len(kept)), n_heldout))
            train = [r for i, r in enumerate(kept) if i not in picked]
            heldout = [r for i, r in enumerate(kept) if i in picked]
        held_keys = {self.key(e) for _, _, e in heldout}
        self.counts["n_heldout_overlap_dropped"] = float(sum(self.key(e) in held_keys for _, _, e in train))
        if self.opts.dedupe:  # without dedupe a repeated prompt may sit in both splits; the data stage's suite refuses that
            train = [r for r in train if self.key(r[2]) not in held_keys]
        for name, part in (("train", train), ("heldout", heldout)):
            if not part:
                raise UserError(f"{WHERE}: no {name} examples left from {self.opts.path} ({self._count_words()})")
        for where, _, example in train + heldout:
            self._check_verified(where, example)
        self.sizes = {"train": len(train), "heldout": len(heldout)}
        return {"train": [e for _, _, e in train], "heldout": [e for _, _, e in heldout]}

    def _count_words(self) -> str:
        return ", ".join(f"{k.removeprefix('n_').replace('_', ' ')}: {int(v)}" for k, v in self.counts.items())

    def _check_verified(self, where: str, example: Example) -> None:
        if self.correctness_reward(example.completion, True, example) != 1.0:
            raise UserError(f"{where}: the reference completion does not verify: answer_pattern {self.opts.answer_pattern} "
                            f"finds {self.parse(example.completion)!r}, the answer is {example.answer!r} (verifier {self.opts.verifier})")

    def data_metrics(self) -> dict[str, float]:
        return dict(self.counts)

    def expected_sizes(self) -> dict[str, int]:
        return dict(self.sizes)

    # --- the verifier ---------------------------------------------------------------------------------------

    def parse(self, completion: str) -> str | None:
        pattern = self.opts.answer_pattern
        if pattern == "boxed":
            found = last_boxed(completion)
        elif pattern == "whole":
            found = completion
        else:
            regex = PATTERNS[pattern][0] if pattern in PATTERNS else re.compile(pattern)
            matches = list(regex.finditer(completion))
            found = (matches[-1].group(1) if regex.groups else matches[-1].group(0)) if matches else None
        found = None if found is None else found.strip()
        return found or None

    def same(self, found: str, answer: str) -> bool:
        if self.opts.verifier == "exact":
            return found == answer
        a, b = normalized(found), normalized(answer)
        if a == b:
            return True
        if self.opts.verifier == "math":
            x, y = as_number(a), as_number(b)
            return x is not None and x == y
        return False

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        found = self.parse(completion)
        return float(found is not None and self.same(found, example.answer.strip()))

    def alphabet(self) -> str:
        """Every character of the data's mapped text (both files), the answer format's and the system prompt's."""
        seen = chars(self.written("")) | chars(self.opts.system_prompt or "")
        for tables in self.tables.values():
            for table in tables:
                columns = list(self.mapped(table).values())
                for row in table.rows:
                    for column in columns:
                        seen |= chars(row.get(column))
        return "".join(sorted(seen))
