"""A synthetic city with known truth: where panoramas were captured, when, what each view shows, what changed.

Geometry (used by the curation stage and by `benchmarks/pairing.py` at a million panoramas): each city is a
street grid around a real city centre; capture locations sit every `location_spacing_m` along the streets;
every location has one recent capture and, with some probability, historical captures, each with GPS
jitter. Some historical captures are distractors the curation must reject: too recent (gap < the
minimum), taken facing another way, or unusable (night, motion blur).

Scenes (curation only): a location's street view is three slots (left side, road, right side); the left
and right slots hold a building, a tree or nothing, the road has a width. Between the two epochs exactly
one change happens (or none): construction, demolition, vegetation or road, on one side. Street views
and top-down satellite tiles of both epochs are rendered from the same scene, so every label the
curation infers can be checked against the truth recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# (name, latitude, longitude): real centres so that the projection sees realistic latitudes
CITY_CENTRES = (
    ("new_york", 40.7128, -74.0060), ("seattle", 47.6062, -122.3321), ("chicago", 41.8781, -87.6298),
    ("san_francisco", 37.7749, -122.4194), ("london", 51.5074, -0.1278), ("paris", 48.8566, 2.3522),
    ("tokyo", 35.6762, 139.6503), ("singapore", 1.3521, 103.8198), ("sydney", -33.8688, 151.2093),
    ("sao_paulo", -23.5505, -46.6333), ("oslo", 59.9139, 10.7522),
)
CHANGE_CLASSES = ("no_change", "construction", "demolition", "vegetation", "road")
SIDES = ("left", "right")
DISTRACTORS = ("none", "small_gap", "other_heading", "night", "blur")
UNUSABLE = ("other_heading", "night", "blur")  # captures no valid pair may include
METRES_PER_DEG_LAT = 111_195.0


@dataclass(frozen=True)
class Layout:
    street_spacing_m: float = 80.0
    location_spacing_m: float = 20.0
    gps_jitter_m: float = 1.5
    historical_per_location: float = 1.2  # mean number of historical captures per location (Poisson)
    distractor_rate: float = 0.25  # share of historical captures that are distractors
    recent_years: tuple[int, int] = (2019, 2024)
    historical_years: tuple[int, int] = (2008, 2012)  # spans less than the usual minimum gap of 5 years
    change_years: tuple[int, int] = (2013, 2018)  # the change happens between the two epochs


def _street_points(n: int, spacing: float, street: float) -> tuple[np.ndarray, np.ndarray]:
    """n points (metres) on a roughly square street grid, `spacing` apart along alternating horizontal and
    vertical streets `street` apart."""
    per_street = max(1, int(np.sqrt(n * street / (2 * spacing))))
    idx = np.arange(n)
    street_id, along = idx // per_street, (idx % per_street) * spacing
    vertical = street_id % 2 == 1
    offset = (street_id // 2) * street + street / 2  # streets of the two directions never share a point
    x = np.where(vertical, offset, along)
    y = np.where(vertical, along, offset)
    return x.astype(np.float64), y.astype(np.float64)


def panorama_table(n_locations: int, n_cities: int, seed: int, layout: Layout = Layout()) -> pd.DataFrame:
    """One row per capture: id, city, lat, lon, year, heading, location, is_recent, distractor."""
    if not 1 <= n_cities <= len(CITY_CENTRES):
        raise ValueError(f"n_cities must be in [1, {len(CITY_CENTRES)}]")
    rng = np.random.default_rng(seed)
    city = np.arange(n_locations) % n_cities
    loc_lat, loc_lon = np.empty(n_locations), np.empty(n_locations)
    for c in range(n_cities):
        members = np.flatnonzero(city == c)
        x, y = _street_points(members.size, layout.location_spacing_m, layout.street_spacing_m)
        _, lat0, lon0 = CITY_CENTRES[c]
        loc_lat[members] = lat0 + (y - y.mean()) / METRES_PER_DEG_LAT
        loc_lon[members] = lon0 + (x - x.mean()) / (METRES_PER_DEG_LAT * np.cos(np.radians(lat0)))
    heading = rng.uniform(0, 360, n_locations)

    n_hist = rng.poisson(layout.historical_per_location, n_locations)
    location = np.concatenate([np.arange(n_locations), np.repeat(np.arange(n_locations), n_hist)])
    is_recent = np.arange(location.size) < n_locations
    distractor = np.where(is_recent, "none", "none").astype(object)
    hist = ~is_recent
    kinds = rng.choice(np.array(DISTRACTORS[1:], dtype=object), size=int(hist.sum()))
    distractor[hist] = np.where(rng.random(int(hist.sum())) < layout.distractor_rate, kinds, "none")

    year = np.where(is_recent, rng.integers(*layout.recent_years, endpoint=True, size=location.size),
                    rng.integers(*layout.historical_years, endpoint=True, size=location.size))
    small_gap = distractor == "small_gap"  # a capture shortly before the recent one
    year[small_gap] = year[:n_locations][location[small_gap]] - rng.integers(1, 4, size=int(small_gap.sum()))
    cap_heading = heading[location] + rng.normal(0, 5, location.size)
    turned = distractor == "other_heading"
    cap_heading[turned] += rng.uniform(120, 240, int(turned.sum()))

    jitter = rng.normal(0, layout.gps_jitter_m, (location.size, 2))
    lat = loc_lat[location] + jitter[:, 0] / METRES_PER_DEG_LAT
    lon = loc_lon[location] + jitter[:, 1] / (METRES_PER_DEG_LAT * np.cos(np.radians(loc_lat[location])))
    names = np.array([CITY_CENTRES[c][0] for c in range(n_cities)], dtype=object)
    return pd.DataFrame({
        "id": [f"p{i:07d}" for i in range(location.size)],
        "city": names[city[location]],
        "lat": lat, "lon": lon,
        "year": year.astype(np.int64),
        "heading": np.mod(cap_heading, 360.0),
        "location": location.astype(np.int64),
        "is_recent": is_recent,
        "distractor": distractor.astype(str),
    })


def scene_table(n_locations: int, seed: int) -> pd.DataFrame:
    """Per location: the recent scene (left/right slot contents, road width) and the one change to the past."""
    rng = np.random.default_rng(seed + 1)
    left = rng.choice(["building", "tree", "empty"], n_locations, p=[0.5, 0.3, 0.2])
    right = rng.choice(["building", "tree", "empty"], n_locations, p=[0.5, 0.3, 0.2])
    change = rng.choice(np.array(CHANGE_CLASSES), n_locations)
    side = rng.choice(np.array(SIDES), n_locations)
    return pd.DataFrame({
        "location": np.arange(n_locations), "left": left, "right": right,
        "road_width": rng.uniform(0.2, 0.3, n_locations), "change": change,
        "side": np.where(change == "road", "centre", np.where(change == "no_change", "none", side)),
        "hue": rng.uniform(0, 1, n_locations), "height": rng.uniform(0.35, 0.7, n_locations),
        "change_year": rng.integers(*Layout().change_years, endpoint=True, size=n_locations),
    })


def past_scene(scene: pd.Series) -> dict:
    """The scene at the historical epoch: undo the recorded change (the recent scene is the row itself).

    construction: a building exists now on `side` that did not exist then (then: empty lot);
    demolition: a building stood then where the slot is empty now; vegetation: a tree stood then where
    there is none now (or none where there is one now); road: the road was narrower then."""
    past = recent_scene(scene)
    kind, side = scene["change"], scene["side"]
    if kind == "construction":
        past[side] = "empty"
    elif kind == "demolition":
        past[side] = "building"
    elif kind == "vegetation":
        past[side] = "empty" if past[side] == "tree" else "tree"
    elif kind == "road":
        past["road_width"] = scene["road_width"] * 0.55
    return past


def recent_scene(scene: pd.Series) -> dict:
    """The recent scene; construction forces a building, demolition an empty slot and vegetation a tree or
    an empty slot on the changed side, so that the change is exactly of its class."""
    now = {k: scene[k] for k in ("left", "right", "road_width", "hue", "height")}
    kind, side = scene["change"], scene["side"]
    if kind == "construction":
        now[side] = "building"
    elif kind == "demolition" or (kind == "vegetation" and now[side] == "building"):
        now[side] = "empty"
    return now


def scene_at(scene: pd.Series, year: int) -> dict:
    return recent_scene(scene) if year >= scene["change_year"] else past_scene(scene)


def true_pairs(panoramas: pd.DataFrame, min_gap_years: int) -> set[tuple[str, str]]:
    """The pairs curation should emit, as (older id, newer id): same location, gap >= min_gap_years, and
    neither capture unusable. Used to measure pairing precision and recall."""
    usable = panoramas[~panoramas["distractor"].isin(UNUSABLE)]
    out = set()
    for _, group in usable.groupby("location"):
        rows = group.sort_values("year")[["id", "year"]].to_numpy()
        for a in range(len(rows)):
            for b in range(a + 1, len(rows)):
                if rows[b][1] - rows[a][1] >= min_gap_years:
                    out.add((rows[a][0], rows[b][0]))
    return out
