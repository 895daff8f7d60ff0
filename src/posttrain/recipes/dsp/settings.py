"""DSP's settings section `dsp` (stages maze_data + dsp; recipes/dsp/params.yaml sets what a run changes)."""

from __future__ import annotations

from pydantic import Field, model_validator

from posttrain.config import Section
from posttrain.stages import sections


class MazeConfig(Section):  # dsp.maze: the maze family (recipes/dsp/maze.py)
    cells: int = Field(5, ge=2)  # a cells x cells maze on a (2 cells + 1)-square grid
    loops: float = Field(0.15, ge=0, le=1)  # share of the perfect maze's remaining inner walls knocked down (several routes)
    layout: int = Field(0, ge=0)  # the layout is make_maze(seed = layout + pipeline.seed): each seed its own maze


class MazeDataConfig(Section):  # dsp.data: stage maze_data, reward-free trajectories of the noisy exploration policy
    trajectories: int = Field(400, gt=0)
    length: int = Field(100, ge=2)  # moves per trajectory
    noise: float = Field(0.3, ge=0, le=1)  # probability of redrawing the direction at a move (else the previous one is kept)


class MazeEvalConfig(Section):  # dsp.eval: held-out start/goal pairs
    pairs: int = Field(100, gt=0)
    min_distance: int = Field(12, ge=1)  # shortest-path moves between a pair's start and goal, at least
    max_steps: int = Field(100, gt=0)  # moves before an episode counts as a failure
    renders: int = Field(4, ge=0)  # episodes per arm rendered (PNG of path + subgoals; GIF of the first DSP episode)


@sections.register("dsp", help="stages maze_data + dsp (recipes/dsp/dvc.yaml): Diffusion Subgoal Planning (specs §20; docs/dsp.md)")
class DSPConfig(Section):  # stages maze_data + dsp: Diffusion Subgoal Planning (specs §20) against flat BC and value guidance
    maze: MazeConfig = MazeConfig()  # recipes/dsp/maze.py: a depth-first-carved grid maze with some walls knocked down
    data: MazeDataConfig = MazeDataConfig()  # stage maze_data: reward-free trajectories of a persistent random walk (no goal, no reward)
    eval: MazeEvalConfig = MazeEvalConfig()  # held-out start/goal pairs (their own seed), success rate per arm
    subgoal_horizon: int = Field(8, ge=1)  # k: the subgoal is the state k moves ahead; replan every k moves
    p_uncond: float = Field(0.15, ge=0, le=1)  # goal dropout: share of flow-training goals replaced by the null goal
    goal_p_current: float = Field(0.2, ge=0, le=1)  # hindsight goals (flow and value): the state itself
    goal_p_trajectory: float = Field(0.5, ge=0, le=1)  # a uniform future state of the same trajectory; the rest: a random dataset state
    guidance_weights: tuple[float, ...] = Field((0.0, 1.0, 2.0, 3.0), min_length=1)  # omega of each evaluated DSP arm (the sweep)
    sampling_steps: int = Field(10, ge=1)  # Euler steps of the subgoal flow
    candidates: int = Field(16, ge=1)  # value-guided arm: unconditional proposals per plan, the best V(w, g) kept
    gamma: float = Field(0.95, gt=0, lt=1)  # the value's discount
    expectile: float = Field(0.9, gt=0, lt=1)  # IQL expectile of the value's TD loss
    target_update: float = Field(0.005, gt=0, le=1)  # Polyak rate of the value's target network
    hidden_size: int = Field(128, gt=0)  # every network: an MLP over Fourier features of the states
    layers: int = Field(3, gt=0)
    fourier_bands: int = Field(4, ge=0)
    steps: int = Field(3000, gt=0)  # updates (flow, low-level policy, flat BC and value together)
    batch_size: int = Field(256, gt=0)
    lr: float = Field(0.001, gt=0)  # Adam
    max_grad_norm: float = Field(1.0, gt=0)
    log_every: int = Field(50, gt=0)
    checkpoint_every: int = Field(500, ge=0)  # updates between checkpoints: `posttrain dsp --resume`; 0: none

    @model_validator(mode="after")
    def _goal_shares(self) -> "DSPConfig":
        if self.goal_p_current + self.goal_p_trajectory > 1:
            raise ValueError("needs goal_p_current + goal_p_trajectory <= 1 (the rest are random dataset states)")
        return self
