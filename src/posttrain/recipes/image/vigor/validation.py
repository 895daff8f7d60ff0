"""Great Expectations suite on curated quadruplets: what every emitted quadruplet must satisfy, as data checks, before training.

Every emitted quadruplet: distance <= d_max, capture gap >= the minimum, screening thresholds met, exactly
one known change class, a non-empty instruction, its four images on disk, a known split, a unique id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from posttrain.data.validation import suite_report
from posttrain.recipes.image.vigor.city import CHANGE_CLASSES


def validate_quadruplets(table: pd.DataFrame, source_root: Path, cfg) -> dict[str, Any]:
    """Run the suite on `table` (curate's output rows); `cfg` is CurateConfig. Returns {success, checks}."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    frame = table.assign(images_exist=[
        all((Path(source_root) / p).is_file() for p in paths)
        for paths in zip(table["street_old"], table["street_new"], table["sat_old"], table["sat_new"])
    ])
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("vigor").add_dataframe_asset(name="quadruplets")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})

    e = gx.expectations
    suite = gx.ExpectationSuite(name="vigor_quadruplets")
    suite.add_expectation(e.ExpectTableRowCountToBeBetween(min_value=1))
    suite.add_expectation(e.ExpectColumnValuesToBeUnique(column="pair_id"))
    suite.add_expectation(e.ExpectColumnValuesToBeBetween(column="distance_m", min_value=0, max_value=cfg.d_max_m))
    suite.add_expectation(e.ExpectColumnValuesToBeBetween(column="gap_years", min_value=cfg.min_gap_years))
    suite.add_expectation(e.ExpectColumnValuesToBeBetween(column="similarity", min_value=cfg.min_similarity, max_value=1.0 + 1e-6))
    suite.add_expectation(e.ExpectColumnValuesToBeBetween(column="inlier_ratio", min_value=cfg.min_inlier_ratio, max_value=1.0))
    suite.add_expectation(e.ExpectColumnValuesToBeBetween(column="brightness", min_value=cfg.min_brightness))
    suite.add_expectation(e.ExpectColumnValuesToBeBetween(column="sharpness", min_value=cfg.min_sharpness))
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="change", value_set=list(CHANGE_CLASSES)))
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="region", value_set=["left", "right", "centre", "none"]))
    suite.add_expectation(e.ExpectColumnValuesToMatchRegex(column="instruction", regex=r"\S"))
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "heldout"]))
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="images_exist", value_set=[True]))
    for column in ("old_id", "new_id", "city", "instruction", "description"):
        suite.add_expectation(e.ExpectColumnValuesToNotBeNull(column=column))
    return suite_report(batch.validate(suite, result_format="SUMMARY"))
