"""Preference pairs: the task-derived builder's guarantees, and malformed pair files -> one clear UserError."""

from __future__ import annotations

import json

import pytest

from posttrain.data.preferences import PreferencePair, preference_data, read_pairs, write_pairs
from posttrain.errors import UserError
from posttrain.tasks import build_task


@pytest.fixture(scope="module")
def task_and_examples(cfg):
    task = build_task(cfg.task.model_copy(update={"n_train": 300, "n_heldout": 50}))
    return task, task.splits(0)["train"]


def test_task_pairs_prefer_verified_answers_with_graded_severity(task_and_examples):
    task, examples = task_and_examples
    pairs = preference_data.get("task_pairs")(task, examples, 90, seed=0)
    by_prompt = {e.prompt: e for e in examples}
    assert len(pairs) == 90 and {p.severity for p in pairs} == {round(1 / 3, 6), round(2 / 3, 6), 1.0}
    for p in pairs:
        e = by_prompt[p.prompt]
        assert task.correctness_reward(p.chosen, True, e) == 1.0
        assert task.correctness_reward(p.rejected, True, e) == 0.0
        malformed = task.format_reward(p.rejected, True) == 0.0
        assert malformed == (p.severity == 1.0)  # only the severe tier is malformed
        if p.severity < 0.5:  # minor: a near miss in the last digit
            assert p.rejected[:-1] == p.chosen[:-1] and len(p.rejected) == len(p.chosen)
    assert pairs == preference_data.get("task_pairs")(task, examples, 90, seed=0)  # deterministic in the seed


def test_pairs_round_trip(tmp_path):
    pairs = [PreferencePair("1+1=", "2", "3", 0.5, None), PreferencePair("2+2=", "4", "5", 0.0, True)]
    write_pairs(tmp_path / "p.jsonl", pairs)
    assert read_pairs(tmp_path / "p.jsonl") == pairs


def test_parquet_csv_and_chat_message_pairs_read_as_the_same_pairs(tmp_path):
    from dataclasses import asdict

    import pandas as pd

    pairs = [PreferencePair("1+1=", "2", "3", 0.5, None), PreferencePair("2+2=", "4", "5", 0.0, True)]
    frame = pd.DataFrame([asdict(p) for p in pairs])
    frame.to_parquet(tmp_path / "p.parquet", index=False)
    frame.astype({"gold": "string"}).fillna("").to_csv(tmp_path / "p.csv", index=False)
    assert read_pairs(tmp_path / "p.parquet") == pairs and read_pairs(str(tmp_path / "p.csv")) == pairs
    turn = lambda role, text: [{"role": role, "content": text}]  # noqa: E731
    chat = [{"chosen": turn("user", "1+1=") + turn("assistant", "2"), "rejected": turn("user", "1+1=") + turn("assistant", "3"),
             "severity": 0.5},
            {"prompt": turn("system", "Add.") + turn("user", "2+2="), "chosen": turn("assistant", "4"), "rejected": turn("assistant", "5"),
             "gold": True}]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    assert read_pairs(tmp_path / "chat.jsonl") == pairs


def test_bad_row_of_a_csv_pairs_file_names_its_row(tmp_path):
    (tmp_path / "p.csv").write_text("prompt,chosen,rejected,severity\n1+1=,2,3,0.5\n2+2=,4,5,high\n")
    with pytest.raises(UserError, match=r"p.csv row 2: severity must be a number"):
        read_pairs(tmp_path / "p.csv")


BAD_LINES = {
    "not json": ("{oops", "not valid JSON"),
    "not an object": ("[1, 2]", "expected an object"),
    "missing field": (json.dumps({"prompt": "a", "chosen": "b"}), "missing field 'rejected'"),
    "unknown field": (json.dumps({"prompt": "a", "chosen": "b", "rejected": "c", "score": 1}), "unknown field 'score'"),
    "non-string text": (json.dumps({"prompt": "a", "chosen": 5, "rejected": "c"}), "'chosen' must be a string"),
    "identical texts": (json.dumps({"prompt": "a", "chosen": "b", "rejected": "b"}), "the same text"),
    "severity out of range": (json.dumps({"prompt": "a", "chosen": "b", "rejected": "c", "severity": 3}), "severity must be a number in [0, 1]"),
    "severity not a number": (json.dumps({"prompt": "a", "chosen": "b", "rejected": "c", "severity": "high"}), "severity"),
    "gold not a bool": (json.dumps({"prompt": "a", "chosen": "b", "rejected": "c", "gold": 1}), "gold must be true, false or null"),
}


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_malformed_pair_file_names_file_and_line(tmp_path, name):
    line, needle = BAD_LINES[name]
    good = json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"})
    path = tmp_path / "pairs.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(UserError) as err:
        read_pairs(path)
    message = str(err.value)
    assert f"{path}:2" in message and needle in message and "\n" not in message


def test_missing_and_empty_pair_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_pairs(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no rows"):
        read_pairs(tmp_path / "empty.jsonl")
