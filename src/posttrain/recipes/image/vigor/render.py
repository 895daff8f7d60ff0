"""Procedural street views and satellite tiles of a synthetic scene (see city.py), as float arrays in [0, 1].

A street view (H x W x 3) looks along the street: sky above the horizon, the road as a trapezoid in the
middle, the left and right slots (each a third of the width) holding a building, a tree or nothing.
A satellite tile (H x W x 3) is the same scene from above, north-up along the street: the road a vertical
band, the left and right thirds holding a roof, a tree crown, or bare ground. Colours are drawn from fixed
palettes so that the change classifier can read materials from pixels, as a real model reads them.
"""

from __future__ import annotations

import colorsys

import numpy as np

ROOF = np.array([0.55, 0.55, 0.6])
TREE = np.array([0.15, 0.5, 0.2])
GROUND = np.array([0.75, 0.7, 0.5])
ASPHALT = np.array([0.22, 0.22, 0.25])
MATERIALS = {"roof": ROOF, "tree": TREE, "ground": GROUND, "asphalt": ASPHALT}
SLOT_COLUMNS = {"left": (0.0, 1 / 3), "right": (2 / 3, 1.0), "centre": (1 / 3, 2 / 3)}


def _facade(hue: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(hue, 0.45, 0.75))


def _columns(size: int, slot: str) -> slice:
    lo, hi = SLOT_COLUMNS[slot]
    return slice(int(round(lo * size)), int(round(hi * size)))


def street_view(scene: dict, size: int, rng: np.random.Generator) -> np.ndarray:
    img = np.empty((size, size, 3))
    horizon = size // 2
    rows = np.linspace(0, 1, horizon)[:, None, None]
    img[:horizon] = (1 - rows) * np.array([0.45, 0.65, 0.95]) + rows * np.array([0.8, 0.88, 0.97])  # sky
    img[horizon:] = GROUND * 0.9
    yy, xx = np.mgrid[horizon:size, 0:size]
    depth = (yy - horizon + 1) / (size - horizon)  # 0 at the horizon, 1 at the bottom row
    half = 0.5 * size * (0.08 + scene["road_width"] * depth)
    img[horizon:][np.abs(xx + 0.5 - size / 2) < half] = ASPHALT
    for side in ("left", "right"):
        cols = _columns(size, side)
        if scene[side] == "building":
            top = int(horizon * (1 - scene["height"] * 1.3))
            img[max(top, 1) : horizon + 2, cols] = _facade(scene["hue"])
            img[max(top, 1) + 2 : horizon : 3, cols][:, 1::3] = 0.3  # windows
        elif scene[side] == "tree":
            width = cols.stop - cols.start
            cy, cx, r = horizon - width // 3, (cols.start + cols.stop) / 2, width / 2.6
            gy, gx = np.mgrid[0:size, 0:size]
            img[(gy - cy) ** 2 + (gx + 0.5 - cx) ** 2 < r**2] = TREE
            img[cy : horizon + 2, int(cx) - 1 : int(cx) + 1] = [0.4, 0.25, 0.1]
    return np.clip(img + rng.normal(0, 0.02, img.shape), 0, 1)  # sensor noise differs between captures


def satellite_tile(scene: dict, size: int, rng: np.random.Generator) -> np.ndarray:
    img = np.tile(GROUND, (size, size, 1)).astype(np.float64)
    half = scene["road_width"] * size / 2.2
    xx = np.arange(size)[None, :] + 0.5
    img[np.broadcast_to(np.abs(xx - size / 2) < half, (size, size))] = ASPHALT
    for side in ("left", "right"):
        cols = _columns(size, side)
        rows = slice(size // 5, size - size // 5)
        if scene[side] == "building":
            img[rows, cols.start + 1 : cols.stop - 1] = ROOF
        elif scene[side] == "tree":
            gy, gx = np.mgrid[0:size, 0:size]
            cx, r = (cols.start + cols.stop) / 2, (cols.stop - cols.start) / 2.2
            img[(gy + 0.5 - size / 2) ** 2 + (gx + 0.5 - cx) ** 2 < r**2] = TREE
    return np.clip(img + rng.normal(0, 0.015, img.shape), 0, 1)


def degrade(img: np.ndarray, kind: str) -> np.ndarray:
    """The unusable captures: a night shot (dark) or heavy motion blur along the rows."""
    if kind == "night":
        return img * 0.12
    if kind == "blur":
        kernel = np.ones(9) / 9
        return np.apply_along_axis(lambda r: np.convolve(np.pad(r, 4, mode="edge"), kernel, mode="valid"), 1, img)
    return img


def slot_mask(size: int, region: str) -> np.ndarray:
    """[H, W] bool: the columns of `region` (left / right / centre), empty for `none`."""
    mask = np.zeros((size, size), bool)
    if region in SLOT_COLUMNS:
        mask[:, _columns(size, region)] = True
    return mask
