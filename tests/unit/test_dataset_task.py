"""task.name dataset: your own rows (JSON lines, Parquet, CSV, save_to_disk) mapped onto examples, split three
ways, de-duplicated and filtered with counts, metadata passed through, and its small verifier."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from helpers import micro_params
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.tasks import Example, build_task

ROWS = [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1), "source": "toy", "level": str(i % 3)} for i in range(20)]


@pytest.fixture(scope="module")
def params(tmp_path_factory) -> Path:
    return micro_params(tmp_path_factory.mktemp("dataset"), tracking={"enabled": False})


def write(path: Path, rows: list[dict]) -> Path:
    """`rows` in the format `path`'s suffix names (a directory: datasets.save_to_disk)."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path, index=False)
    elif path.suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        import datasets

        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def task_for(params: Path, path: Path | str, **options):
    sets = ["task.name=dataset", f"task.options.dataset.path={path}", "task.options.dataset.fields.prompt=question"]
    sets += [f"task.options.dataset.{key}={json.dumps(value)}" for key, value in options.items()]
    return build_task(resolve.load(params, sets).task)


def error(fn) -> str:
    with pytest.raises(UserError) as info:
        fn()
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("name", ["problems.jsonl", "problems.parquet", "problems.csv", "saved"])
def test_every_format_gives_the_same_examples(params, tmp_path, name):
    task = task_for(params, write(tmp_path / name, ROWS), **{"fields.metadata": ["level"]})
    splits = task.splits(0)
    reference = task_for(params, write(tmp_path / "ref.jsonl", ROWS), **{"fields.metadata": ["level"]}).splits(0)
    assert splits == reference
    assert {len(splits["train"]), len(splits["heldout"])} == {18, 2}  # heldout_fraction 0.1 of 20
    first = next(e for e in splits["train"] + splits["heldout"] if e.prompt == "What is 0 + 1?")
    assert first == Example("What is 0 + 1?", "1", "1", metadata={"level": "0"})
    assert task.data_metrics()["n_rows_read"] == 20 and task.expected_sizes() == {k: len(v) for k, v in splits.items()}


def test_fraction_split_is_seeded(params, tmp_path):
    path = write(tmp_path / "p.jsonl", ROWS)
    held = lambda pipeline_seed, **o: [e.prompt for e in task_for(params, path, heldout_fraction=0.25, **o).splits(pipeline_seed)["heldout"]]  # noqa: E731
    assert held(0) == held(0) and len(held(0)) == 5
    assert held(0) != held(1)
    assert held(0, seed=7) == held(1, seed=7)  # task.options.dataset.seed wins over pipeline.seed


def test_named_split_of_a_dataset_dict_and_of_a_split_column(params, tmp_path):
    import datasets

    parts = {"train": ROWS[:12], "test": ROWS[12:16], "validation": ROWS[16:]}
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in parts.items()}).save_to_disk(str(tmp_path / "dd"))
    task = task_for(params, tmp_path / "dd", heldout="split")
    splits = task.splits(0)
    assert [e.prompt for e in splits["heldout"]] == [r["question"] for r in ROWS[12:16]] and len(splits["train"]) == 12
    assert "its splits: train, test, validation" in error(lambda: task_for(params, tmp_path / "dd", heldout="split", heldout_split="dev").splits(0))
    tagged = [{**r, "split": "test" if i % 4 == 0 else "train" if i % 4 < 3 else "other"} for i, r in enumerate(ROWS)]
    task = task_for(params, write(tmp_path / "tagged.csv", tagged), heldout="split", **{"fields.metadata": "all"})
    splits = task.splits(0)
    assert len(splits["heldout"]) == 5 and len(splits["train"]) == 10 and task.data_metrics()["n_other_split_dropped"] == 5
    assert set(splits["train"][0].metadata) == {"source", "level"}  # all: every unmapped column but the split column


def test_separate_heldout_file_drops_its_prompts_from_train(params, tmp_path):
    heldout = write(tmp_path / "heldout.parquet", ROWS[15:] + [{**ROWS[0], "source": "again"}])
    task = task_for(params, write(tmp_path / "train.jsonl", ROWS[:15]), heldout="file", heldout_path=str(heldout))
    splits = task.splits(0)
    assert len(splits["heldout"]) == 6 and len(splits["train"]) == 14
    assert task.data_metrics()["n_heldout_overlap_dropped"] == 1


def test_duplicates_and_long_prompts_are_dropped_and_counted(params, tmp_path):
    rows = ROWS + [ROWS[3], ROWS[3], {**ROWS[0], "question": "What is " + "9 + " * 40 + "1?", "answer": "361"}]
    task = task_for(params, write(tmp_path / "p.jsonl", rows), max_prompt_chars=40)
    splits = task.splits(0)
    metrics = task.data_metrics()
    assert (metrics["n_duplicates_dropped"], metrics["n_too_long_dropped"], metrics["n_rows_read"]) == (2, 1, 23)
    assert sum(map(len, splits.values())) == 20
    kept = task_for(params, tmp_path / "p.jsonl", dedupe=False, max_prompt_chars=0, heldout_fraction=0.5)
    kept.splits(0)
    assert kept.data_metrics()["n_duplicates_dropped"] == 0 and kept.data_metrics()["n_too_long_dropped"] == 0


def test_token_budget_counts_the_tokenizer_s_tokens(params, tmp_path):
    from posttrain.models.tokenizer import train_char_tokenizer

    train_char_tokenizer(["".join(sorted({c for r in ROWS for c in r["question"]}))]).save_pretrained(tmp_path / "tok")
    rows = ROWS + [{**ROWS[0], "question": "What is 1 + 2 + 3 + 4?", "answer": "10"}]  # 22 characters, one token each
    task = task_for(params, write(tmp_path / "p.jsonl", rows), max_prompt_tokens=21, tokenizer=str(tmp_path / "tok"))
    task.splits(0)
    assert task.data_metrics()["n_too_long_dropped"] == 1


def test_messages_system_and_completion_columns(params, tmp_path):
    rows = [{"chat": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{i}+{i}?"},
                      {"role": "assistant", "content": f"It is {2 * i}."}], "answer": 2 * i} for i in range(10)]
    path = write(tmp_path / "chat.parquet", rows)
    task = task_for(params, path, **{"fields.prompt": None, "fields.messages": "chat", "heldout_fraction": 0.2})
    example = next(e for e in task.splits(0)["train"] if e.prompt == "3+3?")
    assert (example.system, example.completion, example.answer) == ("Be brief.", "It is 6.", "6")
    assert example.messages == tuple(rows[3]["chat"])
    plain = [{"question": "1+1?", "solution": "so \\boxed{2}", "answer": "2", "sys": "Think."}] * 3 + [
        {"question": "2+2?", "solution": "\\boxed{4}", "answer": "4", "sys": "Think."}] * 3
    task = task_for(params, write(tmp_path / "plain.jsonl", plain), answer_pattern="boxed", heldout_fraction=0.5,
                     **{"fields.completion": "solution", "fields.system": "sys"})
    assert {(e.prompt, e.completion, e.system) for s in task.splits(0).values() for e in s} == {
        ("1+1?", "so \\boxed{2}", "Think."), ("2+2?", "\\boxed{4}", "Think.")}
    constant = task_for(params, tmp_path / "plain.jsonl", answer_pattern="boxed", heldout_fraction=0.5, system_prompt="Hi.")
    assert {e.completion for s in constant.splits(0).values() for e in s} == {"\\boxed{2}", "\\boxed{4}"}  # the answer, written boxed
    assert set("\\boxed{}Hi.") <= set(constant.alphabet())


def test_missing_column_names_the_key_and_the_file(params, tmp_path):
    path = write(tmp_path / "p.csv", ROWS)
    message = error(lambda: task_for(params, path, **{"fields.answer": "solution"}).splits(0))
    assert "task.options.dataset.fields.answer" in message and "'solution'" in message and str(path) in message
    message = error(lambda: task_for(params, path, **{"fields.metadata": ["difficulty"]}).splits(0))
    assert "task.options.dataset.fields.metadata" in message and "'difficulty'" in message


def test_unverifiable_reference_names_the_row(params, tmp_path):
    rows = ROWS[:5] + [{**ROWS[5], "answer": "eleven"}]
    message = error(lambda: task_for(params, write(tmp_path / "p.jsonl", rows)).splits(0))
    assert f"{tmp_path / 'p.jsonl'}:6" in message and "does not verify" in message


@pytest.mark.parametrize(("pattern", "completion", "found"), [
    ("last_number", "6 * 7 = 42, not 41. So 1,234.5", "1,234.5"),
    ("last_number", "no digits here", None),
    ("boxed", "first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("answer_line", "work\nAnswer: x = 3 \nmore", "x = 3"),
    ("whole", "  7 ", "7"),
    (r"#### (\S+)", "so #### 12 and #### 13", "13"),
])
def test_answer_patterns(params, tmp_path, pattern, completion, found):
    assert task_for(params, write(tmp_path / "p.jsonl", ROWS), answer_pattern=pattern).parse(completion) == found


@pytest.mark.parametrize(("verifier", "found", "answer", "right"), [
    ("exact", "42", "42", True), ("exact", "42.", "42", False),
    ("normalized", " The  Answer.", "the answer", True), ("normalized", "$42$", "42", True), ("normalized", "0.5", "1/2", False),
    ("math", "0.5", "1/2", True), ("math", "\\frac{1}{2}", "0.50", True), ("math", "1,000", "1000", True), ("math", "3", "4", False),
])
def test_verifiers(params, tmp_path, verifier, found, answer, right):
    task = task_for(params, write(tmp_path / "p.jsonl", ROWS), verifier=verifier, answer_pattern="whole")
    assert task.correctness_reward(found, True, Example("q", answer, answer)) == float(right)


def test_settings_are_checked_at_the_config_boundary(params, tmp_path):
    path = write(tmp_path / "p.jsonl", ROWS)
    assert "heldout_path" in error(lambda: task_for(params, path, heldout="file"))
    assert "group" in error(lambda: task_for(params, path, answer_pattern="[0-9]+"))
    assert "exactly one of prompt" in error(lambda: task_for(params, path, **{"fields.messages": "chat"}))
    assert "task.options.dataset.path" in error(lambda: task_for(params, tmp_path / "nope.jsonl"))
    assert "task.options.dataset.path: not set" in error(lambda: build_task(resolve.load(params, ["task.name=dataset"]).task))
