"""A small driving environment with camera frames, for VLM-Safe-RL (specs §16; a stand-in for MetaDrive).

A straight road of `lanes` lanes (each 1 wide, the road spans x in [0, lanes]) with `cars` other cars driving
ahead of and behind the ego car, seen by a camera above the ego car looking forward: each step renders an
`image_size` x `image_size` RGB frame (grass, road, lane marks, the ego car in red, the others in blue) with the
whole road width across and `VIEW_BEHIND` .. `VIEW_AHEAD` road units along. N episodes run side by side (arrays
[N], one seeded numpy generator), all `horizon` steps long unless they leave the road.

Actions (discrete): 0 keep, 1 steer left, 2 steer right, 3 speed up, 4 slow down. Per step:

    reward    r_t = v_t / speed_max                  (progress: the episode's share of the best distance is
    progress  = sum_t v_t / (speed_max * horizon)     `progress`, in [0, 1])
    cost      c_t = 1[collision] + 1[road exit]       a collision removes the car hit (it is respawned ahead) and
                                                      the episode goes on; leaving the road ends it

The reward knows nothing of the costs (a safe-RL benchmark's split: Safety-Gym, MetaDrive's safe setting). The
state features beside the frame are the ego car's own (lateral position, speed, time left): other cars are seen
in the frame only. `captions()` describes each state in words (danger, the ego lane, the lanes beside, speed):
the text side of the contrastive encoder (recipes/safe_rl/trainer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ACTIONS = ("keep", "left", "right", "faster", "slower")
VIEW_BEHIND, VIEW_AHEAD, MARGIN = 3.0, 13.0, 0.5  # road units seen behind / ahead; grass beside the road
CAR_WIDTH, CAR_LENGTH = 0.6, 1.6
SPAWN_AHEAD = 10.0  # a car left behind (or gone far ahead) is respawned VIEW_AHEAD .. VIEW_AHEAD + SPAWN_AHEAD ahead
GRASS, ROAD, MARK, EGO, OTHER = (40, 110, 40), (90, 90, 90), (235, 235, 235), (220, 40, 40), (50, 90, 230)
SAFE, CRASH, EXIT = "a car driving safely on a clear road", "a car about to crash into another vehicle", "a car about to leave the road"
N_FEATURES = 3


@dataclass(frozen=True)
class StepResult:
    reward: np.ndarray  # [N] 0 for an episode already over
    cost: np.ndarray  # [N] collisions + road exits of this step
    collision: np.ndarray  # [N] cars hit this step
    road_exit: np.ndarray  # [N] bool
    done: np.ndarray  # [N] the episode is over after this step
    alive: np.ndarray  # [N] the episode was running at this step (the step counts)


class DrivingEnv:
    """N episodes of the driving task (settings: safe_rl.env), seeded by `seed`."""

    def __init__(self, cfg, n: int, seed: int):
        self.cfg, self.n = cfg, n
        self.rng = np.random.default_rng(seed)
        self.lane_centres = np.arange(cfg.lanes) + 0.5
        self.reset()

    # -- dynamics -----------------------------------------------------------------------------------------------
    def reset(self) -> None:
        c, n = self.cfg, self.n
        self.t = 0
        self.x = self.lane_centres[self.rng.integers(c.lanes, size=n)].astype(np.float64)
        self.v = np.full(n, (c.speed_min + c.speed_max) / 2)
        self.travelled = np.zeros(n)
        self.done = np.zeros(n, dtype=bool)
        self.car_x = self.lane_centres[self.rng.integers(c.lanes, size=(n, c.cars))]
        self.car_y = self.rng.uniform(CAR_LENGTH * 2, VIEW_AHEAD + SPAWN_AHEAD, size=(n, c.cars))  # none on the ego car
        self.car_v = self.rng.uniform(*c.traffic_speed, size=(n, c.cars))

    def step(self, actions: np.ndarray) -> StepResult:
        c = self.cfg
        alive = ~self.done
        a = np.where(alive, actions, 0)
        self.x = self.x + np.where(a == 1, -c.steer_step, 0.0) + np.where(a == 2, c.steer_step, 0.0)
        self.v = np.clip(self.v + np.where(a == 3, c.speed_step, 0.0) - np.where(a == 4, c.speed_step, 0.0), c.speed_min, c.speed_max)
        self.car_y = self.car_y + np.where(alive[:, None], self.car_v - self.v[:, None], 0.0)
        hit = self.overlapping() & alive[:, None]
        road_exit = alive & ((self.x < CAR_WIDTH / 2) | (self.x > c.lanes - CAR_WIDTH / 2))
        self._respawn(hit | (self.car_y < -VIEW_BEHIND - CAR_LENGTH) | (self.car_y > VIEW_AHEAD + SPAWN_AHEAD))
        reward = np.where(alive, self.v / c.speed_max, 0.0)
        self.travelled += np.where(alive, self.v, 0.0)
        collision = hit.sum(axis=1)
        self.t += 1
        self.done = self.done | road_exit | (self.t >= c.horizon)
        return StepResult(reward, (collision + road_exit).astype(np.float64), collision, road_exit, self.done.copy(), alive)

    def overlapping(self) -> np.ndarray:
        """[N, cars] the other car overlaps the ego car."""
        return (np.abs(self.car_x - self.x[:, None]) < CAR_WIDTH) & (np.abs(self.car_y) < CAR_LENGTH)

    def _respawn(self, which: np.ndarray) -> None:
        k = int(which.sum())
        if not k:
            return
        c = self.cfg
        self.car_x[which] = self.lane_centres[self.rng.integers(c.lanes, size=k)]
        self.car_y[which] = self.rng.uniform(VIEW_AHEAD, VIEW_AHEAD + SPAWN_AHEAD, size=k)
        self.car_v[which] = self.rng.uniform(*c.traffic_speed, size=k)

    def progress(self) -> np.ndarray:
        """[N] distance travelled / the most a `horizon`-step episode can travel, in [0, 1]."""
        return self.travelled / (self.cfg.speed_max * self.cfg.horizon)

    def features(self) -> np.ndarray:
        """[N, 3] the ego car's own state: lateral position / road width, speed / speed_max, time left / horizon."""
        c = self.cfg
        return np.stack([self.x / c.lanes, self.v / c.speed_max, np.full(self.n, 1 - self.t / c.horizon)], axis=1).astype(np.float32)

    # -- the camera ---------------------------------------------------------------------------------------------
    def render(self) -> np.ndarray:
        """[N, S, S, 3] uint8 camera frames of the current state (S = image_size)."""
        c, s = self.cfg, self.cfg.image_size
        px_x, px_y = s / (c.lanes + 2 * MARGIN), s / (VIEW_AHEAD + VIEW_BEHIND)  # pixels per road unit across / along
        x = (np.arange(s) + 0.5) / px_x - MARGIN  # road coordinates of the pixel centres: across (columns)
        y = VIEW_AHEAD - (np.arange(s) + 0.5) / px_y  # and along (rows; ahead is up)
        frames = np.empty((self.n, s, s, 3), dtype=np.uint8)
        frames[:] = GRASS
        on_road = (x > 0) & (x < c.lanes)
        frames[:, :, on_road] = ROAD
        half = 0.5 / px_x  # a mark is one pixel wide
        edges = (np.abs(x) < half) | (np.abs(x - c.lanes) < half)
        frames[:, :, edges] = MARK
        marks = np.zeros(s, dtype=bool)
        for lane in range(1, c.lanes):
            marks |= np.abs(x - lane) < half
        dashed = ((y[None, :] + self.travelled[:, None]) % 2.0) < 1.0  # [N, rows]: 1-unit dashes that move as the car drives
        frames[dashed[:, :, None] & marks[None, None, :]] = MARK
        for cx, cy, colour in ((self.car_x, self.car_y, OTHER), (self.x[:, None], np.zeros((self.n, 1)), EGO)):
            inside_x = np.abs(x[None, None, :] - cx[:, :, None]) < CAR_WIDTH / 2  # [N, cars, cols]
            inside_y = np.abs(y[None, None, :] - cy[:, :, None]) < CAR_LENGTH / 2  # [N, cars, rows]
            frames[(inside_y[:, :, :, None] & inside_x[:, :, None, :]).any(axis=1)] = colour
        return frames

    # -- words ---------------------------------------------------------------------------------------------------
    def captions(self) -> list[list[str]]:
        """Per episode, the phrases that describe its state: [danger or safety, the ego lane, left, right, speed].
        "About to crash": a car in the ego car's lane reached within `danger_ttc` steps at the current closing
        speed (or already overlapping); "about to leave the road": within `edge_margin` of the road's edge."""
        c = self.cfg
        lateral = np.abs(self.car_x - self.x[:, None])
        lane = np.floor(self.x).clip(0, c.lanes - 1)
        car_lane = np.floor(self.car_x)
        out = []
        for i in range(self.n):
            ahead = (lateral[i] < CAR_WIDTH) & (self.car_y[i] > -CAR_LENGTH) & (self.car_y[i] < VIEW_AHEAD)
            gap = (self.car_y[i] - CAR_LENGTH).clip(min=0.0)
            closing = np.maximum(self.v[i] - self.car_v[i], 1e-6)
            crash = bool((ahead & (gap / closing < c.danger_ttc)).any())
            edge = min(self.x[i] - CAR_WIDTH / 2, c.lanes - CAR_WIDTH / 2 - self.x[i]) < c.edge_margin
            danger = CRASH if crash else EXIT if edge else SAFE
            near = ahead & (gap < VIEW_AHEAD / 2)
            mine = "car ahead in my lane close" if near.any() else "car ahead in my lane far" if ahead.any() else "my lane is clear"
            seen = (self.car_y[i] > -VIEW_BEHIND) & (self.car_y[i] < VIEW_AHEAD)
            sides = []
            for name, other in (("left", lane[i] - 1), ("right", lane[i] + 1)):
                if other < 0 or other >= c.lanes:
                    sides.append(f"no lane on my {name}")
                else:
                    sides.append(f"car in the {name} lane" if (seen & (car_lane[i] == other)).any() else f"{name} lane is clear")
            speed = "driving fast" if self.v[i] > (c.speed_min + c.speed_max) / 2 else "driving slowly"
            out.append([danger, mine, *sides, speed])
        return out


def vocabulary() -> list[str]:
    """Every word `captions` can use (the in-repo encoder's closed vocabulary)."""
    phrases = [SAFE, CRASH, EXIT, "car ahead in my lane close", "car ahead in my lane far", "my lane is clear", "driving fast", "driving slowly"]
    phrases += [f"{p} {side}" for side in ("left", "right") for p in ("no lane on my", "car in the", "lane is clear")]
    return list(dict.fromkeys(w for p in phrases for w in p.split()))
