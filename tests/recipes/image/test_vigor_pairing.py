"""Spatial pairing (VIGOR-his step 1): the grid join finds exactly the pairs within d_max, checked against all
pairs by brute force and against scipy's cKDTree; bad coordinates are refused."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import cKDTree

from posttrain.recipes.image.vigor.city import CITY_CENTRES, panorama_table
from posttrain.recipes.image.vigor.pairing import EARTH_RADIUS_M, haversine_m, pairs_within


def as_set(pairs: np.ndarray) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in pairs}


def brute_force(lat, lon, city, d_max):
    out = set()
    for i in range(len(lat)):
        d = haversine_m(lat[i], lon[i], lat[i + 1 :], lon[i + 1 :])
        for k in np.flatnonzero((d <= d_max) & (city[i + 1 :] == city[i])):
            out.add((i, i + 1 + int(k)))
    return out


@pytest.mark.parametrize("d_max", [3.0, 10.0, 25.0])
def test_grid_join_equals_all_pairs_at_every_latitude(d_max):
    rng = np.random.default_rng(1)
    lat, lon, city = [], [], []
    for c, (_, lat0, lon0) in enumerate(CITY_CENTRES):  # from Singapore (1 N) to Oslo (60 N) and the south
        n = 150
        lat.append(lat0 + rng.normal(0, 60, n) / 111_195)  # ~60 m spread: dense, many pairs and near misses
        lon.append(lon0 + rng.normal(0, 60, n) / (111_195 * np.cos(np.radians(lat0))))
        city.append(np.full(n, c))
    lat, lon, city = map(np.concatenate, (lat, lon, city))
    got = pairs_within(lat, lon, city, d_max)
    assert (got[:, 0] < got[:, 1]).all()
    assert len(as_set(got)) == len(got)  # no duplicates
    assert as_set(got) == brute_force(lat, lon, city, d_max)


def test_same_pairs_as_scipy_cKDTree_on_the_synthetic_city():
    table = panorama_table(8000, 11, seed=3)
    lat, lon = table["lat"].to_numpy(), table["lon"].to_numpy()
    ours = pairs_within(lat, lon, table["city"].factorize()[0], 10.0)
    phi, lam = np.radians(lat), np.radians(lon)
    xyz = np.stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)], axis=1)
    peer = cKDTree(xyz).query_pairs(2 * np.sin(10.0 / (2 * EARTH_RADIUS_M)), output_type="ndarray")
    assert len(ours) > 1000
    assert as_set(ours) == as_set(np.sort(peer, axis=1))


def test_points_of_different_cities_are_never_paired():
    lat = np.array([40.0, 40.0, 40.0])
    lon = np.array([-74.0, -74.0, -74.00001])
    assert as_set(pairs_within(lat, lon, np.array([0, 1, 1]), 10.0)) == {(1, 2)}


def test_exactly_on_the_cell_boundary_and_at_d_max():
    # two points 9.99 m apart straddling a cell edge, and one 10.01 m away
    lat0 = 48.0
    step = 1 / 111_195
    lat = np.array([lat0, lat0 + 9.99 * step, lat0 + 20.0 * step, lat0 + 30.01 * step])
    lon = np.zeros(4) + 2.0
    got = as_set(pairs_within(lat, lon, np.zeros(4, int), 10.0))
    assert (0, 1) in got and (2, 3) not in got
    assert got == brute_force(lat, lon, np.zeros(4, int), 10.0)


@pytest.mark.parametrize("lat,lon,message", [
    ([np.nan, 1.0], [0.0, 0.0], "finite"),
    ([91.0, 1.0], [0.0, 0.0], "latitude"),
    ([1.0, 1.0], [0.0, 200.0], "longitude"),
])
def test_bad_coordinates_are_refused(lat, lon, message):
    with pytest.raises(ValueError, match=message):
        pairs_within(np.array(lat), np.array(lon), np.zeros(2, int), 10.0)


def test_empty_input():
    assert pairs_within(np.array([]), np.array([]), np.array([], int), 10.0).shape == (0, 2)
