"""Spatial pairing speed: posttrain's grid join against scipy's cKDTree, on the same panoramas, in one run.

    python benchmarks/pairing.py --json outputs/bench/pairing.json [--n 1000000] [--d-max 10] [--repeats 5]

Panoramas: `n` captures from the synthetic city generator (11 street-grid cities, GPS jitter; a location's
captures sit metres apart, neighbouring locations 20 m apart), so d_max = 10 m finds real pairs and many
near misses. The peer is the best general-purpose tool for the job: scipy's `cKDTree.query_pairs` on
unit-sphere (x, y, z) with the chord radius 2 sin(d_max / 2R), exact for great-circle distance on the same
sphere. Each side's time includes everything from (lat, lon) in degrees to the pair array; the two are
alternated `repeats` times and the fastest run of each compared (the machine is shared: the minimum is
the least load-dependent estimate; medians are reported too).

Writes {"n", "ours_s", "scipy_s", "ratio", "same_pairs", "n_pairs"}; targets: same_pairs and ratio <= 0.5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

from posttrain.recipes.image.vigor.city import panorama_table
from posttrain.recipes.image.vigor.pairing import EARTH_RADIUS_M, pairs_within

RATIO_TARGET = 0.5
CAPTURES_PER_LOCATION = 2.2  # 1 recent + Poisson(1.2) historical (city.Layout)


def scipy_pairs(lat: np.ndarray, lon: np.ndarray, d_max: float) -> np.ndarray:
    phi, lam = np.radians(lat), np.radians(lon)
    xyz = np.stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)], axis=1)
    return cKDTree(xyz).query_pairs(2 * np.sin(d_max / (2 * EARTH_RADIUS_M)), output_type="ndarray")


def canonical(pairs: np.ndarray) -> np.ndarray:
    pairs = np.sort(pairs, axis=1)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d-max", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    table = panorama_table(int(args.n / CAPTURES_PER_LOCATION * 1.05) + 1, 11, args.seed).iloc[: args.n]
    if len(table) < args.n:
        raise SystemExit(f"generator produced {len(table)} < {args.n} panoramas")
    lat, lon = table["lat"].to_numpy(), table["lon"].to_numpy()
    city = table["city"].factorize()[0]
    ours_times, scipy_times = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        ours = pairs_within(lat, lon, city, args.d_max)
        ours_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        peer = scipy_pairs(lat, lon, args.d_max)
        scipy_times.append(time.perf_counter() - start)
    ours_s, scipy_s = min(ours_times), min(scipy_times)
    same = bool(np.array_equal(canonical(ours), canonical(peer)))
    result = {"n": int(args.n), "ours_s": round(ours_s, 4), "scipy_s": round(scipy_s, 4), "ratio": round(ours_s / scipy_s, 4),
              "same_pairs": same, "n_pairs": int(len(ours)), "d_max_m": args.d_max, "repeats": args.repeats,
              "ours_median_s": round(statistics.median(ours_times), 4), "scipy_median_s": round(statistics.median(scipy_times), 4)}
    print(f"{'':8}{'time (s)':>10}\nours    {ours_s:10.3f}\nscipy   {scipy_s:10.3f}\n"
          f"ratio {result['ratio']:.3f} (target <= {RATIO_TARGET}), pairs {len(ours):,}, identical: {same}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
