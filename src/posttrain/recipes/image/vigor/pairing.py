"""Spatial pairing of panoramas: every pair closer than `d_max` metres (great-circle), without all pairs.

VIGOR-his step 1 (the CrossTimeEdit dataset pipeline): pair each recent panorama with the historical captures of the same place.
Panoramas come clustered in cities a few kilometres wide, and d_max is metres, so a flat projection per
city is exact enough to *find candidates* and the haversine formula then *decides*:

1. Per city, a local equirectangular projection around the city's mean latitude/longitude:
   x = R cos(lat0) dlon, y = R dlat (metres).
2. Integer grid cells of side `cell >= d_max` (slightly above d_max, by the projection's worst distortion
   over the city's latitude span, so no pair within d_max can fall outside neighbouring cells).
3. Sort the points by cell key; join each occupied cell with itself and four of its eight neighbours
   (the other four are the same pairs seen from the other side). With y last in the key, the partners of
   a point are two contiguous ranges of the sorted array, expanded with `np.repeat`.
4. Drop candidates farther than one cell side apart in the projection (safe by step 2), then keep those
   whose haversine distance is <= d_max (the exact test).

Everything is numpy on flat arrays; the cost is a sort plus work proportional to the candidates.
"""

from __future__ import annotations

import numpy as np

EARTH_RADIUS_M = 6_371_008.8  # mean Earth radius (IUGG), the same sphere for our check and for the chord peer

SIDE = 1 << 20  # grid cells a side per city (10,000 km at 10 m); (city, cx, cy) packs into one int64 key


def haversine_m(lat1: np.ndarray, lon1: np.ndarray, lat2: np.ndarray, lon2: np.ndarray) -> np.ndarray:
    """Great-circle distance in metres between points given in degrees."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dp, dl = p2 - p1, np.radians(lon2 - lon1)
    h = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def _project(lat: np.ndarray, lon: np.ndarray, city: np.ndarray, d_max: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(x, y, cell key, cell side): local equirectangular metres around each city's mean position, the
    packed int64 key of each point's grid cell, and the side of the cells (metres)."""
    sizes = np.bincount(city)
    lat0 = np.bincount(city, weights=lat) / np.maximum(sizes, 1)
    lon0 = np.bincount(city, weights=lon) / np.maximum(sizes, 1)
    cos0 = np.cos(np.radians(lat0))[city]
    # east-west distances are scaled by cos(lat0)/cos(lat) (about 1 +- 1e-3 across a city): grow the cell
    # by the worst case, so that a pair within d_max is never more than one cell apart in x or in y
    worst = float(np.max(cos0 / np.cos(np.radians(lat))))
    cell = d_max * max(1.0, worst) * (1 + 1e-9) + 1e-9
    x = np.radians(lon - lon0[city]) * (EARTH_RADIUS_M * cos0)
    y = np.radians(lat - lat0[city]) * EARTH_RADIUS_M
    cx = np.floor(x / cell).astype(np.int64) + SIDE // 2  # centred, so the +-1 neighbours stay in [0, SIDE)
    cy = np.floor(y / cell).astype(np.int64) + SIDE // 2
    if min(cx.min(), cy.min()) < 1 or max(cx.max(), cy.max()) >= SIDE - 1:
        raise ValueError(f"a city spans more than {SIDE // 2} cells of {cell:.1f} m from its centre; split it into smaller cities")
    return x, y, (city.astype(np.int64) * SIDE + cx) * SIDE + cy, cell


def _expand(first: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every point p (a sorted position) and its partners at the positions [first[p], stop[p]):
    the flat arrays (p, partner). No division, two repeats."""
    count = np.maximum(stop - first, 0)
    total = int(count.sum())
    before = np.cumsum(count) - count  # partners emitted for the points before p
    points = np.arange(count.size, dtype=np.int64)
    return np.repeat(points, count), np.arange(total, dtype=np.int64) + np.repeat(first - before, count)


def pairs_within(lat: np.ndarray, lon: np.ndarray, city: np.ndarray, d_max: float) -> np.ndarray:
    """[P, 2] int64 index pairs (i < j, in no particular order) of points at great-circle distance <= d_max metres.

    `city` is an integer cluster id per point; points of different cities are never paired (cities are
    kilometres apart). Raises ValueError on non-finite or out-of-range coordinates."""
    lat, lon = np.asarray(lat, np.float64), np.asarray(lon, np.float64)
    city = np.asarray(city, np.int64)
    if not (np.isfinite(lat).all() and np.isfinite(lon).all()):
        raise ValueError("coordinates must be finite")
    if (np.abs(lat) > 85).any() or (np.abs(lon) > 180).any():
        raise ValueError("latitude must lie in [-85, 85] and longitude in [-180, 180]")
    if not d_max > 0:
        raise ValueError("d_max must be positive")
    if lat.size == 0:
        return np.empty((0, 2), np.int64)
    x, y, keys, cell = _project(lat, lon, city, d_max)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    # Keys are (city, cx, cy) packed with cy last, so the cells (cx, cy..cy+1) and (cx+1, cy-1..cy+1) are
    # each ONE contiguous range of the sorted array. Pairing every point with the points after it in its own
    # cell and the next (cy+1), and with the three cells of column cx+1, visits every pair of neighbouring
    # cells exactly once (the half-neighbourhood), each pair once with no duplicates to remove.
    new_cell = np.empty(sorted_keys.size, bool)
    new_cell[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=new_cell[1:])
    starts = np.flatnonzero(new_cell)  # one run of the sorted array per occupied cell
    cells = sorted_keys[starts]
    ends = np.append(starts[1:], sorted_keys.size)
    run_of = np.cumsum(new_cell) - 1  # the run (cell) of every sorted position
    # own column: the run itself, extended by the next run when that is the cell cy + 1
    follows = np.append(cells[1:] == cells[:-1] + 1, False)
    own_stop = np.where(follows, np.append(ends[1:], 0), ends)
    # next column: the cells (cx + 1, cy - 1 .. cy + 1), one search per cell rather than per point
    next_lo = np.searchsorted(sorted_keys, cells + (SIDE - 1), side="left")
    next_hi = np.searchsorted(sorted_keys, cells + (SIDE + 1), side="right")
    position = np.arange(sorted_keys.size, dtype=np.int64)
    i1, j1 = _expand(position + 1, own_stop[run_of])
    i2, j2 = _expand(next_lo[run_of], next_hi[run_of])
    i, j = np.concatenate([i1, i2]), np.concatenate([j1, j2])
    # cheap, safe reject: a pair within d_max lies within one cell side in the projection (see _project)
    xs, ys = x[order], y[order]
    near = (xs[i] - xs[j]) ** 2 + (ys[i] - ys[j]) ** 2 <= cell**2
    i, j = i[near], j[near]
    # exact test: haversine <= d_max  <=>  h <= sin^2(d_max / 2R); per-point trig computed once
    phi, lam = np.radians(lat[order]), np.radians(lon[order])
    cos_phi = np.cos(phi)
    h = np.sin((phi[j] - phi[i]) * 0.5) ** 2 + cos_phi[i] * cos_phi[j] * np.sin((lam[j] - lam[i]) * 0.5) ** 2
    close = h <= np.sin(d_max / (2 * EARTH_RADIUS_M)) ** 2
    i, j = order[i[close]], order[j[close]]
    return np.stack([np.minimum(i, j), np.maximum(i, j)], axis=1)
