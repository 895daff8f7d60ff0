"""Shared plumbing for the claim experiments: args, config, a cached SFT start point, RL through the library's
`train_online_rl`, held-out eval, and MLflow logging (one run per arm, through posttrain.tracking.stage_run)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# this checkout's library first (an editable install may point at another checkout)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

from posttrain import resolve  # noqa: E402
from posttrain.eval.harness import evaluate  # noqa: E402
from posttrain.models import build_tiny, load_pretrained, prepare_model, save_pretrained, train_char_tokenizer  # noqa: E402
from posttrain.runtime import seed_everything  # noqa: E402
from posttrain.tasks import build_task  # noqa: E402
from posttrain.tracking import stage_run  # noqa: E402
from posttrain.trainers.online_rl import RLRun  # noqa: E402
from posttrain.trainers.rl import train_online_rl  # noqa: E402
from posttrain.trainers.sft import train_sft  # noqa: E402

from _claims import CURRENT, parent_run, run_seeds  # noqa: E402,F401  (run_seeds: each claim script's __main__)

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("POSTTRAIN_EXP_CACHE", "/tmp/posttrain_experiments"))
# --micro: a micro model / SFT / eval budget so the smoke test runs in seconds (numbers are meaningless)
MICRO = [
    "task.n_train=100", "task.n_heldout=20", "model.hidden_size=32", "model.intermediate_size=64", "model.layers=1",
    "sft.steps=10", "sft.batch_size=16", "sft.n_examples=0", "sft.warmup_steps=2",
    "rl.prompts_per_step=4", "rl.group_size=4", "rl.warmup_steps=0", "eval.n_prompts=20", "eval.batch_size=20",
]


def parse_args(doc: str, default_steps: int, extra=(), params: Path = REPO / "params.yaml") -> argparse.Namespace:
    """The flags every claim experiment takes, `extra` ones before them; `params`: the default of --params (a recipe's
    own params file, which `extends:` the core one)."""
    p = argparse.ArgumentParser(description=doc)
    for flag, kind, default, help_ in extra:
        p.add_argument(flag, type=kind, default=default, help=help_)
    p.add_argument("--steps", type=int, default=default_steps, help="RL steps per arm")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--params", type=Path, default=params)
    p.add_argument("--tracking-uri", default=None, help="MLflow URI (default: params.yaml tracking.uri)")
    p.add_argument("--experiment", default="claims", help="MLflow experiment name")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("--micro", action="store_true", help="micro model/SFT/eval budget (smoke tests)")
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument("--seeds", type=int, default=3, help="seeds --seed .. --seed + N - 1, each arm on each (claims harness)")
    p.add_argument("--set", action="append", default=[], help="extra section.key=value overrides")
    return p.parse_args()


def load_config(args, overrides: list[str]):
    extra = [f"rl.steps={args.steps}", "rl.checkpoint_every=0", f"pipeline.name={args.experiment}", f"pipeline.seed={args.seed}"]
    if args.tracking_uri:
        extra.append(f"tracking.uri={args.tracking_uri}")
        if args.tracking_uri.startswith("sqlite:///"):
            extra.append(f"tracking.artifact_root={Path(args.tracking_uri[len('sqlite:///'):]).resolve().parent / 'mlartifacts'}")
    if args.no_mlflow:
        extra.append("tracking.enabled=false")
    return resolve.load(args.params, (MICRO if args.micro else []) + overrides + extra + args.set)


def sft_start(cfg, seed: int, sft_data=None, variant: str = ""):
    """(task, train, heldout, checkpoint dir, SFT held-out metrics); the SFT model is trained once per config. With
    `model.path` the checkpoint there is fine-tuned (prompt format from `model.*`, as the sft stage does), else a tiny
    model with a character tokenizer; `sft_data(train, seed)` replaces the SFT examples (`variant` names it in the cache)."""
    task = build_task(cfg.task)
    splits = task.splits(seed)
    train, held = splits["train"], splits["heldout"]
    path = CACHE / f"sft_{cfg.section_hash('task', 'model', 'sft')}{variant}_s{seed}"
    if not (path / "done").exists():
        seed_everything(seed)
        if cfg.model.path:
            model, tok = load_pretrained(cfg.model.path, cfg.model.dtype)
            model = prepare_model(model, tok, cfg.model, torch.device("cpu"))
        else:
            tok = train_char_tokenizer([task.alphabet()])
            model = build_tiny(cfg.model, tok)
        examples = sft_data(train, seed) if sft_data else train
        train_sft(model, tok, list(examples[: cfg.sft.n_examples or None]), cfg.sft, seed, on_log=lambda s, m: None)
        save_pretrained(model, tok, path)
        (path / "done").write_text("ok")
    model, tok = load_pretrained(path)
    model = prepare_model(model, tok, cfg.model, torch.device("cpu"), train=False)
    metrics, _ = evaluate(model, tok, task, held, cfg.eval, seed)
    return task, train, held, path, metrics


def run_arm(cfg, rl_cfg, task, train, held, path, seed: int, on_step=None, teachers=None, evaluate_fn=None):
    """RL from the SFT checkpoint with the library's `train_online_rl` (no checkpoints); returns (history, held-out
    metrics after, seconds). `on_step(step, result)` sees each update's result; `teachers` are frozen models by role
    for distillation objectives; `evaluate_fn(model, tok)` replaces the held-out eval."""
    model, tok = load_pretrained(path)
    seed_everything(seed)
    run = RLRun(model, tok, task, train, rl_cfg.model_copy(update={"checkpoint_every": 0}), seed, CACHE / "unused_ckpt", "exp",
                models=teachers or {})
    start = time.time()
    history, _ = train_online_rl(run, resume=False, on_log=lambda step, metrics: None, on_step=on_step)
    seconds = time.time() - start
    after = evaluate_fn(model, tok) if evaluate_fn else evaluate(model, tok, task, held, cfg.eval, seed)[0]
    return history, after, seconds


def window_mean(history, key: str, first: bool, k: int) -> float:
    rows = history[:k] if first else history[-k:]
    return sum(r.get(key, 0.0) for r in rows) / max(len(rows), 1)


def curve(history, key: str, n_points: int = 10) -> list[float]:
    width = max(1, len(history) // n_points)
    return [round(window_mean(history[i : i + width], key, True, width), 4) for i in range(0, len(history), width)]


def print_table(title: str, rows: list[dict]) -> str:
    cols = list(rows[0])
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in cols]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(fmt(r[c]).ljust(w) for c, w in zip(cols, widths)) for r in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def log_arm(cfg, stage: str, history, final: dict, table_rows: list[dict], table_text: str) -> str | None:
    """One MLflow run: per-step metrics, final metrics, the results table (JSON table + text). Under the claims
    harness it is a child of the claim's parent run, one per arm x seed."""
    parent, tags = parent_run(cfg), {}
    if parent is not None:
        stage, tags = f"{stage}/seed{CURRENT['seed']}", {"mlflow.parentRunId": parent, "claim": CURRENT["claim"], "seed": str(CURRENT["seed"])}
    with stage_run(cfg, stage, launcher="experiments", extra_tags=tags) as tracker:
        for step, metrics in enumerate(history, 1):
            tracker.log_metrics({k.replace("/", "_"): v for k, v in metrics.items()}, step=step)
        tracker.log_metrics({k: float(v) for k, v in final.items() if isinstance(v, (int, float))})
        tracker.log_table(table_rows, "results_table.json")
        tracker.log_text(table_text, "results_table.txt")
        return tracker.run_id


def write_json(args, results: dict) -> None:
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
