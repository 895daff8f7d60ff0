"""The Great Expectations suite on task examples: passes on generated data, names what fails otherwise,
and a failing suite stops the data stage before anything is written."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from helpers import micro_params
from posttrain import resolve, stages
from posttrain.data.validation import examples_frame, validate_examples, validate_rows
from posttrain.errors import UserError
from posttrain.tasks import Example, build_task


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return build_task(resolve.load(micro_params(tmp_path_factory.mktemp("v"))).task)


def frame(task, rows: list[tuple[str, Example]]) -> pd.DataFrame:
    return pd.concat([examples_frame(task, {s: [e]}) for s, e in rows], ignore_index=True)


def test_generated_splits_pass(task):
    splits = task.splits(0)
    rows = [(name, e) for name, examples in splits.items() for e in examples]
    report = validate_examples(frame(task, rows), task, {k: len(v) for k, v in splits.items()})
    assert report["success"], [c for c in report["checks"] if not c["success"]]


def test_leaked_prompt_and_wrong_solution_are_reported(task):
    good = Example("12+30=", "42", "42")
    rows = [("train", good), ("heldout", good), ("train", Example("10+10=", "21", "20")), ("train", Example("1x+10=", "11", "11"))]
    report = validate_examples(frame(task, rows), task, {"train": 3, "heldout": 1})
    assert not report["success"]
    failed = {(c["expectation"], c["column"]) for c in report["checks"] if not c["success"]}
    assert failed == {
        ("expect_column_values_to_be_unique", "key"),  # the same prompt in train and held-out
        ("expect_column_values_to_be_in_set", "completion_verified"),  # 10+10 solved as 21
        ("expect_column_values_to_match_regex", "prompt"),  # a character outside the task's alphabet
    }


def test_failing_suite_stops_the_stage_and_writes_nothing(tmp_path, monkeypatch):
    cfg = resolve.load(micro_params(tmp_path))
    task_cls = type(build_task(cfg.task))
    original = task_cls.splits

    def leaky(self, seed):
        splits = original(self, seed)
        splits["heldout"][0] = splits["train"][0]
        return splits

    monkeypatch.setattr(task_cls, "splits", leaky)
    cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"enabled": False})})
    with pytest.raises(UserError, match=r"data validation failed: expect_column_values_to_be_unique\(key\)"):
        stages.execute("data", cfg, {}, Path(tmp_path) / "outputs" / "data")
    assert not (tmp_path / "outputs" / "data").exists() and not list((tmp_path / "outputs").glob(".*"))


def test_row_suite_names_the_first_bad_row_of_a_file():
    from posttrain.tasks.tables import Table, source_rows

    rows = [{"q": "1+1?", "a": "2"}, {"q": "2+2?", "a": ["4"]}, {"q": 7, "a": ""}, {"a": "1"}]
    table = Table("p.jsonl", None, ("q", "a"), rows, [f"p.jsonl:{i}" for i in range(1, 5)])
    report = validate_rows(source_rows(table, {"prompt": "q", "answer": "a"}, {"prompt": ("text",), "answer": ("text", "number")}))
    assert not report["success"]
    assert report["first_bad"] == "p.jsonl:2: field 'answer' (column 'a') must be a string or a number, got list"
    assert {c["column"]: c["unexpected_count"] for c in report["checks"]} == {"prompt": 2, "answer": 2}
    good = validate_rows(source_rows(Table("p.jsonl", None, ("q", "a"), rows[:1], ["p.jsonl:1"]), {"prompt": "q"}, {"prompt": ("text",)}))
    assert good["success"] and good["first_bad"] is None
