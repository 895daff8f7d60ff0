"""Stage `curate`: VIGOR-his pairing -> screening -> change labels -> instructions -> validated quadruplets.

Input `source`: a directory with panoramas.parquet, tiles.parquet and the images they name (the `city`
stage's output, or a real crawl in the same format). Outputs: quadruplets.parquet, images.npz, report.json
(funnel and counts per city and class), validation.json (Great Expectations), samples.png. When the source
holds a synthetic city's truth/, pairing precision / recall and change-classification accuracy against it.
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import numpy as np

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.stages import stages


def truth_metrics(source: Path, table, min_gap_years: int) -> dict[str, float]:
    """Pairing precision / recall and change-class accuracy against the synthetic city's recorded truth."""
    import pandas as pd

    from posttrain.recipes.image.vigor.city import true_pairs

    panos = pd.read_parquet(source / "truth" / "panoramas.parquet")
    scenes = pd.read_parquet(source / "truth" / "scenes.parquet")
    expected = true_pairs(panos, min_gap_years)
    emitted = set(zip(table["old_id"], table["new_id"]))
    hits = emitted & expected
    location = panos.set_index("id")["location"]
    # classification is judged on the true pairs emitted (a wrong pair has no true class)
    correct = [scenes["change"].iloc[location[n]] == c for o, n, c in zip(table["old_id"], table["new_id"], table["change"]) if (o, n) in hits]
    return {
        "pairing_precision": len(hits) / max(len(emitted), 1),
        "pairing_recall": len(hits) / max(len(expected), 1),
        "classification_accuracy": float(np.mean(correct)) if correct else 0.0,
    }


def sample_grid(images: np.ndarray, rows: int):
    """A figure of `rows` quadruplets: S_old | S_new | A_old | A_new."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, min(rows, len(images)))
    fig, axes = plt.subplots(rows, 4, figsize=(6, 1.6 * rows), squeeze=False)
    for r in range(rows):
        for c, title in enumerate(("S_old (target)", "S_new", "A_old", "A_new")):
            axes[r][c].imshow(images[r, c])
            axes[r][c].axis("off")
            if r == 0:
                axes[r][c].set_title(title, fontsize=7)
    fig.tight_layout()
    return fig


@stages.register("curate", sections=("curate",), inputs={"source": "outputs/images/city"}, gpu=False, requires={"source": ["panoramas.parquet", "tiles.parquet"]})
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.data.validation import raise_if_failed
    from posttrain.recipes.image.vigor.curate import curate, read_sources, report
    from posttrain.recipes.image.vigor.validation import validate_quadruplets

    start = time.perf_counter()
    source = inputs["source"]
    sources = read_sources(source)
    result = curate(sources, cfg.curate)
    table = result.table
    if table.empty:
        from posttrain.errors import UserError

        raise UserError(f"curate: no quadruplet survived ({result.funnel}); check the source or loosen the curate thresholds")
    # the split follows the recent panorama, so one place never sits in both splits
    bucket = np.array([zlib.crc32(n.encode()) % 1000 for n in table["new_id"]])
    table["split"] = np.where(bucket < cfg.curate.heldout_fraction * 1000, "heldout", "train")
    validation = validate_quadruplets(table, source, cfg.curate)
    (out_dir / "validation.json").write_text(strict_json(validation, indent=2) + "\n")
    raise_if_failed(validation, "quadruplet")
    table.to_parquet(out_dir / "quadruplets.parquet", index=False)
    np.savez_compressed(out_dir / "images.npz", images=result.images)
    counts = report(table)
    (out_dir / "report.json").write_text(strict_json({"funnel": result.funnel, "counts": counts.to_dict(orient="index")}, indent=2) + "\n")
    seconds = time.perf_counter() - start
    metrics = {
        "n_quadruplets": float(len(table)), "n_train": float((table["split"] == "train").sum()),
        "n_heldout": float((table["split"] == "heldout").sum()), "panoramas_per_second": len(sources.panoramas) / seconds,
        **{f"funnel/{k}": float(v) for k, v in result.funnel.items()},
    }
    if (source / "truth").is_dir():
        metrics.update(truth_metrics(source, table, cfg.curate.min_gap_years))
    tracker.log_metrics(metrics)
    tracker.log_table(counts.reset_index(names="city").to_dict(orient="records"), "counts_per_city_and_class.json")
    tracker.log_table(table[["pair_id", "city", "change", "region", "description", "instruction"]].head(50).to_dict(orient="records"),
                      "quadruplets.json")
    figure = sample_grid(result.images, 6)
    figure.savefig(out_dir / "samples.png", dpi=100)
    tracker.log_figure(figure, "samples.png")
    return metrics
