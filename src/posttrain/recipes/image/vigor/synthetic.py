"""Write a synthetic city to disk in the curation stage's input format, with its truth kept apart.

    panoramas.parquet  id, city, lat, lon, capture_date, heading, image_path   (what a real crawl provides)
    tiles.parquet      tile_id, city, lat, lon, epoch (old|new), year, image_path
    images/*.png, tiles/*.png
    truth/panoramas.parquet (location, distractor, ...), truth/scenes.parquet (change class, side, ...)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from posttrain.recipes.image.vigor.city import panorama_table, scene_at, scene_table
from posttrain.recipes.image.vigor.render import degrade, satellite_tile, street_view

TILE_YEARS = {"old": 2010, "new": 2022}


def to_png(array: np.ndarray, path: Path) -> None:
    Image.fromarray((np.clip(array, 0, 1) * 255).round().astype(np.uint8)).save(path, compress_level=1)


def write_city(out: Path, n_locations: int, n_cities: int, image_size: int, seed: int) -> dict[str, int]:
    out = Path(out)
    for sub in ("images", "tiles", "truth"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    panos = panorama_table(n_locations, n_cities, seed)
    scenes = scene_table(n_locations, seed)
    rng = np.random.default_rng(seed + 2)
    paths = []
    for row in panos.itertuples(index=False):
        scene = scenes.iloc[row.location]
        if row.distractor == "other_heading":  # facing the other way: a different street front altogether
            scene = scenes.iloc[(row.location * 7919 + 13) % n_locations]
        view = degrade(street_view(scene_at(scene, row.year), image_size, rng), row.distractor)
        path = f"images/{row.id}.png"
        to_png(view, out / path)
        paths.append(path)
    month_day = rng.integers(1, 13, len(panos)), rng.integers(1, 29, len(panos))
    table = pd.DataFrame({
        "id": panos["id"], "city": panos["city"], "lat": panos["lat"], "lon": panos["lon"],
        "capture_date": [f"{y:04d}-{m:02d}-{d:02d}" for y, m, d in zip(panos["year"], *month_day)],
        "heading": panos["heading"], "image_path": paths,
    })
    recent = panos[panos["is_recent"]]
    tiles = []
    for epoch, year in TILE_YEARS.items():
        for row in recent.itertuples(index=False):
            tile_id = f"t{row.location:07d}_{epoch}"
            to_png(satellite_tile(scene_at(scenes.iloc[row.location], year), image_size, rng), out / f"tiles/{tile_id}.png")
            # a tile is centred on the recent capture of its location
            tiles.append({"tile_id": tile_id, "city": row.city, "lat": row.lat, "lon": row.lon, "epoch": epoch, "year": year,
                          "image_path": f"tiles/{tile_id}.png"})
    table.to_parquet(out / "panoramas.parquet", index=False)
    pd.DataFrame(tiles).to_parquet(out / "tiles.parquet", index=False)
    panos.to_parquet(out / "truth" / "panoramas.parquet", index=False)
    scenes.to_parquet(out / "truth" / "scenes.parquet", index=False)
    return {"n_panoramas": len(table), "n_tiles": len(tiles), "n_locations": n_locations}
