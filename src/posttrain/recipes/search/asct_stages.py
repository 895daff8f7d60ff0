"""Stage `asct`: ASCT (specs §24, docs/asct.md) in the search environment, or one of its baselines (`asct.credit`).

Needs `task.name: search` (the corpus, the retriever, the cost per call: task.options.search) and no input: the actor
(`asct.actor`) starts from scratch on the task's training questions; the lm actor (the `model` section, a char-level
LM) is first warm-started on their reference transcripts (`asct.lm.sft_steps`). It writes `model/` (the lm actor: a
`from_pretrained` directory with its tokenizer; the mlp actor: its weights and its shape),
`history.json` (one row per round), `episodes.jsonl` (held-out greedy episodes: question, queries, passages, answer,
gold; the first `asct.example_episodes` also an MLflow table); metrics: the held-out greedy actor's utility (F1 minus
cost), F1, exact match, search calls, gold-passage recall (`heldout_*`) and the auxiliary tokens the credit spent
(`aux_tokens`). With `--resume` a stopped run continues from its last checkpoint (`asct.checkpoint_every`).
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.runtime import strict_json
from posttrain.stages import stages


def search_task(cfg: Config, stage: str):
    """The config's search task (tasks/search.py); any other task is the user's one-line error."""
    from posttrain.tasks import build_task

    if cfg.task.name != "search":
        raise UserError(f"stage {stage} runs in the search environment: set task.name=search (got {cfg.task.name!r})")
    return build_task(cfg.task)


def search_setup(cfg: Config, seed: int):
    """(the recoverable search environment, training questions, held-out questions) of the config's search task."""
    from posttrain.recipes.search.search_tree import SearchTreeEnv

    task = search_task(cfg, "asct")
    o = task.opts
    splits = task.splits(seed)
    env = SearchTreeEnv(task.corpus, task.retriever, o.top_k, o.max_calls, o.cost_per_call)
    train = [task.question(e) for e in splits["train"]]
    heldout = [task.question(e) for e in splits["heldout"][: cfg.asct.n_heldout]]
    return env, train, heldout


@stages.register("asct", sections=("asct",), inputs={}, resumable=True, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `asct`: PPO on the search environment with ASCT's counterfactual-tree credit (or a baseline's)."""
    from posttrain.runtime import seed_everything
    from posttrain.recipes.search.asct_trainer import train_asct
    from posttrain.trainers.loop import TrainLoop

    seed_everything(cfg.pipeline.seed)
    env, train, heldout = search_setup(cfg, cfg.pipeline.seed)
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "task", "model", "asct"), cfg.asct.checkpoint_every, resume, "asct")
    trainer, history, metrics, episodes = train_asct(cfg.asct, env, train, heldout, cfg.pipeline.seed, loop,
                                                     on_log=lambda step, m: tracker.log_metrics(m, step), model_cfg=cfg.model)
    trainer.actor.save(out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    rows = [{**env.transcript(e.final), "utility": e.utility} for e in episodes]
    (out_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if cfg.asct.example_episodes:
        tracker.log_table(rows[: cfg.asct.example_episodes], "example_episodes.json")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_metrics(metrics)
    return metrics
