"""A family of grid mazes for offline goal-conditioned RL (DSP, specs §20): seeded layouts, reward-free trajectories
of a noisy exploration policy, held-out start/goal pairs, and renderings.

A layout is a `cells x cells` perfect maze (randomised depth-first carving, one seed per layout) on a
`(2 cells + 1)`-square grid, with a share `loops` of its remaining inner walls knocked down so that several routes
exist. The agent stands on a free square and moves up / down / left / right (a move into a wall leaves it in
place). States are the square's centre scaled to [-1, 1]^2 (`to_state`), the representation every model reads and
the flow model generates; `to_cell` rounds a generated state back to the nearest square.

The exploration policy is reward-free and knows no goal: it keeps its previous direction with probability
1 - `noise`, and draws another open one when it redraws or runs into a wall (a persistent random walk), the noisy-exploration data of D4RL / OGBench
style offline goal-conditioned benchmarks. Held-out start/goal pairs are drawn apart from the data (their own seed)
at a shortest-path distance of at least `min_distance` moves.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])  # up, down, left, right (row, column)


@dataclass(frozen=True)
class Maze:
    walls: np.ndarray  # [S, S] bool, True on a wall square

    @property
    def size(self) -> int:
        return self.walls.shape[0]

    def free_cells(self) -> np.ndarray:
        """[F, 2] (row, column) of every free square, in row-major order."""
        return np.argwhere(~self.walls)

    def step(self, cells: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """[N, 2] squares after one move each; a move into a wall (or off the grid) stays."""
        nxt = np.clip(cells + MOVES[actions], 0, self.size - 1)
        blocked = self.walls[nxt[:, 0], nxt[:, 1]]
        return np.where(blocked[:, None], cells, nxt)

    def to_state(self, cells: np.ndarray) -> np.ndarray:
        """Squares [..., 2] -> float32 states in [-1, 1]^2 (the square's centre)."""
        return (2.0 * (np.asarray(cells) + 0.5) / self.size - 1.0).astype(np.float32)

    def to_cell(self, states: np.ndarray) -> np.ndarray:
        """States [..., 2] -> the nearest square (clipped to the grid; it may be a wall)."""
        cells = np.floor((np.asarray(states) + 1.0) / 2.0 * self.size)
        return np.clip(cells, 0, self.size - 1).astype(np.int64)

    def distances_from(self, cell) -> np.ndarray:
        """[S, S] shortest-path moves from `cell` to every square (-1: unreachable or a wall), by BFS."""
        dist = np.full(self.walls.shape, -1, dtype=np.int64)
        dist[tuple(cell)] = 0
        queue = deque([tuple(cell)])
        while queue:
            r, c = queue.popleft()
            for dr, dc in MOVES:
                nr, nc = r + dr, c + dc
                if 0 <= nr < self.size and 0 <= nc < self.size and not self.walls[nr, nc] and dist[nr, nc] < 0:
                    dist[nr, nc] = dist[r, c] + 1
                    queue.append((nr, nc))
        return dist


def make_maze(cells: int, loops: float, seed: int) -> Maze:
    """The layout of seed `seed`: a depth-first-carved perfect maze plus a share `loops` of its inner walls removed."""
    rng = np.random.default_rng([seed, 20])
    size = 2 * cells + 1
    walls = np.ones((size, size), dtype=bool)
    seen = np.zeros((cells, cells), dtype=bool)
    stack = [(0, 0)]
    seen[0, 0] = True
    walls[1, 1] = False
    while stack:
        r, c = stack[-1]
        options = [(r + dr, c + dc) for dr, dc in MOVES if 0 <= r + dr < cells and 0 <= c + dc < cells and not seen[r + dr, c + dc]]
        if not options:
            stack.pop()
            continue
        nr, nc = options[rng.integers(len(options))]
        walls[2 * nr + 1, 2 * nc + 1] = False
        walls[r + nr + 1, c + nc + 1] = False  # the wall square between the two cells
        seen[nr, nc] = True
        stack.append((nr, nc))
    inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1) if walls[r, c] and (r % 2) != (c % 2)]
    for i in rng.permutation(len(inner))[: int(round(loops * len(inner)))]:
        walls[inner[i]] = False
    return Maze(walls)


def explore(maze: Maze, n_trajectories: int, length: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Reward-free data: (squares [N, length + 1, 2], actions [N, length]) of the persistent random walk from
    uniformly drawn free squares."""
    rng = np.random.default_rng([seed, 21])
    free = maze.free_cells()
    cells = free[rng.integers(len(free), size=n_trajectories)]
    action = rng.integers(4, size=n_trajectories)
    squares, actions = [cells], []
    for _ in range(length):
        open_moves = np.stack([~(maze.step(cells, np.full(n_trajectories, a)) == cells).all(1) for a in range(4)], axis=1)
        blocked = ~open_moves[np.arange(n_trajectories), action]
        redraw = (rng.random(n_trajectories) < noise) | blocked
        uniform_open = (rng.random((n_trajectories, 4)) + open_moves).argmax(1)  # open moves score in [1, 2): a uniform one wins
        action = np.where(redraw, uniform_open, action)
        cells = maze.step(cells, action)
        squares.append(cells)
        actions.append(action)
    return np.stack(squares, axis=1), np.stack(actions, axis=1)


def heldout_pairs(maze: Maze, n: int, min_distance: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts [n, 2], goals [n, 2], shortest-path distances [n]) of free-square pairs at least `min_distance` apart."""
    rng = np.random.default_rng([seed, 22])
    free = maze.free_cells()
    starts, goals, dists = [], [], []
    for _ in range(100 * n):
        if len(starts) == n:
            break
        s, g = free[rng.integers(len(free))], free[rng.integers(len(free))]
        d = maze.distances_from(s)[tuple(g)]
        if d >= min_distance:
            starts.append(s), goals.append(g), dists.append(d)
    if len(starts) < n:
        raise ValueError(f"a {maze.size} x {maze.size} maze has too few free squares {min_distance} moves apart for {n} pairs")
    return np.array(starts), np.array(goals), np.array(dists)


def render(maze: Maze, path: np.ndarray | None = None, subgoals: np.ndarray | None = None, goal=None, scale: int = 12) -> np.ndarray:
    """An RGB uint8 image [S * scale, S * scale, 3]: walls dark, the path's squares blue, generated subgoals (states)
    orange dots, the goal green, the path's last square red."""
    img = np.where(maze.walls[..., None], np.array([40, 40, 40]), np.array([235, 235, 235])).astype(np.uint8)
    if path is not None:
        for r, c in path:
            img[r, c] = [120, 160, 230]
        img[tuple(path[-1])] = [220, 50, 50]
    if goal is not None:
        img[tuple(goal)] = [40, 170, 70]
    img = np.kron(img, np.ones((scale, scale, 1), dtype=np.uint8))
    if subgoals is not None:
        for x in np.asarray(subgoals, dtype=np.float64):
            r, c = np.clip(((x + 1.0) / 2.0 * maze.size * scale).astype(int), 2, maze.size * scale - 3)
            img[r - 2: r + 3, c - 2: c + 3] = [245, 150, 30]
    return img
