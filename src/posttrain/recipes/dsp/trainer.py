"""DSP's offline loop and its hierarchical execution (specs §20; the formulas: recipes/dsp/objective.py; the maze family:
recipes/dsp/maze.py; the networks: recipes/dsp/networks.py).

Training (`train_dsp`), one minibatch of dataset steps (trajectory i, time t) per update, all networks together:

- subgoal flow: w = s_{min(t+k, T)}, goal g by hindsight relabelling (s_t itself with p_current, a uniform future
  state of the same trajectory with p_trajectory, else a random dataset state), dropped to the null goal with
  probability p_uncond; rectified-flow loss.
- low-level policy pi_lo(a_t | s_t, s_{t+j}), j uniform in 1..k: behaviour cloning towards states up to k ahead.
- flat goal-conditioned BC pi_flat(a_t | s_t, s_{t'}), t' uniform in t+1..T (the baseline without a high level).
- HIQL-style value V(s, g), same relabelling as the flow: r = 0 at the goal else -1, expectile TD towards a
  Polyak-averaged target network.

Execution (`evaluate_arm`) on held-out start/goal pairs, every episode for at most `max_steps` moves:

- `flat_bc`: the flat policy towards the goal.
- `dsp@omega`: a subgoal from the flow with guidance weight omega (Euler, `sampling_steps`), reached by pi_lo;
  a new subgoal every k moves or as soon as the agent stands on the subgoal's square.
- `value_guided` (HIQL-style): `candidates` subgoals from the unconditional flow (states k ahead of s, no goal),
  the one with the highest V(w, g) kept, reached by pi_lo with the same replanning.

Everything random is drawn from generators seeded by (seed, purpose); the batch draw and the noise generator are
checkpoint parts, so a resumed run draws the same batches and ends with the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from posttrain.recipes.dsp.maze import Maze, heldout_pairs, make_maze
from posttrain.errors import UserError
from posttrain.recipes.dsp.networks import GoalPolicy, GoalValue, SubgoalFlow
from posttrain.recipes.dsp.objective import (expectile_loss, flow_matching_loss, goal_dropout, guided_sampler, interpolate)
from posttrain.trainers.loop import NumpyDraws, TrainLoop

EVAL_SEED = 10**6  # held-out pairs and execution noise are drawn apart from training's


@dataclass(frozen=True)
class MazeData:
    maze: Maze
    cells: np.ndarray  # [N, T + 1, 2] squares
    actions: np.ndarray  # [N, T]

    @property
    def states(self) -> np.ndarray:
        return self.maze.to_state(self.cells)


class DSPNetworks(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, n, b = cfg.hidden_size, cfg.layers, cfg.fourier_bands
        self.flow = SubgoalFlow(2, h, n, b)
        self.low = GoalPolicy(2, 4, h, n, b)
        self.flat = GoalPolicy(2, 4, h, n, b)
        self.value = GoalValue(2, h, n, b)
        self.value_target = GoalValue(2, h, n, b)
        self.value_target.load_state_dict(self.value.state_dict())
        self.value_target.requires_grad_(False)

    def trained_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("value_target.")]


def relabel_goals(rng: np.random.Generator, t: np.ndarray, rows: np.ndarray, length: int, n_total: int, p_current: float,
                  p_trajectory: float) -> tuple[np.ndarray, np.ndarray]:
    """(trajectory, time) of each step's goal: itself, a uniform future state of its trajectory, or a random one."""
    u = rng.random(len(t))
    future = t + (rng.random(len(t)) * (length - t + 1)).astype(np.int64)  # uniform in t..T
    g_rows = np.where(u < p_current + p_trajectory, rows, rng.integers(n_total, size=len(t)))
    g_t = np.where(u < p_current, t, np.where(u < p_current + p_trajectory, np.minimum(future, length), rng.integers(length + 1, size=len(t))))
    return g_rows, g_t


class DSPTrainer:
    def __init__(self, cfg, data: MazeData, seed: int):
        self.cfg, self.data, self.seed = cfg, data, seed
        torch.manual_seed(seed)
        self.nets = DSPNetworks(cfg)
        self.optimizer = torch.optim.Adam(self.nets.trained_parameters(), lr=cfg.lr)
        self.rng = NumpyDraws(np.random.default_rng([seed, 23]))
        self.noise = torch.Generator().manual_seed(seed * 1000 + 24)
        self.states = torch.from_numpy(data.states)
        self.actions = torch.from_numpy(data.actions)

    def parts(self) -> dict:
        return {"optimizer": self.optimizer, "draw": self.rng, "noise": self.noise}

    def losses(self) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, rng, S = self.cfg, self.rng.rng, self.states
        n, length = self.actions.shape
        rows = rng.integers(n, size=cfg.batch_size)
        t = rng.integers(length, size=cfg.batch_size)
        s = S[rows, t]
        # subgoal flow, trained with goal dropout
        g_rows, g_t = relabel_goals(rng, t, rows, length, n, cfg.goal_p_current, cfg.goal_p_trajectory)
        goal = S[g_rows, g_t]
        w = S[rows, np.minimum(t + cfg.subgoal_horizon, length)]
        null = goal_dropout(cfg.batch_size, cfg.p_uncond, self.noise)
        z0 = torch.randn(w.shape, generator=self.noise)
        tau = torch.rand(cfg.batch_size, generator=self.noise)
        flow = flow_matching_loss(self.nets.flow(interpolate(z0, w, tau), tau, s, goal, null), z0, w)
        # low level: BC towards the state j <= k moves ahead
        j = rng.integers(1, cfg.subgoal_horizon + 1, size=cfg.batch_size)
        a = self.actions[rows, t]
        low = F.cross_entropy(self.nets.low(s, S[rows, np.minimum(t + j, length)]), a)
        # flat BC towards a future state of the same trajectory
        fut = t + 1 + (rng.random(cfg.batch_size) * (length - t)).astype(np.int64)
        flat = F.cross_entropy(self.nets.flat(s, S[rows, np.minimum(fut, length)]), a)
        # HIQL-style value: expectile TD, reward -1 until the goal square
        at_goal = (self.data.cells[rows, t] == self.data.cells[g_rows, g_t]).all(1)
        done = torch.from_numpy(at_goal.astype(np.float32))
        with torch.no_grad():
            target = -(1.0 - done) + cfg.gamma * (1.0 - done) * self.nets.value_target(S[rows, t + 1], goal)
        value = expectile_loss(self.nets.value(s, goal), target, cfg.expectile)
        loss = flow + low + flat + value
        return loss, {"loss": float(loss.detach()), "flow_loss": float(flow.detach()), "low_loss": float(low.detach()),
                      "flat_loss": float(flat.detach()), "value_loss": float(value.detach()), "uncond_fraction": float(null.float().mean())}

    def update(self, step: int, loop: TrainLoop) -> dict[str, float]:
        loss, metrics = self.losses()
        loss.backward()
        metrics["grad_norm"] = loop.optimizer_step(step, loss, self.nets.trained_parameters(), self.optimizer, self.cfg.max_grad_norm)
        with torch.no_grad():
            for p, q in zip(self.nets.value_target.parameters(), self.nets.value.parameters()):
                p.lerp_(q, self.cfg.target_update)
        return metrics


# -- execution ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def propose_subgoals(nets: DSPNetworks, state: torch.Tensor, goal: torch.Tensor, omega: float, steps: int, generator: torch.Generator) -> torch.Tensor:
    """[N, 2] guided subgoals for states [N, 2] and goals [N, 2]."""
    z0 = torch.randn(state.shape, generator=generator)
    return guided_sampler(lambda z, tau, null: nets.flow(z, tau, state, goal, null), z0, steps, omega)


@torch.no_grad()
def value_guided_subgoals(nets: DSPNetworks, state: torch.Tensor, goal: torch.Tensor, candidates: int, steps: int,
                          generator: torch.Generator) -> torch.Tensor:
    """HIQL-style: of `candidates` unconditional proposals per state, the one with the highest V(w, g)."""
    n = state.shape[0]
    rep = lambda x: x.repeat_interleave(candidates, dim=0)  # noqa: E731
    w = propose_subgoals(nets, rep(state), rep(goal), 0.0, steps, generator).reshape(n, candidates, -1)
    best = nets.value(w.flatten(0, 1), rep(goal)).reshape(n, candidates).argmax(1)
    return w[torch.arange(n), best]


@dataclass
class Episodes:
    success: np.ndarray  # [E] bool
    steps: np.ndarray  # [E] moves taken (max_steps when the goal was not reached)
    paths: list[np.ndarray]  # per episode, the squares visited
    subgoals: list[list[np.ndarray]]  # per episode, the subgoal states proposed
    subgoal_progress: float  # mean (distance to goal from s) - (distance from the subgoal's square); nan for flat
    subgoal_free: float  # share of proposed subgoals whose square is free


@torch.no_grad()
def evaluate_arm(nets: DSPNetworks, cfg, maze: Maze, starts: np.ndarray, goals: np.ndarray, arm: str, omega: float, seed: int) -> Episodes:
    """Run every held-out pair with the arm (`flat_bc`, `dsp`, `value_guided`); greedy low-level actions."""
    gen = torch.Generator().manual_seed(seed * 1000 + 25)
    n, k, ev = len(starts), cfg.subgoal_horizon, cfg.eval
    goal_dist = {tuple(g): maze.distances_from(g) for g in {tuple(g) for g in goals}}
    cells, goal_states = starts.copy(), torch.from_numpy(maze.to_state(goals))
    done, steps = np.zeros(n, dtype=bool), np.full(n, ev.max_steps)
    paths, proposals = [[c.copy()] for c in cells], [[] for _ in range(n)]
    subgoal = torch.zeros(n, 2)
    since = np.full(n, k)  # moves since the last plan: plan at the first step
    progress, free = [], []
    for move in range(ev.max_steps):
        active = ~done
        state = torch.from_numpy(maze.to_state(cells))
        if arm == "flat_bc":
            target = goal_states
        else:
            sub_cells = maze.to_cell(subgoal.numpy())
            replan = active & ((since >= k) | (sub_cells == cells).all(1))
            if replan.any():
                idx = np.flatnonzero(replan)
                if arm == "dsp":
                    new = propose_subgoals(nets, state[idx], goal_states[idx], omega, cfg.sampling_steps, gen)
                else:
                    new = value_guided_subgoals(nets, state[idx], goal_states[idx], cfg.candidates, cfg.sampling_steps, gen)
                subgoal[idx] = new
                since[idx] = 0
                for i, w in zip(idx, maze.to_cell(new.numpy())):
                    d = goal_dist[tuple(goals[i])]
                    free.append(not maze.walls[tuple(w)])
                    progress.append(float(d[tuple(cells[i])] - (d[tuple(w)] if d[tuple(w)] >= 0 else d[tuple(cells[i])])))
                    proposals[i].append(subgoal[i].numpy().copy())
            target = subgoal
        actions = nets.low(state, target).argmax(1).numpy() if arm != "flat_bc" else nets.flat(state, target).argmax(1).numpy()
        cells = np.where(active[:, None], maze.step(cells, actions), cells)
        since += 1
        for i in np.flatnonzero(active):
            paths[i].append(cells[i].copy())
        reached = active & (cells == goals).all(1)
        steps[reached] = move + 1
        done |= reached
        if done.all():
            break
    return Episodes(done, steps, [np.array(p) for p in paths], proposals,
                    float(np.mean(progress)) if progress else float("nan"), float(np.mean(free)) if free else float("nan"))


def arms(cfg) -> list[tuple[str, str, float]]:
    """(label, arm, omega) of every evaluated arm: flat BC, value-guided, and DSP at each guidance weight."""
    return [("flat_bc", "flat_bc", 0.0), ("value_guided", "value_guided", 0.0)] + [(f"dsp_w{w:g}", "dsp", w) for w in cfg.guidance_weights]


def load_data(cfg, seed: int, cells: np.ndarray | None = None, actions: np.ndarray | None = None) -> MazeData:
    """The maze of (layout, seed) and its dataset (the maze_data stage's arrays, or explored here)."""
    from posttrain.recipes.dsp.maze import explore

    maze = make_maze(cfg.maze.cells, cfg.maze.loops, cfg.maze.layout + seed)
    if cells is None:
        cells, actions = explore(maze, cfg.data.trajectories, cfg.data.length, cfg.data.noise, seed)
    return MazeData(maze, cells, actions)


def train_dsp(cfg, data: MazeData, seed: int, loop: TrainLoop | None = None, on_log: Callable[[int, dict], None] | None = None):
    """(the trained networks, history, figures per arm `<label>_success` ..., the first pair's episode per arm)."""
    loop = loop or TrainLoop()
    pairs = heldout(cfg, data.maze, seed)  # before any training: a maze too small for the pairs is a settings error
    trainer = DSPTrainer(cfg, data, seed)
    start, saved = loop.restore(trainer.nets, trainer.parts())
    history: list[dict] = saved.get("history", [])
    for step in range(start + 1, cfg.steps + 1):
        metrics = trainer.update(step, loop)
        if step % cfg.log_every == 0 or step == cfg.steps:
            history.append({"step": step, **metrics})
            if on_log:
                on_log(step, history[-1])
        loop.checkpoint(step, cfg.steps, trainer.nets, trainer.parts(), {"history": history})
    figures, table, episodes = evaluate_all(trainer.nets, cfg, data.maze, pairs, seed)
    return trainer.nets, history, {**figures, **loop.metrics()}, table, episodes


def heldout(cfg, maze: Maze, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The held-out (starts, goals, distances) of the seed's maze, or one UserError line naming the settings."""
    try:
        return heldout_pairs(maze, cfg.eval.pairs, cfg.eval.min_distance, seed + EVAL_SEED)
    except ValueError as e:
        raise UserError(f"{e}: lower dsp.eval.min_distance or raise dsp.maze.cells") from None


def evaluate_all(nets: DSPNetworks, cfg, maze: Maze, pairs, seed: int):
    """Figures and a table row per arm on the held-out pairs (starts, goals, distances), and each arm's episodes."""
    starts, goals, dist = pairs
    nets.eval()
    figures, table, episodes = {"heldout_mean_distance": float(dist.mean())}, [], {}
    for label, arm, omega in arms(cfg):
        ep = evaluate_arm(nets, cfg, maze, starts, goals, arm, omega, seed)
        row = {"arm": label, "omega": omega if arm == "dsp" else float("nan"), "success": float(ep.success.mean()),
               "steps": float(ep.steps.mean()), "subgoal_progress": ep.subgoal_progress, "subgoal_free": ep.subgoal_free}
        table.append(row)
        # flat BC proposes no subgoal: its subgoal columns are NaN in the table and absent from the figures
        figures.update({f"{label}_{key}": value for key, value in row.items() if key not in ("arm", "omega") and not math.isnan(value)})
        episodes[label] = (ep, goals)
    nets.train()
    return figures, table, episodes
