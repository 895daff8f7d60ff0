"""Stage `city`: draw a synthetic city (street views + two-epoch satellite tiles, with their truth) as curate's input.

Outputs: panoramas.parquet, tiles.parquet, images/, tiles/, truth/ (see recipes/image/vigor/synthetic.py).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import Config
from posttrain.stages import stages


@stages.register("city", sections=("city",), inputs={}, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from posttrain.recipes.image.vigor.synthetic import write_city

    counts = write_city(out_dir, cfg.city.n_locations, cfg.city.n_cities, cfg.city.image_size, cfg.pipeline.seed)
    metrics = {k: float(v) for k, v in counts.items()}
    tracker.log_metrics(metrics)
    return metrics
