"""Stages `maze_data` and `dsp`: Diffusion Subgoal Planning (specs §20) in a seeded maze (recipes/dsp/maze.py).

`maze_data` draws the layout of (dsp.maze.layout + pipeline.seed) and the reward-free trajectories of the noisy
exploration policy; it writes `dataset.npz` (squares [N, T + 1, 2], actions [N, T], walls), `render/maze.png` (the
layout and the first trajectory, also an MLflow artifact); metrics: trajectories, moves, free squares, the share of free squares
the data visits. `dsp` reads it (`--in data=outputs/maze_data`), trains the subgoal flow (goal dropout), the
low-level policy, flat goal-conditioned BC and the HIQL-style value together (recipes/dsp/trainer.py) and runs every arm on
the held-out start/goal pairs: flat BC, value-guided subgoals, DSP at each guidance weight of dsp.guidance_weights.
It writes `model/` (the networks' weights), `history.json`, `results.json` (one row per arm), `plans/` (per arm PNGs
of the maze with the path and the proposed subgoals, `dsp.gif` one guided episode move by move; all MLflow artifacts,
the rows also an MLflow table); metrics: `<arm>_success`, `<arm>_steps`, `<arm>_subgoal_progress`, ... With
`--resume` a stopped run continues from its last checkpoint (dsp.checkpoint_every). Settings: dsp.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.runtime import strict_json
from posttrain.stages import stages


@stages.register("maze_data", sections=("dsp",), inputs={}, resumable=False, gpu=False)
def run_data(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `maze_data`: a seeded maze and reward-free noisy-exploration trajectories in it (DSP's offline data)."""
    from posttrain.recipes.dsp.maze import render
    from posttrain.recipes.dsp.trainer import load_data

    data = load_data(cfg.dsp, cfg.pipeline.seed)
    np.savez_compressed(out_dir / "dataset.npz", cells=data.cells, actions=data.actions, walls=data.maze.walls)
    visited = np.zeros_like(data.maze.walls)
    visited[data.cells[..., 0].ravel(), data.cells[..., 1].ravel()] = True
    free = int((~data.maze.walls).sum())
    write_png(render(data.maze, data.cells[0]), out_dir / "render" / "maze.png")
    tracker.log_artifacts(out_dir / "render", "render")
    metrics = {"trajectories": float(len(data.cells)), "moves": float(data.actions.size), "free_squares": float(free),
               "visited_share": float(visited.sum() / free), "moved_share": float((data.cells[:, 1:] != data.cells[:, :-1]).any(-1).mean())}
    tracker.log_metrics(metrics)
    return metrics


def read_data(cfg: Config, directory: Path):
    from posttrain.recipes.dsp.trainer import load_data

    path = directory / "dataset.npz"
    if not path.is_file():
        raise UserError(f"missing {path}: run the maze_data stage first (or pass --in data=DIR)")
    arrays = np.load(path)
    data = load_data(cfg.dsp, cfg.pipeline.seed, arrays["cells"], arrays["actions"])
    if not np.array_equal(arrays["walls"], data.maze.walls):
        raise UserError(f"{path} was drawn in another maze than dsp.maze / pipeline.seed give: rerun maze_data")
    return data


@stages.register("dsp", sections=("dsp",), inputs={"data": "outputs/maze_data"}, requires={"data": ["dataset.npz"]}, resumable=True, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `dsp`: the subgoal flow with classifier-free guidance, the low-level policy and the baselines (DSP)."""
    from safetensors.torch import save_model

    from posttrain.recipes.dsp.trainer import train_dsp
    from posttrain.trainers.loop import TrainLoop

    data = read_data(cfg, inputs["data"])
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "dsp"), cfg.dsp.checkpoint_every, resume, "dsp")
    nets, history, metrics, table, episodes = train_dsp(cfg.dsp, data, cfg.pipeline.seed, loop, on_log=lambda step, m: tracker.log_metrics(m, step))
    (out_dir / "model").mkdir()
    save_model(nets, str(out_dir / "model" / "model.safetensors"))
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    (out_dir / "results.json").write_text(strict_json(table) + "\n")
    write_plans(data.maze, episodes, cfg.dsp.eval.renders, out_dir / "plans")
    tracker.log_table(table, "results_table.json")
    tracker.log_artifacts(out_dir / "plans", "plans")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics


def write_plans(maze, episodes: dict, renders: int, out: Path) -> None:
    """Per arm, `renders` PNGs (path, subgoals, goal); a GIF of the first episode of the highest-omega DSP arm."""
    from posttrain.recipes.dsp.maze import render

    out.mkdir(parents=True, exist_ok=True)
    for label, (ep, goals) in episodes.items():
        for i in range(min(renders, len(goals))):
            write_png(render(maze, ep.paths[i], np.array(ep.subgoals[i]) if ep.subgoals[i] else None, goals[i]), out / f"{label}_{i}.png")
    dsp = [label for label in episodes if label.startswith("dsp_")]
    if dsp and renders:
        ep, goals = episodes[dsp[-1]]
        path, subgoals = ep.paths[0], np.array(ep.subgoals[0]) if ep.subgoals[0] else None
        frames = [render(maze, path[: t + 1], subgoals, goals[0]) for t in range(len(path))]
        from posttrain.media import write_gif

        write_gif(np.stack(frames), out / "dsp.gif", scale=1)


def write_png(image: np.ndarray, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)
