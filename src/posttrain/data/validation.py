"""Great Expectations suite for task datasets: run before anything trains on the data."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from posttrain.tasks import Task


def validate_examples(frame: pd.DataFrame, task: Task, expected_rows: dict[str, int]) -> dict[str, Any]:
    """Validate the concatenated splits (`split` column; `completion_verified` = the task's verifier accepts
    the reference completion) and return a JSON-able report with `success`."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("posttrain").add_dataframe_asset(name="examples")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})

    e = gx.expectations
    suite = gx.ExpectationSuite(name="task_examples")
    for column in ("prompt", "completion", "answer", "split"):
        suite.add_expectation(e.ExpectColumnValuesToNotBeNull(column=column))
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="split", value_set=sorted(expected_rows)))
    suite.add_expectation(e.ExpectTableRowCountToEqual(value=sum(expected_rows.values())))
    # one row per prompt across all splits: train and held-out are disjoint
    suite.add_expectation(e.ExpectColumnValuesToBeUnique(column="prompt"))
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
