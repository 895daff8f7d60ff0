"""JSON-lines example files."""

from __future__ import annotations

import json

import pytest

from posttrain.data.files import check_examples, read_examples, write_examples
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


CHAT = Example("2+2?", "4", "4", system="Be brief.", messages=({"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}),
               metadata={"level": 1, "tags": ["add"]})


def test_optional_fields_round_trip_and_are_written_only_where_set(tmp_path):
    path = tmp_path / "train.jsonl"
    write_examples(path, [*EXAMPLES, CHAT])
    assert read_examples(path) == [*EXAMPLES, CHAT]
    first, last = (json.loads(line) for line in path.read_text().splitlines()[::3])
    assert set(first) == {"prompt", "completion", "answer"}  # a generated task's files keep their three fields
    assert set(last) == {"prompt", "completion", "answer", "system", "messages", "metadata"}


@pytest.mark.parametrize(("extra", "words"), [
    ({"system": 3}, "'system' must be a string"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "'messages' must be a list of {role, content} messages"),
    ({"messages": "hi"}, "'messages' must be a list"),
    ({"metadata": [1]}, "'metadata' must be an object"),
])
def test_bad_optional_field_names_file_and_line(tmp_path, extra, words):
    path = tmp_path / "train.jsonl"
    path.write_text(lines(GOOD, {**GOOD, **extra}))
    message = read_error(path)
    assert f"{path}:2:" in message and words in message


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


def test_bytes_that_are_not_utf8_name_their_exact_line(tmp_path):
    """Decoding line by line: a text-mode reader fails at a chunk of ~8 KB, several lines away from the bad one."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(lines(*[GOOD] * 299).encode() + b'{"prompt": "1+1=\xe9"}\n' + lines(GOOD).encode())
    message = read_error(path)
    assert f"{path}:300: not UTF-8" in message and "byte 17" in message


@pytest.mark.parametrize("prompt", ["", "  "])
def test_empty_prompt(tmp_path, prompt):
    path = tmp_path / "train.jsonl"
    path.write_text(lines(GOOD, {**GOOD, "prompt": prompt}))
    assert f"{path}:2: empty prompt" in read_error(path)


class Positions:  # the part of a model check_examples reads
    config = type("Config", (), {"max_position_embeddings": 9})()


def test_check_examples_refuses_what_does_not_fit_the_model(char_tokenizer, tmp_path):
    path, sft = tmp_path / "train.jsonl", {"reserved": 0, "reserved_for": "", "supervised": True}
    fits = [Example("12+34=", "46", "46")]  # 6 + 2 + EOS: 9 positions
    check_examples(path, fits, Positions(), char_tokenizer, **sft)
    too_long = r"train.jsonl row 2: the SFT row is 10 tokens as the model reads it, more than the model's 9 positions"
    with pytest.raises(UserError, match=too_long):
        check_examples(path, [*fits, Example("123+456=", "5", "5")], Positions(), char_tokenizer, **sft)
    sampling = r"row 1: the prompt is 6 tokens as the model reads it; with 4 for rl.max_new_tokens that is 10, more than"
    with pytest.raises(UserError, match=sampling):
        check_examples(path, fits, Positions(), char_tokenizer, 4, "rl.max_new_tokens")
    with pytest.raises(UserError, match=r"train.jsonl row 1: '12\+34=x' holds 'x'"):
        check_examples(path, [Example("12+34=x", "46", "46")], Positions(), char_tokenizer, 0, "nothing")
