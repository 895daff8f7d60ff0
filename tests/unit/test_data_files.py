"""JSON-lines example files."""

from __future__ import annotations

import json

import pytest

from posttrain.data.files import read_examples, write_examples
from posttrain.errors import UserError
from posttrain.tasks import Example

EXAMPLES = [Example("37+48=", "85", "85"), Example("05-08=", "-3", "-3"), Example('"q"\n=', "ü", "ü")]


def read_error(path) -> str:
    with pytest.raises(UserError) as info:
        read_examples(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


def test_round_trip(tmp_path):
    path = tmp_path / "train.jsonl"
    write_examples(path, EXAMPLES)
    assert read_examples(path) == EXAMPLES
    assert len(path.read_text().splitlines()) == len(EXAMPLES)


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "train.jsonl"
    write_examples(path, EXAMPLES[:2])
    path.write_text(path.read_text().replace("\n", "\n\n", 1))
    assert read_examples(path) == EXAMPLES[:2]


def lines(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


GOOD = {"prompt": "1+1=", "completion": "2", "answer": "2"}


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ('{"prompt": "1+1=", "completion": ', "JSON"),
        ({"prompt": "1+1=", "completion": "2"}, "fields"),
        ({**GOOD, "extra": "x"}, "fields"),
        ({**GOOD, "answer": 2}, "fields"),
        (["1+1=", "2", "2"], "fields"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad, words):
    path = tmp_path / "train.jsonl"
    path.write_text(lines(GOOD, GOOD, bad, GOOD))
    message = read_error(path)
    assert f"{path}:3:" in message
    assert words in message


def test_empty_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n\n")
    assert "no examples" in read_error(path)


def test_missing_file(tmp_path):
    assert "not found" in read_error(tmp_path / "missing.jsonl")
