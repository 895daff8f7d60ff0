"""Great Expectations suites for task datasets, run before anything trains on the data: `validate_rows` on the
rows of a file a user brings (each mapped field present, of its type, not empty), then `validate_examples` on
the splits a task made of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from posttrain.tasks import Example, Task
from posttrain.tasks.base import prompt_key
from posttrain.tasks.tables import SourceRows, bad_rows


def _batch(frame: pd.DataFrame, name: str):
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("posttrain").add_dataframe_asset(name=name)
    return gx, asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})


def validate_rows(rows: SourceRows) -> dict[str, Any]:
    """The row suite: every mapped field of every row of one file has a kind its field allows (present, of its
    type, not empty), and every line is a row. A JSON-able report with `success`; `bad_rows` lists every bad row
    in file order as `where: problem`, `first_bad` is the first of them (None when the file is good)."""
    gx, batch = _batch(rows.frame, "rows")
    suite = gx.ExpectationSuite(name="source_rows")
    for key in rows.columns:
        suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(column=key, value_set=list(rows.allowed[key])))
    report = suite_report(batch.validate(suite, result_format="SUMMARY"))
    found = [f"{where}: {problem}" for where, problem in bad_rows(rows)]  # the suite's verdict, row by row in file order
    report["success"] = report["success"] and not found
    report["bad_rows"] = found
    report["first_bad"] = found[0] if found else None
    return report


SHOWN_BAD_ROWS = 3  # bad rows named in the error line; the report file holds them all


def raise_if_bad_row(report: dict[str, Any], source: str, report_file: Path | None = None) -> None:
    """A failed row suite stops the stage with one line: how many rows of `source` are bad and the first few (in
    file order), each with its field and what is wrong; every one of them is written to `report_file`."""
    if report["success"]:
        return
    from posttrain.errors import UserError

    found = report["bad_rows"]
    if len(found) == 1:
        raise UserError(found[0])
    short = [_place(line, source) for line in found[:SHOWN_BAD_ROWS]]
    more = f"; and {len(found) - SHOWN_BAD_ROWS} more" if len(found) > SHOWN_BAD_ROWS else ""
    listed = ""
    if report_file is not None:
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text("".join(f"{line}\n" for line in found))
        listed = f" (all of them in {report_file})"
    raise UserError(f"{source}: {len(found)} bad rows{listed}: {'; '.join(short)}{more}")


def _place(line: str, source: str) -> str:
    """`src:4: problem` -> `line 4 problem`; `src row 4: problem` -> `row 4 problem` (the source is named once)."""
    rest = line.removeprefix(source)
    where, _, problem = rest.partition(": ")
    where = where.strip()
    return f"line {where[1:]} {problem}" if where.startswith(":") else f"{where} {problem}"


def examples_frame(task: Task, splits: dict[str, list[Example]]) -> pd.DataFrame:
    """The splits as the table `validate_examples` checks: one row per example with its split."""
    return pd.DataFrame([{"prompt": e.prompt, "key": prompt_key(e), "completion": e.completion, "answer": e.answer, "split": name,
                          "completion_verified": verified(task, e)} for name, rows in splits.items() for e in rows])


def verified(task: Task, example: Example) -> bool:
    """The task accepts the reference completion (`Task.reference_verified`: well-formed and correct by default)."""
    return task.reference_verified(example)


def validate_examples(frame: pd.DataFrame, task: Task, expected_rows: dict[str, int]) -> dict[str, Any]:
    """Validate the concatenated splits (`split` column; `key` = what makes two rows the same prompt, the prompt
    itself for a generated task; `completion_verified` = the task's verifier accepts the reference completion)
    and return a JSON-able report with `success`."""
    gx, batch = _batch(frame, "examples")
    e = gx.expectations
    suite = gx.ExpectationSuite(name="task_examples")
    for column in ("prompt", "completion", "answer", "split"):
        suite.add_expectation(e.ExpectColumnValuesToNotBeNull(column=column))
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="split", value_set=sorted(expected_rows)))
    suite.add_expectation(e.ExpectTableRowCountToEqual(value=sum(expected_rows.values())))
    # one row per prompt (with its system prompt and conversation) across all splits: train and held-out are disjoint
    suite.add_expectation(e.ExpectColumnValuesToBeUnique(column="key"))
    # every reference completion follows the task's answer format and its verifier accepts it
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="completion_verified", value_set=[True]))
    alphabet = "".join(sorted(set(task.alphabet())))
    suite.add_expectation(e.ExpectColumnValuesToMatchRegex(column="prompt", regex=f"^[{_escape(alphabet)}]+$"))
    return suite_report(batch.validate(suite, result_format="SUMMARY"))


def raise_if_failed(report: dict[str, Any], what: str) -> None:
    """A failing suite stops the stage with one line naming each failed expectation and examples."""
    if report["success"]:
        return
    from posttrain.errors import UserError

    failed = [c for c in report["checks"] if not c["success"]]
    summary = "; ".join(f"{c['expectation']}({c['column']}): {c['unexpected_count']} bad, e.g. {c['examples'][:2]}" for c in failed)
    raise UserError(f"{what} validation failed: {summary}")


def suite_report(result) -> dict[str, Any]:
    """A validation result as JSON: {success, checks: [{expectation, column, success, unexpected_count, examples}]}."""
    checks = [
        {
            "expectation": r.expectation_config.type,
            "column": r.expectation_config.kwargs.get("column") or r.expectation_config.kwargs.get("column_A"),
            "success": bool(r.success),
            "unexpected_count": (r.result or {}).get("unexpected_count"),
            "examples": [str(v) for v in (r.result or {}).get("partial_unexpected_list", [])[:5]],
        }
        for r in result.results
    ]
    return {"success": bool(result.success), "checks": checks}


def _escape(chars: str) -> str:
    return "".join("\\" + c if c in r"\]^-[" else c for c in chars)
