"""The VIGOR-his curation pipeline (CrossTimeEdit's dataset, 2026): panoramas + two-epoch satellite tiles -> validated quadruplets.

    read_sources      the panorama and tile tables, checked row by row (a bad table is a UserError)
    pair_panoramas    spatial index pairs within d_max, then the capture-gap rule (pairing.py)
    attach_tiles      the old and new satellite tile nearest the recent panorama
    screen            same place and viewpoint (embedding similarity, geometric agreement of feature matches) and
                      usable captures (brightness, sharpness)
    label             change class from the satellite pair, description + instruction, instruction validation
A quadruplet is (S_old, S_new, A_old, A_new) + instruction; the task is (S_new, A_old, A_new, text) -> S_old.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from posttrain.data.files import read_parquet
from posttrain.recipes.image.vigor.pairing import haversine_m, pairs_within
from posttrain.recipes.image.vigor.steps import (change_classifiers, embedders, geometric_checks, instruction_writers, persistent_similarity,
                                        quality, validate_instruction)
from posttrain.errors import UserError

PANORAMA_COLUMNS = {"id": "string", "city": "string", "lat": "float", "lon": "float", "capture_date": "date", "heading": "float",
                    "image_path": "string"}
TILE_COLUMNS = {"tile_id": "string", "city": "string", "lat": "float", "lon": "float", "epoch": "string", "year": "int",
                "image_path": "string"}


@dataclass(frozen=True)
class Sources:
    root: Path
    panoramas: pd.DataFrame  # + year (from capture_date)
    tiles: pd.DataFrame


def _read_table(path: Path, columns: dict[str, str]) -> pd.DataFrame:
    frame = read_parquet(path, "curate")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise UserError(f"curate: {path.name} lacks column(s) {', '.join(missing)}; expected {', '.join(columns)}")
    if frame.empty:
        raise UserError(f"curate: {path.name} has no rows")
    for name, kind in columns.items():
        column = frame[name]
        if column.isna().any():
            raise UserError(f"curate: {path.name} column {name!r} has {int(column.isna().sum())} empty value(s), e.g. row {int(column.isna().idxmax())}")
        if kind in ("float", "int") and not pd.api.types.is_numeric_dtype(column):
            raise UserError(f"curate: {path.name} column {name!r} must be numeric, got {column.dtype}")
    if not frame[list(columns)[0]].is_unique:
        raise UserError(f"curate: {path.name} has duplicate {list(columns)[0]!r} values")
    bad = ~frame["lat"].between(-85, 85) | ~frame["lon"].between(-180, 180)
    if bad.any():
        raise UserError(f"curate: {path.name} has {int(bad.sum())} row(s) with coordinates out of range, e.g. row {int(bad.idxmax())}")
    return frame


def read_sources(root: Path) -> Sources:
    root = Path(root)
    panos = _read_table(root / "panoramas.parquet", PANORAMA_COLUMNS)
    dates = pd.to_datetime(panos["capture_date"], errors="coerce", format="%Y-%m-%d")
    if dates.isna().any():
        raise UserError(f"curate: panoramas.parquet capture_date {panos['capture_date'][dates.isna()].iloc[0]!r} is not a YYYY-MM-DD date")
    panos = panos.assign(year=dates.dt.year.astype(np.int64))
    tiles = _read_table(root / "tiles.parquet", TILE_COLUMNS)
    epochs = set(tiles["epoch"])
    if epochs != {"old", "new"}:
        raise UserError(f"curate: tiles.parquet epoch must hold exactly 'old' and 'new', got {sorted(epochs)}")
    for name, frame in (("panoramas.parquet", panos), ("tiles.parquet", tiles)):
        missing = [p for p in frame["image_path"] if not (root / p).is_file()]
        if missing:
            raise UserError(f"curate: {name} names {len(missing)} image(s) that do not exist, e.g. {root / missing[0]}")
    return Sources(root, panos, tiles)


def city_codes(cities: pd.Series) -> np.ndarray:
    return pd.factorize(cities)[0].astype(np.int64)


def pair_panoramas(panos: pd.DataFrame, d_max: float, min_gap_years: int) -> pd.DataFrame:
    """(old, new, distance_m, gap_years) for every pair within d_max whose capture years differ by min_gap."""
    pairs = pairs_within(panos["lat"].to_numpy(), panos["lon"].to_numpy(), city_codes(panos["city"]), d_max)
    years = panos["year"].to_numpy()
    i, j = pairs[:, 0], pairs[:, 1]
    older = np.where(years[i] <= years[j], i, j)
    newer = np.where(years[i] <= years[j], j, i)
    gap = years[newer] - years[older]
    keep = gap >= min_gap_years
    older, newer = older[keep], newer[keep]
    lat, lon = panos["lat"].to_numpy(), panos["lon"].to_numpy()
    return pd.DataFrame({
        "old": older, "new": newer, "gap_years": gap[keep],
        "distance_m": haversine_m(lat[older], lon[older], lat[newer], lon[newer]),
    })


def attach_tiles(pairs: pd.DataFrame, panos: pd.DataFrame, tiles: pd.DataFrame, radius: float) -> pd.DataFrame:
    """Row index of the nearest 'old' and 'new' tile within `radius` of each pair's recent panorama (-1: none)."""
    out = pairs.copy()
    all_cities = pd.factorize(pd.concat([panos["city"], tiles["city"]], ignore_index=True))[0]
    pano_city, tile_city = all_cities[: len(panos)], all_cities[len(panos) :]
    for epoch in ("old", "new"):
        idx = np.flatnonzero(tiles["epoch"].to_numpy() == epoch)
        query = pairs["new"].to_numpy()
        lat = np.concatenate([panos["lat"].to_numpy()[query], tiles["lat"].to_numpy()[idx]])
        lon = np.concatenate([panos["lon"].to_numpy()[query], tiles["lon"].to_numpy()[idx]])
        city = np.concatenate([pano_city[query], tile_city[idx]])
        found = pairs_within(lat, lon, city, radius)
        q, t = found[:, 0], found[:, 1]
        cross = (q < len(query)) & (t >= len(query))
        q, t = q[cross], t[cross] - len(query)
        dist = haversine_m(lat[q], lon[q], tiles["lat"].to_numpy()[idx[t]], tiles["lon"].to_numpy()[idx[t]])
        nearest = np.full(len(query), -1, np.int64)
        best = np.full(len(query), np.inf)
        for qi, ti, d in zip(q, t, dist):  # candidates are few (tiles sit metres apart): a plain loop is enough
            if d < best[qi]:
                best[qi], nearest[qi] = d, idx[ti]
        out[f"tile_{epoch}"] = nearest
    return out


def load_image(root: Path, path: str) -> np.ndarray:
    with Image.open(root / path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0


@dataclass(frozen=True)
class Quadruplets:
    table: pd.DataFrame  # one row per emitted quadruplet
    images: np.ndarray  # [N, 4, H, W, 3] uint8: S_old, S_new, A_old, A_new
    funnel: dict[str, int]  # how many pairs survived each step


def curate(sources: Sources, cfg) -> Quadruplets:
    """Run pairing, tile lookup, screening, labelling and instruction validation; `cfg` is CurateConfig."""
    panos, tiles, root = sources.panoramas, sources.tiles, sources.root
    pairs = pair_panoramas(panos, cfg.d_max_m, cfg.min_gap_years)
    funnel = {"panoramas": len(panos), "pairs_within_d_max_and_gap": len(pairs)}
    pairs = attach_tiles(pairs, panos, tiles, cfg.tile_radius_m)
    pairs = pairs[(pairs["tile_old"] >= 0) & (pairs["tile_new"] >= 0)].reset_index(drop=True)
    funnel["with_tiles"] = len(pairs)

    embed = embedders.get(cfg.embedder)
    agreement = geometric_checks.get(cfg.geometric_check)
    classify = change_classifiers.get(cfg.classifier)
    write = instruction_writers.get(cfg.instruction_writer)
    cache: dict[str, np.ndarray] = {}

    def image(path: str) -> np.ndarray:
        if path not in cache:
            cache[path] = load_image(root, path)
        return cache[path]

    rows, arrays = [], []
    counts = {"screened": 0, "labelled": 0, "validated": 0}
    for pair in pairs.itertuples(index=False):
        old, new = panos.iloc[pair.old], panos.iloc[pair.new]
        s_old, s_new = image(old["image_path"]), image(new["image_path"])
        similarity = persistent_similarity(embed, s_old, s_new)
        (b_old, sharp_old), (b_new, sharp_new) = quality(s_old), quality(s_new)
        if similarity < cfg.min_similarity or min(b_old, b_new) < cfg.min_brightness or min(sharp_old, sharp_new) < cfg.min_sharpness:
            continue
        inlier_ratio = agreement(s_old, s_new)  # after the cheap tests: feature matching costs the most
        if inlier_ratio < cfg.min_inlier_ratio:
            continue
        counts["screened"] += 1
        a_old, a_new = image(tiles["image_path"].iloc[pair.tile_old]), image(tiles["image_path"].iloc[pair.tile_new])
        change, region, direction = classify(a_old, a_new, cfg.min_changed)
        description, instruction = write(change, region, direction, int(old["year"]), int(new["year"]))
        counts["labelled"] += 1
        if not validate_instruction(instruction, change, region, s_old, s_new, cfg.min_region_share):
            continue
        counts["validated"] += 1
        rows.append({
            "pair_id": f"{old['id']}__{new['id']}", "old_id": old["id"], "new_id": new["id"], "city": new["city"],
            "year_old": int(old["year"]), "year_new": int(new["year"]), "gap_years": int(pair.gap_years),
            "distance_m": float(pair.distance_m), "similarity": similarity, "inlier_ratio": inlier_ratio, "brightness": min(b_old, b_new),
            "sharpness": min(sharp_old, sharp_new), "change": change, "region": region, "direction": direction,
            "description": description, "instruction": instruction,
            "street_old": old["image_path"], "street_new": new["image_path"],
            "sat_old": tiles["image_path"].iloc[pair.tile_old], "sat_new": tiles["image_path"].iloc[pair.tile_new],
        })
        arrays.append(np.stack([s_old, s_new, a_old, a_new]))
    funnel.update(counts)
    table = pd.DataFrame(rows, columns=list(rows[0]) if rows else None)
    images = (np.stack(arrays) * 255).round().astype(np.uint8) if arrays else np.zeros((0, 4, 1, 1, 3), np.uint8)
    return Quadruplets(table, images, funnel)


def report(table: pd.DataFrame) -> pd.DataFrame:
    """Counts per city and change class (rows: cities + 'total'; columns: classes + 'total')."""
    from posttrain.recipes.image.vigor.city import CHANGE_CLASSES

    counts = pd.crosstab(table["city"], table["change"]).reindex(columns=list(CHANGE_CLASSES), fill_value=0)
    counts["total"] = counts.sum(axis=1)
    counts.loc["total"] = counts.sum(axis=0)
    return counts
