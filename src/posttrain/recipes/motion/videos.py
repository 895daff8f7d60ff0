"""MotionInsight's synthetic videos (specs §30): a few dozen frames of shapes moving under gravity, with annotated
object-consistency, motion-continuity and physical-plausibility scores and the failure causes injected into them.

A clean video: `objects` shapes (square, circle, triangle; distinct colours) fall under gravity `g`, bounce off the
floor (restitution 0.8) and the walls. A corrupted one carries one or two of the causes below, each on one object,
from an onset frame t0 (uniform over the middle half of the clip) with a magnitude m ~ U[0.5, 1]:

    teleport           the object jumps m * size / 2 pixels at t0, then moves on from there
    deformation        from t0 the object's size pulses by a factor 1 + 0.6 m sin(2 pi (t - t0) / 8)
    gravity_violation  from t0 the object accelerates upwards (gravity -m g), bouncing off the ceiling
    identity_swap      at t0 two objects exchange shape and colour (m = 1)
    frozen             from t0 the object stops in mid-air (no velocity, no gravity)

Annotated scores, on the 0-10 rating scale (rounded to tenths, so an exact prediction can be written), with
f = (T - t0) / T the share of the clip a lasting cause covers:

    consistency   = 1 - min(1, 0.8 m f [deformation] + 0.6 [identity_swap])
    continuity    = 1 - min(1, 0.7 m [teleport] + 0.8 f [frozen])
    plausibility  = 1 - min(1, 0.9 m f [gravity_violation] + 0.3 m [teleport] + 0.4 f [frozen])

`motion_representation` turns frames into the explicit motion representation the evaluator reads (dense optical
flow by OpenCV's Farneback method and object tracks from connected components); `rgb_representation` is the
plain frames, for the RGB-only evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
from scipy.optimize import linear_sum_assignment

from posttrain.recipes.motion.reward import CAUSES, DIMENSIONS  # the annotation's vocabulary (re-exported)

SHAPES = ("square", "circle", "triangle")
PALETTE = ((230, 60, 60), (60, 200, 80), (70, 110, 240), (240, 200, 40), (200, 70, 220), (40, 210, 220))
RESTITUTION = 0.8
TRACK_FEATURES = 9  # per tracked object and frame: cx, cy, area, r, g, b, dx, dy, missing


@dataclass(frozen=True)
class Video:
    frames: np.ndarray  # [T, S, S, 3] uint8
    scores: dict[str, float]  # DIMENSIONS -> annotated score in [0, 1] (tenths)
    causes: tuple[str, ...]  # injected failure causes, in CAUSES order


def _draw(frame: np.ndarray, shape: str, colour, x: float, y: float, size: float) -> None:
    cx, cy, r = int(round(x)), int(round(y)), max(1, int(round(size)))
    if shape == "circle":
        cv2.circle(frame, (cx, cy), r, colour, -1)
    elif shape == "square":
        cv2.rectangle(frame, (cx - r, cy - r), (cx + r, cy + r), colour, -1)
    else:
        cv2.fillPoly(frame, [np.array([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], np.int32)], colour)


def make_video(rng: np.random.Generator, cfg) -> Video:
    """One annotated clip: `cfg.frames` frames of `cfg.objects` shapes on a `cfg.size` square canvas."""
    T, S, n, g = cfg.frames, cfg.size, cfg.objects, cfg.gravity
    picks = rng.choice(len(PALETTE), n, replace=False)
    shapes = [SHAPES[i] for i in rng.integers(0, len(SHAPES), n)]
    colours = [PALETTE[i] for i in picks]
    size = rng.uniform(0.09, 0.14, n) * S
    pos = np.stack([rng.uniform(0.2, 0.8, n) * S, rng.uniform(0.15, 0.5, n) * S], 1)
    vel = np.stack([rng.uniform(-0.04, 0.04, n) * S, rng.uniform(-0.03, 0.01, n) * S], 1)
    n_causes = 0 if rng.random() < cfg.clean_fraction else int(rng.choice([1, 2], p=[0.7, 0.3]))
    allowed = [c for c in CAUSES if c != "identity_swap" or n >= 2]
    chosen = sorted(rng.choice(len(allowed), n_causes, replace=False).tolist())
    events = {allowed[i]: (int(rng.integers(T // 4, 3 * T // 4)), float(rng.uniform(0.5, 1.0)), int(rng.integers(0, n))) for i in chosen}
    frames = np.zeros((T, S, S, 3), np.uint8)
    for t in range(T):
        for cause, (t0, m, k) in events.items():
            if t == t0 and cause == "teleport":
                angle = rng.uniform(0, 2 * np.pi)
                pos[k] = np.clip(pos[k] + m * S / 2 * np.array([np.cos(angle), np.sin(angle)]), size[k], S - size[k])
            if t == t0 and cause == "identity_swap":
                other = (k + 1) % n
                shapes[k], shapes[other] = shapes[other], shapes[k]
                colours[k], colours[other] = colours[other], colours[k]
        drawn = size.copy()
        if "deformation" in events and t >= events["deformation"][0]:
            t0, m, k = events["deformation"]
            drawn[k] = size[k] * (1 + 0.6 * m * np.sin(2 * np.pi * (t - t0) / 8 + np.pi / 2))
        for k in range(n):
            _draw(frames[t], shapes[k], colours[k], pos[k, 0], pos[k, 1], drawn[k])
        for k in range(n):
            frozen = "frozen" in events and events["frozen"][2] == k and t >= events["frozen"][0]
            if frozen:
                vel[k] = 0.0
                continue
            antigravity = "gravity_violation" in events and events["gravity_violation"][2] == k and t >= events["gravity_violation"][0]
            vel[k, 1] += -events["gravity_violation"][1] * g if antigravity else g
            pos[k] += vel[k]
            for axis in (0, 1):
                low, high = size[k], S - 1 - size[k]
                if pos[k, axis] > high or pos[k, axis] < low:
                    pos[k, axis] = np.clip(pos[k, axis], low, high)
                    vel[k, axis] *= -(RESTITUTION if axis == 1 else 1.0)
    return Video(frames, annotate(events, T), tuple(c for c in CAUSES if c in events))


def annotate(events: dict[str, tuple[int, float, int]], frames: int) -> dict[str, float]:
    """The three scores of a clip whose causes are `events` {cause: (onset, magnitude, object)} (module docstring)."""
    def share(cause: str) -> float:
        return (frames - events[cause][0]) / frames if cause in events else 0.0

    def magnitude(cause: str) -> float:
        return events[cause][1] if cause in events else 0.0

    penalties = {
        "consistency": 0.8 * magnitude("deformation") * share("deformation") + 0.6 * ("identity_swap" in events),
        "continuity": 0.7 * magnitude("teleport") + 0.8 * share("frozen"),
        "plausibility": 0.9 * magnitude("gravity_violation") * share("gravity_violation") + 0.3 * magnitude("teleport") + 0.4 * share("frozen"),
    }
    return {d: round(1.0 - min(1.0, penalties[d]), 1) for d in DIMENSIONS}


def make_videos(cfg, n: int, seed) -> list[Video]:
    rng = np.random.default_rng(seed)
    return [make_video(rng, cfg) for _ in range(n)]


# -- representations ---------------------------------------------------------------------------------------------
def optical_flow(frames: np.ndarray) -> np.ndarray:
    """[T-1, S, S, 2] dense optical flow between consecutive frames (Farneback 2003, cv2.calcOpticalFlowFarneback)."""
    gray = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames]
    return np.stack([cv2.calcOpticalFlowFarneback(a, b, None, 0.5, 2, 5, 3, 5, 1.1, 0) for a, b in zip(gray[:-1], gray[1:])])


def blobs(frame: np.ndarray) -> list[np.ndarray]:
    """The blobs of one flat-shaded frame, each [cx, cy, area, r, g, b]: the connected components
    (cv2.connectedComponentsWithStats) of each foreground colour, so two touching objects stay two blobs."""
    found = []
    key = (frame[..., 0].astype(np.int32) << 16) | (frame[..., 1].astype(np.int32) << 8) | frame[..., 2]
    for value in np.unique(key[frame.max(-1) > 20]):
        colour = ((value >> 16) & 255, (value >> 8) & 255, value & 255)
        mask = (key == value).astype(np.uint8)
        count, _, stats, centroids = cv2.connectedComponentsWithStats(mask, connectivity=8)
        for label in range(1, count):
            if stats[label, cv2.CC_STAT_AREA] >= 2:
                found.append(np.array([*centroids[label], stats[label, cv2.CC_STAT_AREA], *colour], np.float64))
    return found


def object_tracks(frames: np.ndarray, slots: int) -> np.ndarray:
    """[T, slots, TRACK_FEATURES] tracks of up to `slots` objects: each frame's blobs are matched to the tracks by
    minimum total centroid distance (Hungarian assignment), a blob left over starts a track in a free slot; an
    unmatched track keeps its last state, flagged missing.
    Positions and displacements are in canvas units, area in canvas area, colour in [0, 1]."""
    T, S = frames.shape[0], frames.shape[1]
    tracks = np.zeros((T, slots, TRACK_FEATURES), np.float32)
    state: list[np.ndarray | None] = [None] * slots
    for t, frame in enumerate(frames):
        found = blobs(frame)
        previous = [s for s in state]
        live, used = [k for k in range(slots) if state[k] is not None], set()
        if found and live:
            cost = np.array([[np.hypot(*(state[k][:2] - b[:2])) for b in found] for k in live])
            for r, c in zip(*linear_sum_assignment(cost)):
                state[live[r]], used = found[c], used | {c}
        free = [k for k in range(slots) if state[k] is None]  # a new object (or one split from a merged blob) takes a free slot
        for k, b in zip(free, sorted((b for i, b in enumerate(found) if i not in used), key=lambda b: -b[2])):
            state[k] = b
        for k in range(slots):
            if state[k] is None:
                tracks[t, k, -1] = 1.0
                continue
            moved = state[k][:2] - previous[k][:2] if previous[k] is not None and t > 0 else np.zeros(2)
            matched = previous[k] is None or state[k] is not previous[k]
            tracks[t, k] = [state[k][0] / S, state[k][1] / S, state[k][2] / S**2, *(state[k][3:] / 255), moved[0] / S, moved[1] / S,
                            0.0 if matched else 1.0]
    return tracks


def motion_representation(frames: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(maps [T-1, 3, S, S]: flow x, flow y (pixels / 4) and the next frame's foreground mask; tracks [T-1, slots * 9]:
    the object tracks at frames 1..T-1)."""
    flow = optical_flow(frames) / 4.0
    mask = (frames[1:].max(-1) > 20).astype(np.float32)
    maps = np.concatenate([flow.transpose(0, 3, 1, 2), mask[:, None]], 1).astype(np.float32)
    tracks = object_tracks(frames, slots)[1:]
    return maps, tracks.reshape(len(tracks), -1)


def rgb_representation(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(maps [T, 3, S, S]: the frames in [0, 1]; tracks: none, [T, 0])."""
    return (frames.transpose(0, 3, 1, 2) / 255.0).astype(np.float32), np.zeros((len(frames), 0), np.float32)
