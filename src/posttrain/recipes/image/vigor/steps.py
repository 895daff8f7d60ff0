"""The VIGOR-his curation steps after pairing (screening, change labels, instructions), each a pluggable part behind a registry.

- `embedders`: image -> feature vector for the consistency screen (default `thumbnail`, no download; a
  DINO/CLIP embedder registers the same way).
- `geometric_checks`: (old view, new view) -> geometric agreement in [0, 1], the screen's second test
  (default `orb_ransac`: ORB keypoints, cross-checked descriptor matches, RANSAC inlier ratio; `none` skips it;
  a LoFTR/SuperGlue matcher registers the same way).
- `change_classifiers`: (satellite old, satellite new) -> (class, region, direction) (default
  `satellite_diff`: per-pixel material labels of the two epochs; a VLM classifier registers the same way).
- `instruction_writers`: (class, region, direction, years) -> (description, instruction) (default
  `template`; a vision-language model hook registers the same way).
Then `validate_instruction` checks every instruction against the two street views, independently of how
it was written.
"""

from __future__ import annotations

import numpy as np

from posttrain.recipes.image.vigor.render import MATERIALS, SLOT_COLUMNS, slot_mask
from posttrain.registry import Registry

embedders: Registry = Registry("image embedder")
geometric_checks: Registry = Registry("geometric check")
change_classifiers: Registry = Registry("change classifier")
instruction_writers: Registry = Registry("instruction writer")


@embedders.register("thumbnail")
def thumbnail_embedding(image: np.ndarray) -> np.ndarray:
    """An 8x8 colour thumbnail, mean-centred and unit-normalised: layout and colour, robust to sensor noise."""
    small = _resize(image, 8).ravel()
    centred = small - small.mean()
    return centred / (np.linalg.norm(centred) + 1e-8)


def _resize(image: np.ndarray, size: int) -> np.ndarray:
    """Area-average to size x size (any input size): the mean over each cell of a size x size grid."""
    h, w, _ = image.shape
    rows = np.minimum((np.arange(h) * size) // h, size - 1)
    cols = np.minimum((np.arange(w) * size) // w, size - 1)
    total = np.zeros((size, size, image.shape[2]))
    np.add.at(total, (rows[:, None], cols[None, :]), image)
    count = np.zeros((size, size))
    np.add.at(count, (rows[:, None], cols[None, :]), 1.0)
    return total / count[..., None]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-8))


def persistent_similarity(embed, old: np.ndarray, new: np.ndarray) -> float:
    """Similarity of the content that persists: the views are cut into left, centre and right thirds and
    compared third by third; a real change touches one third, so the median of the three similarities
    ignores it, while a different place or viewpoint differs in at least two."""
    w = old.shape[1]
    cuts = [slice(0, w // 3), slice(w // 3, w - w // 3), slice(w - w // 3, w)]
    return float(np.median([cosine(embed(old[:, c]), embed(new[:, c])) for c in cuts]))


@geometric_checks.register("none")
def no_geometric_check(old: np.ndarray, new: np.ndarray) -> float:
    """Skip the geometric test (agreement 1 for every pair)."""
    return 1.0


ORB_UPSCALE = 4  # ORB needs patches of ~15 px; street views may be a few dozen pixels wide
RANSAC_PX = 1.5  # reprojection tolerance in pixels of the original view


def _gray(image: np.ndarray):
    import cv2

    gray = cv2.cvtColor((np.clip(image, 0, 1) * 255).round().astype(np.uint8), cv2.COLOR_RGB2GRAY)
    return cv2.resize(gray, None, fx=ORB_UPSCALE, fy=ORB_UPSCALE, interpolation=cv2.INTER_LINEAR)


@geometric_checks.register("orb_ransac")
def orb_ransac_agreement(old: np.ndarray, new: np.ndarray) -> float:
    """Geometric agreement of the persistent content (VIGOR-his consistency screening: feature-match inliers + RANSAC):
    ORB keypoints and binary descriptors (Rublee et al. 2011) on both views, mutual nearest-neighbour
    matches under the Hamming distance, a RANSAC-fitted similarity transform (OpenCV
    `estimateAffinePartial2D`, Fischler & Bolles 1981), and the share of keypoints that are RANSAC inliers:
    inliers / min(#keypoints old, #keypoints new). The same place seen from the same viewpoint keeps most
    of its structure in place (a real change removes one part of it); another place that merely looks alike
    at thumbnail scale has edges and corners elsewhere. OpenCV's RNG is seeded so the answer is repeatable."""
    import cv2

    cv2.setRNGSeed(0)
    orb = cv2.ORB_create(nfeatures=300, edgeThreshold=15, patchSize=15, fastThreshold=10)
    keys_old, desc_old = orb.detectAndCompute(_gray(old), None)
    keys_new, desc_new = orb.detectAndCompute(_gray(new), None)
    if desc_old is None or desc_new is None or min(len(keys_old), len(keys_new)) < 3:
        return 0.0
    matches = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True).match(desc_old, desc_new)
    if len(matches) < 3:
        return 0.0
    src = np.float32([keys_old[m.queryIdx].pt for m in matches])
    dst = np.float32([keys_new[m.trainIdx].pt for m in matches])
    transform, inliers = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC, ransacReprojThreshold=RANSAC_PX * ORB_UPSCALE)
    if transform is None:
        return 0.0
    return float(inliers.sum()) / min(len(keys_old), len(keys_new))


def quality(image: np.ndarray) -> tuple[float, float]:
    """(brightness, sharpness): mean intensity, and mean absolute horizontal gradient (blur flattens it)."""
    return float(image.mean()), float(np.abs(np.diff(image, axis=1)).mean())


def material_map(tile: np.ndarray) -> np.ndarray:
    """[H, W] index of the nearest palette material (render.MATERIALS order) for every pixel."""
    palette = np.stack(list(MATERIALS.values()))
    return np.argmin(((tile[:, :, None, :] - palette) ** 2).sum(-1), axis=-1)


@change_classifiers.register("satellite_diff")
def satellite_diff(old: np.ndarray, new: np.ndarray, min_changed: float) -> tuple[str, str, str]:
    """Classify the change between two satellite tiles from their material maps.

    The region with the most pixels whose material changed decides where; the materials gained and lost
    there decide what: asphalt gained in the middle -> road; roof gained -> construction, lost ->
    demolition; tree gained or lost -> vegetation. Fewer than `min_changed` changed pixels -> no_change.
    direction says what the past had: 'added' (the old tile has it, the edit must add it back) or 'removed'."""
    names = list(MATERIALS)
    m_old, m_new = material_map(old), material_map(new)
    changed = m_old != m_new
    if changed.mean() < min_changed:
        return "no_change", "none", "none"
    size = old.shape[1]
    region = max(SLOT_COLUMNS, key=lambda r: (changed & slot_mask(size, r)).sum())
    inside = changed & slot_mask(size, region)

    def share(m: np.ndarray, name: str) -> float:
        return float((m[inside] == names.index(name)).mean())

    gained = {n: share(m_new, n) - share(m_old, n) for n in names}
    if region == "centre" or max(gained, key=lambda n: abs(gained[n])) == "asphalt":
        return "road", "centre", "removed" if gained["asphalt"] > 0 else "added"
    if abs(gained["roof"]) >= abs(gained["tree"]):
        return ("construction", region, "removed") if gained["roof"] > 0 else ("demolition", region, "added")
    return "vegetation", region, "removed" if gained["tree"] > 0 else "added"


_TEMPLATES = {
    ("no_change", "none"): ("no visible change between {old} and {new}", "keep the scene exactly as it is"),
    ("construction", "removed"): ("a building was constructed on the {region} side between {old} and {new}",
                                  "remove the building on the {region} side and restore the empty lot"),
    ("demolition", "added"): ("the building on the {region} side was demolished between {old} and {new}",
                              "add back the building on the {region} side where the lot is empty now"),
    ("vegetation", "removed"): ("a tree appeared on the {region} side between {old} and {new}", "remove the tree on the {region} side"),
    ("vegetation", "added"): ("the tree on the {region} side was removed between {old} and {new}", "add a tree on the {region} side"),
    ("road", "removed"): ("the road was widened between {old} and {new}", "narrow the road in the centre to its former width"),
    ("road", "added"): ("the road was narrowed between {old} and {new}", "widen the road in the centre to its former width"),
}
REGION_WORDS = {"left": "left", "right": "right", "centre": "centre", "none": ""}


@instruction_writers.register("template")
def template_writer(change: str, region: str, direction: str, year_old: int, year_new: int) -> tuple[str, str]:
    """(satellite-grounded description, local editing instruction turning the recent view into the past one)."""
    template = _TEMPLATES.get((change, direction))
    if template is None:
        return "", ""
    description, instruction = template
    return (description.format(region=region, old=year_old, new=year_new), instruction.format(region=region))


def validate_instruction(instruction: str, change: str, region: str, street_old: np.ndarray, street_new: np.ndarray,
                         min_region_share: float) -> bool:
    """Does the instruction fit its class and the two street views? It must be non-empty, name the region it
    edits (no_change names none), and that region must hold at least `min_region_share` of the street-level
    difference between the views (no_change: the views must differ by less than the sensor noise)."""
    if not instruction.strip():
        return False
    words = set(instruction.replace(",", " ").split())
    named = [r for r in ("left", "right", "centre") if r in words]
    if change == "no_change":
        return not named and float(np.abs(street_old - street_new).mean()) < 0.03
    if named != [region]:
        return False
    diff = np.abs(street_old - street_new).mean(axis=-1)
    diff = np.where(diff > 0.1, diff, 0.0)  # ignore sensor noise
    total = diff.sum()
    return bool(total > 0 and diff[slot_mask(diff.shape[1], region)].sum() / total >= min_region_share)
