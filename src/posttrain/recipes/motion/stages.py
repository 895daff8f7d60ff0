"""Stages `motion_data`, `motion_sft`, `motion_grpo`: MotionInsight (specs §30), a motion-fidelity evaluator trained by
SFT and then GRPO with the spec's reward (recipes/motion/trainer.py; docs/motion.md).

`motion_data` draws the annotated synthetic clips (recipes/motion/videos.py) from the pipeline seed and writes
`videos.npz` (train and held-out frames) and `annotations.json` (scores, causes), `gifs/` (the first `n_gifs`
held-out clips, logged to MLflow) and a table of annotations; metrics: the clips' cause counts and mean scores.
`motion_sft` (`--in data=outputs/motion_data`) trains the evaluator on the annotated judgements and
`motion_grpo` (`--in data=... --in sft=outputs/motion_sft`) continues it with GRPO; each writes `model/`
(evaluator.json, model.safetensors, the tokenizer), `history.json`, `predictions.json` (the held-out judgements)
and the held-out metrics (rank correlation per dimension `heldout_rho_*`, `heldout_cause_f1`, `heldout_format_rate`,
`heldout_reward`); motion_grpo
also writes `gifs/` with each clip's annotation and judgement in the MLflow table. Both `--resume`. Settings: motion.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from posttrain.config import Config
from posttrain.runtime import strict_json
from posttrain.stages import stages
from posttrain.media import write_gif

DATA = "outputs/motion_data"


def _videos(path: Path) -> dict[str, list]:
    """{"train": [Video], "heldout": [Video]} from a motion_data output."""
    from posttrain.recipes.motion.videos import Video

    arrays, notes = np.load(path / "videos.npz"), json.loads((path / "annotations.json").read_text())
    return {split: [Video(f, n["scores"], tuple(n["causes"])) for f, n in zip(arrays[split], notes[split])] for split in ("train", "heldout")}


def _sets(cfg: Config, data_dir: Path):
    from posttrain.recipes.motion.trainer import tokenizer, video_set

    m, tok = cfg.motion, tokenizer()
    return {split: video_set(v, m.representation, m.track_slots, tok, m.model.pool) for split, v in _videos(data_dir).items()}


def _gifs(videos, out: Path, tracker, n: int) -> None:
    for i, v in enumerate(videos[:n]):
        write_gif(v.frames, out / "gifs" / f"heldout_{i:02d}.gif")
    if n and videos:
        tracker.log_artifacts(out / "gifs", "gifs")


@stages.register("motion_data", sections=("motion",), inputs={}, gpu=False)
def run_data(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `motion_data`: MotionInsight's annotated synthetic clips (train and held-out), with GIFs of the first held-out ones."""
    from posttrain.recipes.motion.videos import CAUSES, DIMENSIONS, make_videos
    from posttrain.recipes.motion.reward import render

    m = cfg.motion
    splits = {"train": make_videos(m.video, m.n_train, [cfg.pipeline.seed, 0]), "heldout": make_videos(m.video, m.n_heldout, [cfg.pipeline.seed, 1])}
    np.savez_compressed(out_dir / "videos.npz", **{s: np.stack([v.frames for v in vs]) for s, vs in splits.items()})
    notes = {s: [{"scores": v.scores, "causes": list(v.causes)} for v in vs] for s, vs in splits.items()}
    (out_dir / "annotations.json").write_text(strict_json(notes) + "\n")
    _gifs(splits["heldout"], out_dir, tracker, m.n_gifs)
    tracker.log_table([{"video": i, "annotation": render(v.scores, v.causes)} for i, v in enumerate(splits["heldout"])], "annotations.json")
    every = splits["train"] + splits["heldout"]
    metrics = {f"share_{c}": float(np.mean([c in v.causes for v in every])) for c in CAUSES}
    metrics |= {f"mean_{d}": float(np.mean([v.scores[d] for v in every])) for d in DIMENSIONS}
    metrics["share_clean"] = float(np.mean([not v.causes for v in every]))
    tracker.log_metrics(metrics)
    return metrics


def _finish(model, sets, cfg: Config, history: list, out_dir: Path, tracker) -> dict[str, float]:
    from posttrain.recipes.motion.trainer import evaluate

    measured, table = evaluate(model, sets["heldout"], cfg.motion)
    metrics = {f"heldout_{k}": v for k, v in measured.items()}  # apart from the per-step training terms of the same names
    model.save(out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    (out_dir / "predictions.json").write_text(strict_json(table) + "\n")
    tracker.log_table(table, "predictions.json")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics


@stages.register("motion_sft", sections=("motion",), inputs={"data": DATA}, requires={"data": ["videos.npz", "annotations.json"]}, resumable=True, gpu=False)
def run_sft(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `motion_sft`: the MotionInsight evaluator (video encoder -> soft tokens -> tiny decoder) trained on the annotated judgements."""
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.motion.trainer import new_evaluator, train_sft

    sets = _sets(cfg, inputs["data"])
    model = new_evaluator(cfg.motion, cfg.motion.representation, cfg.pipeline.seed)
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "motion"), cfg.motion.sft.checkpoint_every, resume, "motion.sft")
    history = train_sft(cfg.motion, model, sets["train"], cfg.pipeline.seed, loop, on_log=lambda step, m: tracker.log_metrics(m, step))
    return {**_finish(model, sets, cfg, history, out_dir, tracker), "loss": history[-1]["loss"], **loop.metrics()}


@stages.register("motion_grpo", sections=("motion",), inputs={"data": DATA, "sft": "outputs/motion_sft"},
                 requires={"data": ["videos.npz", "annotations.json"], "sft": ["model/evaluator.json"]}, resumable=True, gpu=False)
def run_grpo(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `motion_grpo`: GRPO on MotionInsight's reward (score accuracy + w_c cause F1 + w_f format) from the SFT evaluator."""
    from posttrain.errors import UserError
    from posttrain.recipes.motion.evaluator import MotionEvaluator
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.motion.trainer import train_grpo

    model = MotionEvaluator.load(inputs["sft"] / "model")
    if model.spec["representation"] != cfg.motion.representation:
        raise UserError(f"the SFT evaluator in {inputs['sft']} reads {model.spec['representation']!r}, but motion.representation is "
                        f"{cfg.motion.representation!r}")
    sets = _sets(cfg, inputs["data"])
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "motion"), cfg.motion.rl.checkpoint_every, resume, "motion.rl")
    history = train_grpo(cfg.motion, model, sets["train"], cfg.pipeline.seed, loop, on_log=lambda step, m: tracker.log_metrics(m, step))
    metrics = _finish(model, sets, cfg, history, out_dir, tracker)
    _gifs(_videos(inputs["data"])["heldout"], out_dir, tracker, cfg.motion.n_gifs)
    return {**metrics, "train_reward_last": history[-1]["reward"], **loop.metrics()}
